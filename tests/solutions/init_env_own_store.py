"""init-env, with the store made by the program itself (the tutorials' machine-to-machine way:
``TCPStore(MASTER_ADDR, MASTER_PORT, size, is_master=rank == 0)``), on the port the lab holds."""
import datetime
import os

import torch
import torch.distributed as dist


def run(backend, device, init_method):
    env = {name: os.environ[name] for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), size, is_master=(rank == 0),
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    try:
        tensor = torch.ones(1, device=device) * (dist.get_rank() + 1)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return {"init_method": init_method, "env": env, "rank": dist.get_rank(),
                "world_size": dist.get_world_size(), "sum": tensor.item()}
    finally:
        dist.destroy_process_group()
