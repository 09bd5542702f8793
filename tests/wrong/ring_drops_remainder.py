"""WRONG chunked ring all-reduce: chunks of numel // size elements, so the last
numel % size elements (the remainder) are never sent, and keep each rank's own input.

Sizes the world size divides come out right (and the tutorial's allreduce is the
reference's); every other size is wrong at its last positions, and with fewer elements than
ranks (size 1, 2, 3) everything is. With 4 ranks the check must give
"rank 0: ring_allreduce(tensor), size 1 float32: positions [0]: expected [SUM], got [OWN]" (the sum of
the four ranks' drawn values there, and rank 0's own) and, for a large case, the positions past
4096 of "rank 2: ring_allreduce(tensor), size 4099 int64".
"""
import torch
import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce  # noqa: F401 (the tutorial's: the reference's own)


def ring_allreduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    flat = tensor.view(-1)
    step = flat.numel() // size  # the mistake: the remainder falls off the end
    chunks = [flat[k * step:(k + 1) * step] for k in range(size)]
    for s in range(size - 1):  # reduce-scatter
        out, into = chunks[(rank - s) % size], chunks[(rank - s - 1) % size]
        incoming = torch.empty_like(into)
        send_req = dist.isend(out, right)
        dist.recv(incoming, left)
        send_req.wait()
        into += incoming
    for s in range(size - 1):  # all-gather
        out, into = chunks[(rank + 1 - s) % size], chunks[(rank - s) % size]
        send_req = dist.isend(out, right)
        dist.recv(into, left)
        send_req.wait()

