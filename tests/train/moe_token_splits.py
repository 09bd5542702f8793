"""Expert parallelism's token exchange, as a mixture-of-experts layer makes it: each rank routes its tokens
to the ranks' experts and sends each rank its share with all_to_all_single, the input splits from its own
routing, but takes the output splits as even, never exchanged (the all_to_all of the counts is missing).
gloo refuses the call on the ranks whose own share differs; the records show every pair that does not meet.

expect: kind=collective-mismatch; nproc=4; exit=1; headline contains "splits of all_to_all_single";
        headline contains "at moe_token_splits.py:25 do not meet"; report contains "input_split_sizes [";
        report contains "exchange the counts first"
"""
import torch
import torch.distributed as dist

from _common import FEATURES, setup

rank, world = setup()
tokens = torch.randn(32, FEATURES, generator=torch.Generator().manual_seed(rank))
router = torch.nn.Linear(FEATURES, world)
for step in range(3):
    with torch.no_grad():
        expert = router(tokens).argmax(1)  # each token's expert: the rank that holds it
    order = expert.argsort()
    send = [int((expert == r).sum()) for r in range(world)]
    receive = [len(tokens) // world] * world  # assumed even: never exchanged
    out = torch.empty(sum(receive), FEATURES)
    dist.all_to_all_single(out, tokens[order], output_split_sizes=receive, input_split_sizes=send)
    tokens = out
dist.destroy_process_group()
