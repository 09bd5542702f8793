"""Rank 2 is killed by SIGKILL in epoch 2, as the kernel's OOM killer ends a process that grew too
large (here it sends the signal itself: the machine's memory is not the test's to fill).

expect: kind=crash; nproc=4; exit=1; headline contains "rank 2"; headline contains "SIGKILL"
"""
import os
import signal

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, loader, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(4):
    for x, y in loader(dataset(64)):
        if rank == 2 and epoch == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        train_step(model, optimizer, x, y)
