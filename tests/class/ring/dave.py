"""A memory hog: keeps allocating 256 MiB blocks until something stops it."""
import torch

from lab.suite.exercises.ring_allreduce import allreduce  # noqa: F401

hoard = []


def ring_allreduce(tensor):
    while True:
        hoard.append(torch.ones(64 * 2**20))  # 256 MiB of float32, touched
