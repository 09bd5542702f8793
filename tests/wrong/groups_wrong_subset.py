"""WRONG groups: copies the tutorial's new_group([0, 1]) where the even ranks were asked.

With 4 ranks the check must give
"rank 0: new_group members (the even ranks): expected [0, 2], got [0, 1] (and 10 more)":
every rank reports the wrong members, rank 1 claims a group rank, rank 2 has none,
and the sums are off.
"""
import torch
import torch.distributed as dist


def run(device):
    rank = dist.get_rank()
    members = [0, 1]  # the mistake: should be list(range(0, size, 2))
    group = dist.new_group(members)
    tensor = torch.ones(1, device=device) * (rank + 1)
    if rank in members:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return {"rank": rank, "world_size": dist.get_world_size(), "members": members,
            "group_rank": dist.get_rank(group), "group_size": dist.get_world_size(group),
            "value": tensor.item()}
