"""The script passes world_size=4, written for the 4-GPU machine it came from, to a job of 2 ranks:
the two wait in init_process_group for ranks that no launcher started.

expect: kind=rendezvous; nproc=2; exit=4; headline contains "world_size=4"; headline contains "the job has 2 ranks"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier

dist.init_process_group("gloo", world_size=4)  # the launcher started 2
model = DDP(classifier())
loss = model(torch.randn(8, 16)).sum()
loss.backward()
