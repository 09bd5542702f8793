"""Reduce: combine every rank's tensor with an operator; only the destination gets the result.

From "Collective Communication, 2) Reduce" (tutorials 002/003), "Reduce & Broadcast"
(tutorial 000) and the four operators of the official tutorial (001/004). The tutorials
start from ``torch.ones(2, 2) * rank``; here it is ``rank + 1``, so that PRODUCT is not 0.
"""
import torch
import torch.distributed as dist

OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT,
       "MAX": dist.ReduceOp.MAX, "MIN": dist.ReduceOp.MIN}


def run(rank, device):
    reduced = {}
    for name, op in OPS.items():
        tensor = torch.ones(2, 2, device=device) * (rank + 1)
        dist.reduce(tensor, dst=0, op=op)
        if rank == 0:  # only dst's tensor holds the result
            print(f"reduce {name}: {tensor}")
            reduced[name] = tensor.tolist()
    return reduced
