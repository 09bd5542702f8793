"""A model with an auxiliary head that the loss does not use: DDP waits for its gradients, which
never come, and says so at the next forward on every rank (find_unused_parameters is off).

expect: kind=crash; nproc=2; exit=1; headline contains "Expected to have finished reduction in the prior iteration"
"""
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step


class WithAuxHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.aux = classifier(), torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.body(x)  # self.aux is never used


rank, world = setup()
model = DDP(WithAuxHead())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for step in range(3):
    train_step(model, optimizer, x, y)
