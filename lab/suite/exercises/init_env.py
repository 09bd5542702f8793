"""init_method="env://": the rendezvous reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE.

From "Initialization Methods: 환경 변수" of the official tutorial (001/004), and the
tutorials' init_process/setup functions (000, 002), which set these variables before
calling init_process_group. Here the lab has set them already, as torchrun would.
"""
import os

import torch
import torch.distributed as dist


def run(backend, device, init_method):
    env = {name: os.environ[name] for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    # No rank, no world_size: with env:// they come from RANK and WORLD_SIZE; every rank
    # meets the master (rank 0) at MASTER_ADDR:MASTER_PORT.
    dist.init_process_group(backend, init_method=init_method)
    try:
        tensor = torch.ones(1, device=device) * (dist.get_rank() + 1)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} (via {init_method}): sum {tensor}")
        return {"init_method": init_method, "env": env, "rank": dist.get_rank(),
                "world_size": dist.get_world_size(), "sum": tensor.item()}
    finally:
        dist.destroy_process_group()
