"""A straggler, not a hang: rank 3 computes for 20 s (a busy loop, outside torch.distributed)
before step 2's all_reduce while ranks 0-2 wait in it. The waiting ranks are in a collective, the
straggler is not: nothing may stop this run.

expect: kind=healthy; nproc=4; exit=0; report contains "4 of 4 ranks succeeded"
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
for step in range(4):
    if rank == 3 and step == 2:
        end, x = time.monotonic() + 20, 0
        while time.monotonic() < end:  # a long forward pass
            x = (x * 31 + 7) % 1_000_003
    grad = torch.full((256,), float(step))
    dist.all_reduce(grad)
    assert grad[0].item() == step * world, grad[0]
dist.destroy_process_group()
