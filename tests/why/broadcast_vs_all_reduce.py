"""A broadcast on one rank against an all_reduce on the others: rank 0 shares its weights while
ranks 1-3 average theirs, at the same point of the program. Two different collectives never meet.

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "broadcast"; headline contains "all_reduce";
        report contains "broadcast_vs_all_reduce.py:16"; report contains "broadcast_vs_all_reduce.py:18"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
weights = torch.full((256,), float(rank))
dist.all_reduce(weights)  # (one step every rank makes alike)
weights /= world
if rank == 0:
    dist.broadcast(weights, src=0)
else:
    dist.all_reduce(weights)
dist.destroy_process_group()
