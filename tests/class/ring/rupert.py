"""Dishonest, before any graded function runs: as the lab loads the file, it walks up the stack to
the rank's own inputs (every case of both functions, in the lab's worker), sends them to every other
rank in their 2-byte form, and so holds every rank's; each function then looks its case's sums up
and passes one element round the ring, so that every rank's record shows bytes sent. The values are
right, and every byte it sent is recorded; but an all-reduce of n tensors must move 2(n-1) of them
over the wire, whatever the algorithm, and its connections carried far less: "... less than
ring-allreduce's functions must move to compute their results"."""
import sys
from collections import Counter

import torch
import torch.distributed as dist

from lab.suite.exercises.ring_cases import DTYPES, SHAPES, numel, starts


def _own_inputs():
    frame = sys._getframe(1)
    while frame is not None:
        inputs = getattr(frame.f_locals.get("self"), "inputs", None)
        if isinstance(inputs, (bytes, bytearray)):
            return bytes(inputs)
        frame = frame.f_back
    raise RuntimeError("rupert: no inputs found up the stack")


def _everyones():
    rank, size = dist.get_rank(), dist.get_world_size()
    own = torch.frombuffer(bytearray(_own_inputs()), dtype=torch.int16)
    received = {peer: torch.empty_like(own) for peer in range(size) if peer != rank}
    requests = [dist.isend(own, peer) for peer in received]
    for peer, into in received.items():
        dist.recv(into, peer)
    for request in requests:
        request.wait()
    return sum((values.to(torch.int64) for values in received.values()), own.to(torch.int64))


SUMS = _everyones()
CALLS = Counter()


def _looked_up(function, tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    token, into = tensor.reshape(-1)[:1].clone(), torch.empty(min(1, tensor.numel()), dtype=tensor.dtype)
    request = dist.isend(token, (rank + 1) % size)
    dist.recv(into, (rank - 1) % size)
    request.wait()
    shape = SHAPES[CALLS[function] // len(DTYPES)]
    CALLS[function] += 1
    at = starts(function)[shape]
    return SUMS[at:at + numel(shape)].reshape(tensor.shape).to(tensor.dtype)


def allreduce(send, recv):
    recv.copy_(_looked_up("allreduce", send))


def ring_allreduce(tensor):
    tensor.copy_(_looked_up("ring_allreduce", tensor))
