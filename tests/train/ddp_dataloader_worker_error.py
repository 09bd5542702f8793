"""A Dataset that fails on one sample in a DataLoader worker process: the DataLoader raises it again
in rank 1 as "Caught ValueError in DataLoader worker process 0", with the worker's own exception
and traceback beneath that first line, which is what says why.

expect: kind=crash; nproc=2; exit=1; headline contains "rank 1";
        headline contains "Caught ValueError in DataLoader worker process 0";
        headline contains "from there: ValueError: sample 37: its label file is missing at ddp_dataloader_worker_error.py:27";
        headline contains "at ddp_dataloader_worker_error.py:37"
"""
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from _common import classifier, dataset, setup, train_step


class Samples(torch.utils.data.Dataset):
    def __init__(self):
        self.x, self.y = dataset(64)[:]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i == 37:
            raise ValueError(f"sample {i}: its label file is missing")
        return self.x[i], self.y[i]


rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = Samples()
loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False), num_workers=1)
for epoch in range(2):
    for x, y in loader:
        train_step(model, optimizer, x, y)
