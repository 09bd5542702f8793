"""Subgroups done right: pairs {0, 1} and {2, 3}, each rank all_reduces in its own pair, then
across the world; the pairs' calls and the world's interleave differently on each rank's records
and still match.

expect: kind=healthy; nproc=4; exit=0; report contains "4 of 4 ranks succeeded"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
pair = pairs[rank // 2]
for step in range(5):
    grad = torch.full((256,), float(rank + step))
    dist.all_reduce(grad, group=pair)
    first = rank - rank % 2
    assert grad[0].item() == 2 * (first + step) + 1, grad[0]
    dist.all_reduce(grad)
    assert grad[0].item() == 2 * sum(2 * (f + step) + 1 for f in (0, 2)), grad[0]
dist.destroy_process_group()
