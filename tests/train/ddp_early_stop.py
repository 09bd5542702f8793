"""Early stopping decided on each rank's own validation loss: rank 2's stops improving first, it
ends its process (sys.exit(0), "training done"), while the others go on into the next epoch's
gradient all_reduce.

expect: kind=missing-rank; nproc=4; exit=1; headline contains "rank 2"; headline contains "status 0";
        headline contains "ddp_early_stop.py:33"
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, loader, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
val_x, val_y = dataset(16, seed=10 + rank)[:]
best, patience = float("inf"), 0
for epoch in range(6):
    for x, y in loader(dataset(64)):
        train_step(model, optimizer, x, y)
    with torch.no_grad():
        val_loss = torch.nn.functional.cross_entropy(model(val_x), val_y).item()
    val_loss += 10.0 if rank == 2 and epoch >= 1 else 0.0  # its own shard stops improving
    if val_loss < best:
        best, patience = val_loss, 0
    else:
        patience += 1
    if patience >= 1:
        print(f"rank {rank}: early stop at epoch {epoch}")
        sys.exit(0)
dist.destroy_process_group()
