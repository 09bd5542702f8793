"""A training function that returns early when the rank's own validation loss stops improving, and
tears the process group down on its way out (destroy_process_group, then return): rank 2's does at
epoch 1, while the others go on into the next epoch's gradient all_reduce.

expect: kind=uneven-counts; nproc=4; exit=1; headline contains "rank 2 finished after 4";
        headline contains "rank 2 destroyed the process group at ddp_early_return_destroy.py:32 and returned"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, loader, setup, train_step


def train(rank):
    model = DDP(classifier())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    val_x, val_y = dataset(16, seed=10 + rank)[:]
    best = float("inf")
    for epoch in range(6):
        for x, y in loader(dataset(64)):
            train_step(model, optimizer, x, y)
        with torch.no_grad():
            val_loss = torch.nn.functional.cross_entropy(model(val_x), val_y).item()
        val_loss += 10.0 if rank == 2 and epoch >= 1 else 0.0  # its own shard stops improving
        if val_loss >= best:
            print(f"rank {rank}: no better at epoch {epoch}: done")
            break
        best = val_loss
    else:
        return model
    dist.destroy_process_group()
    return None


rank, world = setup()
train(rank)
if dist.is_initialized():
    dist.destroy_process_group()
