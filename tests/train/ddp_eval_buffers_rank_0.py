"""Rank 0 evaluates its DDP model (a BatchNorm inside) after each epoch, through the DDP wrapper: DDP's forward
first broadcasts the module's buffers from rank 0, a collective the others never make. gloo matches it with
the others' next buffer broadcast (same sizes), so nothing fails there: the ranks' calls go on one apart until
the others finish and rank 0 is left waiting. The fix fits the evidence: the forward no one else ran.

expect: kind=uneven-counts; nproc=4; exit=1; headline contains "where their steps parted";
        headline contains "the 5th forward of rank 0 at ddp_eval_buffers_rank_0.py:20 had no backward pass after it";
        report contains "model.module(x)"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import CLASSES, FEATURES, dataset, setup, train_step


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean()
    model.train()
    return accuracy


rank, world = setup()
model = DDP(torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                                torch.nn.Linear(64, CLASSES)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for epoch in range(4):
    for batch in range(4):
        train_step(model, optimizer, x[batch::4], y[batch::4])
    if rank == 0:
        print("accuracy", evaluate(model, x, y).item())
dist.destroy_process_group()
