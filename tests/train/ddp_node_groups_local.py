"""Hierarchical averaging done right for groups that only their members make: each node's pair makes
its own group with use_local_synchronization=True, which torch names by its ranks, so ranks 0, 1
and ranks 2, 3 need not make each other's. Healthy: no alarm.

expect: kind=healthy; nproc=4; exit=0; report contains "4 of 4 ranks succeeded"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
node = dist.new_group([0, 1] if rank < 2 else [2, 3], use_local_synchronization=True)
for epoch in range(3):
    loss = train_step(model, optimizer, x, y).detach()
    dist.all_reduce(loss, group=node)
    assert torch.isfinite(loss)
dist.destroy_process_group()
