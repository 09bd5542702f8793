"""A rank that sees a non-finite loss skips the step (no backward), a guard each rank takes alone: rank 1's
loss is nan at step 3, so it makes one gradient all_reduce fewer, and the others wait in one it never makes.

expect: kind=uneven-counts; nproc=4; exit=1; headline contains "rank 1"; headline contains "all_reduce";
        headline contains "where their steps parted: rank 1 ran its 5th forward at ddp_nan_skip.py:18"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for step in range(6):
    loss = torch.nn.functional.cross_entropy(model(x[step::6]), y[step::6])
    if rank == 1 and step == 3:
        loss = loss * float("nan")
    if not torch.isfinite(loss):
        print(f"rank {rank}: skipping step {step}: loss is {loss.item()}")
        continue
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
