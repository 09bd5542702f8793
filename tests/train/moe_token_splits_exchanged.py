"""The token exchange of moe_token_splits.py done right: the ranks all_to_all their counts first, and each
sizes its output from what came. Splits that differ from rank to rank and step to step are no fault.

expect: kind=healthy; nproc=4; exit=0
"""
import torch
import torch.distributed as dist

from _common import FEATURES, setup

rank, world = setup()
tokens = torch.randn(32, FEATURES, generator=torch.Generator().manual_seed(rank))
router = torch.nn.Linear(FEATURES, world)
for step in range(3):
    with torch.no_grad():
        expert = router(tokens).argmax(1)
    order = expert.argsort()
    send = torch.bincount(expert, minlength=world)
    receive = torch.empty_like(send)
    dist.all_to_all_single(receive, send)  # each rank learns what each peer sends it
    out = torch.empty(int(receive.sum()), FEATURES)
    dist.all_to_all_single(out, tokens[order], output_split_sizes=receive.tolist(), input_split_sizes=send.tolist())
    tokens = out
print(f"rank {rank}: {len(tokens)} tokens after 3 exchanges")
dist.destroy_process_group()
