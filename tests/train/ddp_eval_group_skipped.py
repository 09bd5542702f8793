"""Ranks 0 and 1 evaluate, so only they make the evaluators' group (inside `if rank in EVALUATORS`);
then every rank makes the loggers' group [0, 2]. Ranks 2 and 3 skipped the 1st group: their 1st
is the loggers', which torch pairs with ranks 0 and 1's evaluators.

(The barrier and the sleep after it only make the crossing, a race in torch's rendezvous of the groups'
members, happen on every run: the groups' members write their addresses under one name.)

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "ranks 2, 3 have not made new_group([0, 1])";
        report contains "ddp_eval_group_skipped.py:29"; report contains "ddp_eval_group_skipped.py:30"
"""
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup, train_step

EVALUATORS, LOGGERS = [0, 1], [0, 2]

rank, world = setup()
model = DDP(classifier())
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
dist.barrier()  # every rank has its data
time.sleep(2.0 if rank == 1 else 0.0)  # rank 1 then reads its shard
evaluators = None
if rank in EVALUATORS:
    evaluators = dist.new_group(EVALUATORS)
loggers = dist.new_group(LOGGERS)
for epoch in range(3):
    loss = train_step(model, optimizer, x, y).detach()
    if rank in LOGGERS:
        dist.all_reduce(loss, group=loggers)
    if evaluators is not None:
        accuracy = (model(x).argmax(1) == y).float().mean()
        dist.all_reduce(accuracy, group=evaluators)
dist.destroy_process_group()
