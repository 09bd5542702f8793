"""Dishonest, past what the call recorder can see of itself: it clears the recorder's own flag
(not the ``active`` property, which counts being switched off) around the collective the exercise
forbids, and sends one element round the ring in each function so that every rank's record shows
bytes sent. The values are right and the records look like a ring's; but the bytes the ranks'
connections carried, measured by each host's launcher outside the ranks, are far more than the
records account for: "... went by calls the call recorder did not see"."""
import torch
import torch.distributed as dist

from lab.rank.calls import RECORDER


def _token_ring(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    out, into = tensor.reshape(-1)[:1].clone(), torch.empty(min(1, tensor.numel()), dtype=tensor.dtype)
    request = dist.isend(out, (rank + 1) % size)
    dist.recv(into, (rank - 1) % size)
    request.wait()


def _hidden_all_reduce(tensor):
    RECORDER._active = False
    try:
        dist.all_reduce(tensor)
    finally:
        RECORDER._active = True


def allreduce(send, recv):
    _token_ring(send)
    recv.copy_(send)
    _hidden_all_reduce(recv)


def ring_allreduce(tensor):
    _token_ring(tensor)
    _hidden_all_reduce(tensor)
