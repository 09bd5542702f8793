"""Uneven inputs done right: each rank's own slice of 41 samples (rank 0 has one batch more), the
training loop under DDP's join() context manager, which shadows the gradient all_reduces of the
ranks that ran out of data.

expect: kind=healthy; nproc=4; exit=0
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(41)[rank::world]
with model.join():
    for start in range(0, len(x), 5):
        loss = torch.nn.functional.cross_entropy(model(x[start:start + 5]), y[start:start + 5])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
