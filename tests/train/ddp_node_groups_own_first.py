"""Each rank makes its own node's group first and the other node's after (a loop that puts the
rank's own group first): ranks 0, 1 make [0, 1] then [2, 3], ranks 2, 3 the other way round. The
same groups, in different orders: torch pairs each rank's n-th group, and they cross. The ranks
whose 1st group crossed wait in it, so the lab sees them not (yet) make their 2nd: it says which
group those have not made that the others made first.

(The barrier and the sleep after it only make the crossing, a race in torch's rendezvous of the groups'
members, happen on every run: the groups' members write their addresses under one name.)

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "new_group([0, 1]) at ddp_node_groups_own_first.py:32";
        headline contains "new_group([2, 3]) at ddp_node_groups_own_first.py:32";
        report contains "ddp_node_groups_own_first.py:32"
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step

NODES = [[0, 1], [2, 3]]

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
dist.barrier()  # every rank has its data
time.sleep(2.0 if rank % 2 else 0.0)  # ranks 1 and 3 then read their shard
groups = {}
for ranks in sorted(NODES, key=lambda ranks: rank not in ranks):  # the rank's own node first
    groups[tuple(ranks)] = dist.new_group(ranks)
node = next(group for ranks, group in groups.items() if rank in ranks)
for epoch in range(3):
    loss = train_step(model, optimizer, x, y).detach()
    dist.all_reduce(loss, group=node)
dist.destroy_process_group()
