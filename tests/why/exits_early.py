"""A rank that exits early: rank 2 runs out of data after 3 steps and calls sys.exit(0); the
others wait for it in step 3's all_reduce until its connections close.

expect: kind=missing-rank; nproc=4; exit=1; headline contains "rank 2, which exited with status 0 at exits_early.py:19";
        report contains "exits_early.py:21";
        report contains "rank 2 (local) ended early: called sys.exit(0) at exits_early.py:19 (status 0)";
        report contains "0 of 4 ranks succeeded, 1 ended early"
"""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
batches = 3 if rank == 2 else 8
for step in range(8):
    if step == batches:
        sys.exit(0)  # "no more data"
    grad = torch.full((1024,), float(step))
    dist.all_reduce(grad)
dist.destroy_process_group()
