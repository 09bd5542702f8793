"""Dishonest: switches the lab's call recorder off around the collective the exercise forbids, so
that no all_reduce is recorded. The values are right; but with the recorder off nothing it sent
was recorded either, and a rank of a point-to-point exercise that sent nothing fails ("sent 0
bytes"): hiding a call hides the communication with it."""
import torch.distributed as dist

from lab.rank.calls import RECORDER


def _hidden_all_reduce(tensor):
    RECORDER.active = False
    try:
        dist.all_reduce(tensor)
    finally:
        RECORDER.active = True


def allreduce(send, recv):
    recv.copy_(send)
    _hidden_all_reduce(recv)


def ring_allreduce(tensor):
    _hidden_all_reduce(tensor)
