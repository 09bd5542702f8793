"""All-reduce: like reduce, but every rank gets the result.

From "Collective Communication, 5) All-reduce" (tutorials 002/003) and "Collective
Communication" of the official tutorial (001/004), with its four element-wise operators.
The tutorials start from ``torch.ones(2, 2) * rank``; here it is ``rank + 1``, so that
PRODUCT is not 0.
"""
import torch
import torch.distributed as dist

OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT,
       "MAX": dist.ReduceOp.MAX, "MIN": dist.ReduceOp.MIN}


def run(rank, device):
    reduced = {}
    for name, op in OPS.items():
        tensor = torch.ones(2, 2, device=device) * (rank + 1)
        dist.all_reduce(tensor, op=op)  # in place, on every rank
        print(f"rank {rank}: all_reduce {name}: {tensor}")
        reduced[name] = tensor.tolist()
    return reduced
