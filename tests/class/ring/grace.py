"""Exits in the middle of the exercise: rank 1 leaves with os._exit(0)."""
import os

import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce
from lab.suite.exercises.ring_allreduce import ring_allreduce as reference_ring


def ring_allreduce(tensor):
    if dist.get_rank() == 1:
        os._exit(0)
    reference_ring(tensor)


__all__ = ["allreduce", "ring_allreduce"]
