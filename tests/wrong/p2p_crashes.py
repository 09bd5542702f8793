"""WRONG on purpose: rank 1 dies (os._exit) in the middle of the exercise.

A crashing solution must be a failed check that names the rank, never a crash of the
lab: the check fails with "rank 1 (local) exited with code 3 during p2p" (or with the
error rank 0 gets when its peer vanishes), and no process is left behind.
"""
import os

import torch
import torch.distributed as dist


def run(rank, size, device):
    tensor = torch.zeros(1, device=device)
    if rank == 0:
        dist.send(tensor + 1, dst=1)
    elif rank == 1:
        os._exit(3)
    return {"received": tensor}
