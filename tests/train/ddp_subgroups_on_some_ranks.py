"""Ranks 0 and 1 shard an embedding table between them, so only they call new_subgroups (which
makes a group for every pair: [0, 1] and [2, 3]); then every rank makes the loggers' group [0, 2].
Ranks 2 and 3 skipped both of new_subgroups' groups: their 1st is the loggers'.

(The barrier and the sleep after it only make the crossing, a race in torch's rendezvous of the groups'
members, happen on every run: the groups' members write their addresses under one name.)

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "ranks 2, 3 have not made new_group([0, 1])";
        headline contains "1st-2nd groups"; report contains "ddp_subgroups_on_some_ranks.py:28";
        report contains "ddp_subgroups_on_some_ranks.py:29"
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
table = torch.zeros(8)
dist.barrier()  # every rank has its data
time.sleep(2.0 if rank == 1 else 0.0)  # rank 1 then reads its shard
if rank < 2:
    shard_group, _ = dist.new_subgroups(group_size=2)
loggers = dist.new_group([0, 2])
for epoch in range(3):
    loss = train_step(model, optimizer, x, y).detach()
    if rank < 2:
        dist.all_reduce(table, group=shard_group)
    if rank in (0, 2):
        dist.all_reduce(loss, group=loggers)
dist.destroy_process_group()
