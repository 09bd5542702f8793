"""Each rank trains on its own slice of 41 samples (no DistributedSampler, no drop_last): rank 0
gets 11, the others 10, so with batches of 5 rank 0 makes a third step, whose gradient all_reduce
(DDP's, from C++) no other rank joins: they finished after two steps and left.

expect: kind=uneven-counts; nproc=4; exit=1; headline contains "rank 0"; headline contains "all_reduce";
        report contains "ddp_uneven_inputs.py:21"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(41)[rank::world]
for start in range(0, len(x), 5):
    loss = torch.nn.functional.cross_entropy(model(x[start:start + 5]), y[start:start + 5])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
