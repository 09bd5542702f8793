"""Ranks 0 and 1 make a group of their own with a short timeout (4 s, for a fast heartbeat of their stage),
and all_reduce their stage's loss in it each step; rank 1 also writes the stage's samples to disk at step 2
(10 s, outside any call). Rank 0 times out waiting in the pair's all_reduce, after the group's own timeout:
the line that set it is new_group's, and rank 1's own line is where it was.

expect: kind=missing-rank; nproc=4; exit=1; headline contains "rank 0 timed out after 4 s";
        headline contains "(the timeout new_group was given at stage_group_timeout.py:19)";
        headline contains "for rank 1"; report contains "stage_group_timeout.py:29"
"""
import datetime
import time

import torch
import torch.distributed as dist

from _common import classifier, dataset, setup, train_step

rank, world = setup()
stage = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=4))
model = classifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for step in range(4):
    loss = train_step(model, optimizer, x[step::4], y[step::4]).detach().reshape(1)
    if rank in (0, 1):
        dist.all_reduce(loss, group=stage)
        if rank == 1 and step == 2:
            print("rank 1: writing the stage's samples", flush=True)
            time.sleep(10)  # the samples written to slow storage
dist.barrier()
dist.destroy_process_group()
