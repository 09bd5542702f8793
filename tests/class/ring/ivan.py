"""Right values, wrong method: the collective the exercise asks to build."""
import torch.distributed as dist


def allreduce(send, recv):
    recv.copy_(send)
    dist.all_reduce(recv)


def ring_allreduce(tensor):
    dist.all_reduce(tensor)
