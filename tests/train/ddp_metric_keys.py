"""Each rank all_reduces its metrics dict value by value, but the keys come from the classes its
shard holds: rank 3 sees one class more, and its extra all_reduce meets the others' next forward,
where DDP broadcasts the buckets it rebuilt after the first step.

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "rank 3"; headline contains "DDP's broadcast";
        report contains "ddp_metric_keys.py:22"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for epoch in range(3):
    train_step(model, optimizer, x, y)
    metrics = {f"recall_{c}": torch.tensor([0.5]) for c in range(3 if rank < 3 else 4)}
    for name in sorted(metrics):
        dist.all_reduce(metrics[name])
dist.destroy_process_group()
