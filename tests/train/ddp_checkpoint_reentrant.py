"""Activation checkpointing of the first layer, the reentrant way (torch.utils.checkpoint's use_reentrant=True),
under DDP with find_unused_parameters=True: the layer's backward runs in a backward of its own, and DDP is told
its parameters are ready twice. DDP's error names the parameter at the end of a long message; the fix that
fits names it too (use_reentrant=False, with which this program trains).

expect: kind=crash; nproc=2; exit=1; headline contains "Expected to mark a variable ready only once";
        headline contains "inner.0.bias"; headline contains "at ddp_checkpoint_reentrant.py:34";
        report contains "DDP got the gradient of inner.0.bias twice"; report contains "use_reentrant=False"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from _common import classifier, dataset, setup


class Checkpointed(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner[2](torch.relu(checkpoint(self.inner[0], x, use_reentrant=True)))


rank, world = setup()
model = DDP(Checkpointed(classifier()), find_unused_parameters=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for step in range(3):
    loss = torch.nn.functional.cross_entropy(model(x.requires_grad_()), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
