"""WRONG all-reduce: every rank writes down the expected results, n(n+1)/2, n!, n and 1 for
SUM, PRODUCT, MAX and MIN, without any collective. The values are right; the check must fail
with "made no all_reduce call: all-reduce practises all_reduce".
"""
import math

import torch
import torch.distributed as dist


def run(rank, size, device):
    ops = {"SUM": size * (size + 1) / 2, "PRODUCT": float(math.factorial(size)), "MAX": float(size), "MIN": 1.0}
    reduced = {}
    for name, value in ops.items():
        tensor = torch.ones(2, 2, device=device) * (rank + 1)
        tensor.fill_(value)  # ... in place of dist.all_reduce(tensor, op=...)
        reduced[name] = tensor.tolist()
    assert dist.is_initialized()
    return reduced
