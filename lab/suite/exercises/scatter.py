"""Scatter: rank 0 splits a tensor into pieces and rank i receives piece i.

From "Collective Communication, 3) Scatter" (tutorials 002/003): rank 0 scatters
[10, 20, 30, 40] over 4 ranks. That tutorial notes that nccl did not support scatter and
shows a workaround (scatter_nccl.py): every rank takes its own piece of the whole input.
"""
import torch
import torch.distributed as dist


def run(rank, size, backend, device):
    # Rank 0 holds the data, one piece per rank: [10, 20, 30, ...].
    if rank == 0:
        data = torch.tensor([10.0 * (i + 1) for i in range(size)], device=device)
    else:
        data = torch.zeros(size, device=device)
    output = torch.zeros(1, device=device)
    result = {}
    try:
        dist.scatter(output, scatter_list=list(data.split(1)) if rank == 0 else None, src=0)
    except RuntimeError as err:
        if "does not support" not in str(err):
            raise
        # The workaround: rank 0 broadcasts the whole input, then each rank keeps its piece.
        dist.broadcast(data, src=0)
        output.copy_(data[rank:rank + 1])
        result = {"unsupported": f"scatter on {backend}: {err}",
                  "workaround": "broadcast the whole input from rank 0; each rank keeps its own piece"}
    print(f"after rank {rank}: {output}")
    return {"received": output.tolist(), **result}
