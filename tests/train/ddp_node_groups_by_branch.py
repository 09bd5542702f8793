"""Hierarchical averaging: each pair of ranks (a node) averages its loss in a group of its own,
made in a branch on the rank, so ranks 0, 1 make [0, 1] and ranks 2, 3 make [2, 3]. Torch names a
group by how many the rank made before it: both are the 1st group, and their members' connections
cross.

(The barrier and the sleep after it only make the crossing, a race in torch's rendezvous of the groups'
members, happen on every run: the groups' members write their addresses under one name.)

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "different groups as their 1st";
        report contains "ddp_node_groups_by_branch.py:27"; report contains "ddp_node_groups_by_branch.py:29"
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
dist.barrier()  # every rank has its data
time.sleep(2.0 if rank % 2 else 0.0)  # ranks 1 and 3 then read their shard
if rank < 2:
    node = dist.new_group([0, 1])
else:
    node = dist.new_group([2, 3])
for epoch in range(3):
    loss = train_step(model, optimizer, x, y).detach()
    dist.all_reduce(loss, group=node)
dist.destroy_process_group()
