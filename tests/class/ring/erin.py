"""Correct, but floods its output: 64 MiB per rank."""
import sys

import torch
import torch.distributed as dist

flooded = False


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


def _ring(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    flat = tensor.view(-1)
    chunks = list(torch.tensor_split(flat, size))
    for s in range(size - 1):
        out, into = chunks[(rank - s) % size], chunks[(rank - s - 1) % size]
        incoming = torch.empty_like(into)
        request = dist.isend(out, right)
        dist.recv(incoming, left)
        request.wait()
        into += incoming
    for s in range(size - 1):
        out, into = chunks[(rank + 1 - s) % size], chunks[(rank - s) % size]
        request = dist.isend(out, right)
        dist.recv(into, left)
        request.wait()


def ring_allreduce(tensor):
    global flooded
    if not flooded:
        flooded = True
        line = "x" * 1023 + "\n"
        for _ in range(64 * 1024):
            sys.stdout.write(line)
        sys.stdout.flush()
    _ring(tensor)
