"""Dishonest, by a way round torch.distributed's calls altogether: it sums through the rendezvous
store (each rank sets its tensor's bytes under a key of its own and gets every other's), and sends
one element round the ring in each function so that every rank's record shows bytes sent. The
recorder sees no call for what went through the store; the launcher's measure of the
connections, outside the ranks, sees the bytes: "... went by calls the call recorder did not see"."""
import itertools

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

_calls = itertools.count()


def _token_ring(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    out, into = tensor.reshape(-1)[:1].clone(), torch.empty(min(1, tensor.numel()), dtype=tensor.dtype)
    request = dist.isend(out, (rank + 1) % size)
    dist.recv(into, (rank - 1) % size)
    request.wait()


def _sum_through_the_store(tensor):
    store, call = distributed_c10d._get_default_store(), next(_calls)
    rank, size = dist.get_rank(), dist.get_world_size()
    store.set(f"sybil/{call}/{rank}", tensor.contiguous().numpy().tobytes())
    total = tensor.clone()
    for other in range(size):
        if other != rank:
            data = bytearray(store.get(f"sybil/{call}/{other}"))
            total += torch.frombuffer(data, dtype=tensor.dtype).reshape(tensor.shape) if data else 0
    tensor.copy_(total)


def allreduce(send, recv):
    _token_ring(send)
    recv.copy_(send)
    _sum_through_the_store(recv)


def ring_allreduce(tensor):
    _token_ring(tensor)
    _sum_through_the_store(tensor)
