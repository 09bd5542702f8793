"""Each rank reads the data set from its own copy of the files, and rank 1's copy is missing the
last 24 samples: DistributedSampler splits what each rank sees, so rank 1 has fewer batches per
epoch than the others and ends its epoch (and the job) early.

expect: kind=uneven-counts; nproc=2; exit=1; headline contains "rank 0"; headline contains "rank 1 finished after"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, loader, setup, train_step

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = dataset(96)
if rank == 1:
    data = torch.utils.data.Subset(data, range(72))  # its copy lost the last file
for x, y in loader(data):
    train_step(model, optimizer, x, y)
dist.destroy_process_group()
