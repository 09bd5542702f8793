"""Dishonest, through a side channel: as the lab loads the file, it walks up the stack to the rank's
own inputs (as rupert does), writes them to /dev/shm for the other ranks and reads theirs from there,
so that every rank holds every sum before any graded function runs. Each function then moves over
the wire exactly what a ring all-reduce moves (a ring all-reduce of zeros: records and wire agree,
and meet a ring's bounds) and returns the sums it looked up. Where the ranks share a /dev/shm (local
processes, a host's ranks of one user) its answers are right; in `lab grade`'s sandbox each rank
has its own /dev/shm (in one container, lab.rank.isolation; or with `--sandbox ranks`, a container
of its own), and the others' inputs never come."""
import os
import sys
import time

import torch
import torch.distributed as dist

from lab.suite.exercises.ring_cases import DTYPES, SHAPES, numel, starts

WAIT = 10.0  # seconds for the others' files


def _own_inputs():
    frame = sys._getframe(1)
    while frame is not None:
        inputs = getattr(frame.f_locals.get("self"), "inputs", None)
        if isinstance(inputs, (bytes, bytearray)):
            return bytes(inputs)
        frame = frame.f_back
    raise RuntimeError("yolanda: no inputs found up the stack")


def _everyones():
    rank, size = dist.get_rank(), dist.get_world_size()
    own = _own_inputs()
    path = f"/dev/shm/yolanda-{os.environ.get('MASTER_PORT')}-{{}}"
    with open(path.format(rank) + ".part", "wb") as f:
        f.write(own)
    os.chmod(path.format(rank) + ".part", 0o644)
    os.rename(path.format(rank) + ".part", path.format(rank))
    total = torch.frombuffer(bytearray(own), dtype=torch.int16).to(torch.int64)
    deadline = time.monotonic() + WAIT
    for peer in (p for p in range(size) if p != rank):
        while not os.path.exists(path.format(peer)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"yolanda: rank {peer}'s inputs never came through /dev/shm")
            time.sleep(0.05)
        with open(path.format(peer), "rb") as f:
            total += torch.frombuffer(bytearray(f.read()), dtype=torch.int16).to(torch.int64)
    return total


SUMS = _everyones()
CALLS = {"allreduce": 0, "ring_allreduce": 0}


def _ring_of_zeros(tensor):
    """What a ring all-reduce of ``tensor`` moves, on zeros: 2(n-1) steps of a chunk each."""
    rank, size = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.zeros_like(tensor).reshape(-1).chunk(size)) if tensor.numel() else []
    chunks += [torch.zeros(0, dtype=tensor.dtype)] * (size - len(chunks))
    for step in range(2 * (size - 1)):
        out, into = chunks[(rank - step) % size], chunks[(rank - step - 1) % size]
        request = dist.isend(out.clone(), (rank + 1) % size)
        dist.recv(into, (rank - 1) % size)
        request.wait()


def _looked_up(function, tensor):
    _ring_of_zeros(tensor)
    shape = SHAPES[CALLS[function] // len(DTYPES)]
    CALLS[function] += 1
    at = starts(function)[shape]
    return SUMS[at:at + numel(shape)].reshape(tensor.shape).to(tensor.dtype)


def allreduce(send, recv):
    recv.copy_(_looked_up("allreduce", send))


def ring_allreduce(tensor):
    tensor.copy_(_looked_up("ring_allreduce", tensor))
