"""DDP over a DistributedSampler's shards, rank 0 saving a checkpoint each epoch (no collective in
it), an evaluation on every rank whose metric is all_reduced, a barrier at the end.

expect: kind=healthy; nproc=4; exit=0
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
train, val = loader(dataset(256)), loader(dataset(64, seed=1), shuffle=False)
for epoch in range(3):
    train.sampler.set_epoch(epoch)
    for x, y in train:
        train_step(model, optimizer, x, y)
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(tempfile.gettempdir(), f"ckpt-{os.getpid()}.pt"))
    correct = torch.zeros(2)
    with torch.no_grad():
        for x, y in val:
            correct += torch.tensor([(model(x).argmax(1) == y).sum().item(), len(y)])
    dist.all_reduce(correct)
    assert correct[1] == 64, correct
os.remove(os.path.join(tempfile.gettempdir(), f"ckpt-{os.getpid()}.pt")) if rank == 0 else None
dist.barrier()
dist.destroy_process_group()
