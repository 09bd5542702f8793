"""Only half the homework: allreduce, and no ring_allreduce."""
import torch.distributed as dist


def allreduce(send, recv):
    recv.copy_(send)
    dist.all_reduce(recv)
