"""Reduce-scatter: reduce every rank's list of pieces, and rank i keeps reduced piece i.

From "Collective Communication, 7) Reduce-scatter" (tutorials 002/003): rank r holds
[1, 10, 100, 1000] * r and, with 4 ranks, rank i ends with 6 * 10**i: 6, 60, 600, 6000.
With n ranks the list is [1, 10, ..., 10**(n-1)] * r. gloo in older torch releases lacked
reduce_scatter; the workaround follows its definition: all_reduce, then keep piece i.
"""
import torch
import torch.distributed as dist


def run(rank, size, backend, device):
    inputs = torch.tensor([10 ** i for i in range(size)], device=device) * rank
    input_list = list(torch.split(inputs, dim=0, split_size_or_sections=1))
    output = torch.tensor([0], device=device)
    result = {}
    try:
        dist.reduce_scatter(output=output, input_list=input_list, op=dist.ReduceOp.SUM)
    except RuntimeError as err:
        if "does not support" not in str(err):
            raise
        dist.all_reduce(inputs, op=dist.ReduceOp.SUM)
        output.copy_(inputs[rank:rank + 1])
        result = {"unsupported": f"reduce_scatter on {backend}: {err}",
                  "workaround": "all_reduce the whole list; each rank keeps its own piece"}
    print(f"rank {rank}: {output}")
    return {"received": output.tolist(), **result}
