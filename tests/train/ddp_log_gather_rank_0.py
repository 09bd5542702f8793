"""Rank 0 gathers every rank's loss for its log with dist.gather, inside `if rank == 0:`; the
others never call it and go on to the next step's gradient all_reduce.

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "gather"; headline contains "rank 0";
        report contains "ddp_log_gather_rank_0.py:22"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for step in range(6):
    loss = train_step(model, optimizer, x[step::6], y[step::6]).detach().reshape(1)
    if step % 3 == 2:
        if rank == 0:
            losses = [torch.zeros(1) for _ in range(world)]
            dist.gather(loss, losses, dst=0)  # the others never call it
            print("losses", [round(t.item(), 3) for t in losses])
dist.destroy_process_group()
