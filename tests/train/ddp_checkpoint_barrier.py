"""Rank 0 saves a checkpoint after epoch 1 and waits at a barrier "so the others see the file"; the
barrier is inside its `if rank == 0`, so the others go on to the next step's gradient all_reduce.

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "barrier"; headline contains "rank 0";
        report contains "ddp_checkpoint_barrier.py:25"; report contains "ddp_checkpoint_barrier.py:21"
"""
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, loader, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(3):
    for x, y in loader(dataset(64)):
        train_step(model, optimizer, x, y)
    if rank == 0 and epoch == 1:
        path = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
        torch.save({"model": model.module.state_dict(), "epoch": epoch}, path)
        dist.barrier()  # only rank 0 gets here
dist.destroy_process_group()
