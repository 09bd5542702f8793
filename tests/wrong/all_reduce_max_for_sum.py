"""WRONG all-reduce: uses ReduceOp.MAX where SUM was asked.

The check must fail every rank on SUM only; with 4 ranks the reason is
"rank 0: all_reduce SUM: expected [[10.0, 10.0], [10.0, 10.0]], got [[4.0, 4.0], [4.0, 4.0]] (and 3 more)".
"""
import torch
import torch.distributed as dist

OPS = {"SUM": dist.ReduceOp.MAX,  # the mistake
       "PRODUCT": dist.ReduceOp.PRODUCT, "MAX": dist.ReduceOp.MAX, "MIN": dist.ReduceOp.MIN}


def run(rank, device):
    reduced = {}
    for name, op in OPS.items():
        tensor = torch.ones(2, 2, device=device) * (rank + 1)
        dist.all_reduce(tensor, op=op)
        reduced[name] = tensor.tolist()
    return reduced
