"""A rank that exits early without unwinding: rank 1 calls os._exit(0) after 3 steps (as a library
that ends the process does), so no atexit handler and no finally block runs on it.

expect: kind=missing-rank; nproc=3; exit=1; headline contains "rank 1, which exited with status 0 at exits_hard.py:16";
        report contains "exits_hard.py:18"
"""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(8):
    if rank == 1 and step == 3:
        os._exit(0)
    grad = torch.full((1024,), float(step))
    dist.all_reduce(grad)
dist.destroy_process_group()
