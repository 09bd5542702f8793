"""WRONG reduce-scatter: the input list is in reverse order, so rank i gets piece n - 1 - i.

With 4 ranks the check must give
"rank 0: reduce_scatter SUM: piece received: expected [6], got [6000] (and 3 more)".
"""
import torch
import torch.distributed as dist


def run(rank, size, device):
    inputs = torch.tensor([10 ** i for i in range(size)], device=device) * rank
    input_list = list(torch.split(inputs, 1))[::-1]  # the mistake: reversed
    output = torch.tensor([0], device=device)
    dist.reduce_scatter(output, input_list, op=dist.ReduceOp.SUM)
    return {"received": output.tolist()}
