"""WRONG ring all-reduce: right values, wrong method. Both functions call the collective the
exercise is about building (one through ``from torch.distributed import all_reduce``, bound
before any wrapper could be put in place afterwards, the other as ``dist.all_reduce``).

Every sum is right, so only the method check can fail it: "ranks 0, 1, 2 called all_reduce:
ring-allreduce must be built from point-to-point calls (send/recv/isend/irecv)".
"""
import torch.distributed as dist
from torch.distributed import all_reduce


def allreduce(send, recv):
    recv.copy_(send)
    all_reduce(recv)


def ring_allreduce(tensor):
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
