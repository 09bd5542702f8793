"""Gather: every rank's tensor is collected into a list on the destination rank.

From "Collective Communication, 4) Gather" (tutorials 002/003): rank i sends ``ones(1) * i``
and rank 0 ends with [0, 1, 2, 3]. That tutorial notes that nccl did not support gather;
the workaround is all_gather (gather, then broadcast), keeping the list on rank 0 only.
"""
import torch
import torch.distributed as dist


def run(rank, size, backend, device):
    input = torch.ones(1, device=device) * rank
    # -1 marks a slot that nothing was written into.
    gather_list = [torch.full((1,), -1.0, device=device) for _ in range(size)]
    result = {}
    try:
        dist.gather(input, gather_list=gather_list if rank == 0 else None, dst=0)
    except RuntimeError as err:
        if "does not support" not in str(err):
            raise
        dist.all_gather(gather_list, input)
        result = {"unsupported": f"gather on {backend}: {err}",
                  "workaround": "all_gather, and only rank 0 keeps the list"}
    if rank == 0:  # only dst's list is defined
        print(gather_list)
        result["gathered"] = [t.tolist() for t in gather_list]
    return result
