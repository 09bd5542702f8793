"""Gradient accumulation by a token budget: each rank accumulates (under no_sync) until its own batches
add up to 64 tokens, then steps; their lengths differ across ranks, so the ranks sync on schedules apart.

expect: kind=uneven-counts; nproc=2; exit=1; headline contains "all_reduce"; headline contains "finished after";
        headline contains "rank 0 ran its 4th forward under no_sync() at ddp_token_budget_accumulation.py:25"
"""
import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(96)[:]
lengths = [12 + 7 * rank] * 8  # the tokens of each of its 8 batches
tokens = 0
for batch, length in enumerate(lengths):
    tokens += length
    sync = tokens >= 64
    with contextlib.nullcontext() if sync else model.no_sync():
        loss = torch.nn.functional.cross_entropy(model(x[batch::8]), y[batch::8])
        loss.backward()
    if sync:
        optimizer.step()
        optimizer.zero_grad()
        tokens = 0
dist.destroy_process_group()
