"""Rank 0 evaluates after each epoch and all_reduces its accuracy, a collective the others never make:
they are in the next step's gradient all_reduce, which DDP's reducer issues from C++ in backward().
gloo aborts rank 0 on the sizes (SIGABRT); its relay tells the call it was in (one float).

expect: kind=collective-mismatch; nproc=4; exit=1; headline contains "rank 0"; headline contains "all_reduce of 1 float";
        headline contains "DDP's gradient all_reduce"; report contains "ddp_eval_on_rank_0.py:19 in evaluate";
        report contains "called at ddp_eval_on_rank_0.py:29"
"""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step


def evaluate(model, x, y):
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().reshape(1)
    dist.all_reduce(accuracy)  # the others are not here
    return accuracy


rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for epoch in range(4):
    for batch in range(4):
        train_step(model, optimizer, x[batch::4], y[batch::4])
    if rank == 0:
        print("accuracy", evaluate(model, x, y).item() / world)
dist.destroy_process_group()
