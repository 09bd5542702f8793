"""WRONG ring all-reduce: right values, wrong method, by a path beside torch.distributed's public
functions: the functional collectives (``torch.distributed._functional_collectives``), which reach
the backend through ``torch.ops._c10d_functional``. The recorder wraps those ops too, so the method
check says "ranks 0, 1, 2, 3 called torch.ops._c10d_functional.all_reduce".
"""
import torch.distributed as dist
import torch.distributed._functional_collectives as functional


def allreduce(send, recv):
    recv.copy_(functional.all_reduce(send, "sum", dist.group.WORLD))


def ring_allreduce(tensor):
    tensor.copy_(functional.all_reduce(tensor, "sum", dist.group.WORLD))
