"""WRONG ring all-reduce: no message at all. The inputs follow a formula anyone can read in the
exercise's files, so each rank computes every rank's input and sums them itself: the values are
right, and nothing was communicated.

The method check must fail it: "rank 0 sent 0 bytes in allreduce(): it computed the result
without communicating".
"""
import torch
import torch.distributed as dist

from lab.suite.checks.ring_cases import value


def _everyones_sum(tensor):
    positions = torch.arange(tensor.numel())
    total = sum(value(rank, positions) for rank in range(dist.get_world_size()))
    return total.to(tensor.dtype).reshape(tensor.shape)


def allreduce(send, recv):
    recv.copy_(_everyones_sum(send))


def ring_allreduce(tensor):
    tensor.copy_(_everyones_sum(tensor))
