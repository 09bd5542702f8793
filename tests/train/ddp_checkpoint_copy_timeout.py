"""Rank 0 copies its checkpoint to slow storage in the training loop (15 s) while the group's timeout is
4 s: the others time out in DDP's gradient all_reduce. Rank 0 is outside any call (its stack says where).

expect: kind=missing-rank; nproc=4; exit=1; headline contains "ranks 1-3 timed out after 4 s";
        headline contains "(the timeout init_process_group was given at ddp_checkpoint_copy_timeout.py:18)";
        headline contains "DDP's gradient all_reduce"; headline contains "for rank 0";
        report contains "ddp_checkpoint_copy_timeout.py:25"; report contains "ddp_checkpoint_copy_timeout.py:27"
"""
import datetime
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, train_step

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for epoch in range(3):
    train_step(model, optimizer, x, y)
    if rank == 0 and epoch == 1:
        time.sleep(15)  # copies the checkpoint to slow storage
dist.destroy_process_group()
