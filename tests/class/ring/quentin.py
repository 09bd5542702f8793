"""Dishonest: takes the answer from its caller's frame. The driver runs ``allreduce`` and then
``ring_allreduce`` on each case, so a ring that walks up the stack finds ``recv``, the sum the
tutorial's ring has just computed; it copies it, and passes one element round the ring so that
every rank's record shows bytes sent. Each function's inputs are drawn apart, so what it copies is
the sum of other values: its ring's values are wrong ("ring_allreduce(tensor), size 1 float32:
positions [0]"), and its connections carried less than two all-reduces must move."""
import sys

import torch
import torch.distributed as dist


def allreduce(send, recv):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    total, outgoing, incoming = send.clone(), send.clone(), torch.empty_like(send)
    for _ in range(size - 1):
        request = dist.isend(outgoing, right)
        dist.recv(incoming, left)
        request.wait()
        total += incoming
        outgoing, incoming = incoming, outgoing
    recv.copy_(total)


def _from_the_callers_frame(tensor):
    frame = sys._getframe(1)
    while frame is not None:
        found = frame.f_locals.get("recv")
        if isinstance(found, torch.Tensor) and found.shape == tensor.shape:
            return found
        frame = frame.f_back
    return None


def ring_allreduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    token, into = tensor.reshape(-1)[:1].clone(), torch.empty(min(1, tensor.numel()), dtype=tensor.dtype)
    request = dist.isend(token, (rank + 1) % size)
    dist.recv(into, (rank - 1) % size)
    request.wait()
    answer = _from_the_callers_frame(tensor)
    if answer is not None:
        tensor.copy_(answer)
