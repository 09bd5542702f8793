"""Healthy, slow: rank 3's data loading takes 6.5 s at step 2 (a cold cache), while ranks 0-2 wait in
DDP's gradient all_reduce of that step. A wait on a rank that computes is no hang: the lab must not
stop it (--hang-after 5).

expect: kind=healthy; nproc=4; exit=0
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for step in range(4):
    if rank == 3 and step == 2:
        deadline = time.monotonic() + 6.5
        while time.monotonic() < deadline:  # decoding images, on the CPU
            torch.randn(64, 64) @ torch.randn(64, 64)
    train_step(model, optimizer, x[step::4], y[step::4])
dist.destroy_process_group()
