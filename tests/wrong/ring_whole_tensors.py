"""WRONG homework: ``ring_allreduce`` passes whole tensors round the ring, n - 1 times, as the
tutorial's ``allreduce`` does. The sums are right and only point-to-point calls are made, but
every rank sends n - 1 whole tensors: with 3 ranks 2.00x the tensor, 1.5 times the chunked
ring's 2(n-1)/n = 1.33x. The check must fail with "ring_allreduce(tensor) is not
bandwidth-optimal" (with 2 ranks both send one tensor and it passes).
"""
import torch
import torch.distributed as dist

from lab.suite.exercises.ring_allreduce import allreduce  # noqa: F401  (the tutorial's part: the reference's)


def ring_allreduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    total, outgoing, incoming = tensor.clone(), tensor.clone(), torch.empty_like(tensor)
    for _ in range(size - 1):
        request = dist.isend(outgoing, right)
        dist.recv(incoming, left)
        request.wait()
        total += incoming
        outgoing, incoming = incoming, outgoing
    tensor.copy_(total)
