"""Dishonest: computes locally, sending nothing: each rank takes its own input for everyone's and
multiplies it by the world size. The inputs are drawn afresh for every rank, so the values are
wrong, and "rank 0 sent 0 bytes in allreduce(): it computed the result without communicating"."""
import torch.distributed as dist


def allreduce(send, recv):
    recv.copy_(send * dist.get_world_size())


def ring_allreduce(tensor):
    tensor.mul_(dist.get_world_size())
