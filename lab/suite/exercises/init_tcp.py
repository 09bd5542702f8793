"""init_method="tcp://ADDR:PORT": rank 0's address, with rank and world_size given explicitly.

From "Initialization Methods: TCP" of the official tutorial (001/004):
``dist.init_process_group(init_method='tcp://10.1.1.20:23456', rank=args.rank, world_size=4)``.
Every worker connects to rank 0 at that address and learns there how to reach the others.
"""
import torch
import torch.distributed as dist


def run(rank, size, backend, device, init_method):
    # Nothing comes from the environment: the URL, rank and world_size say it all.
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    try:
        tensor = torch.ones(1, device=device) * (dist.get_rank() + 1)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} (via {init_method}): sum {tensor}")
        return {"init_method": init_method, "rank": dist.get_rank(),
                "world_size": dist.get_world_size(), "sum": tensor.item()}
    finally:
        dist.destroy_process_group()
