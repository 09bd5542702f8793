"""Process groups: get_rank/get_world_size, and new_group of a subset of the ranks.

From "Process Group" (tutorials 002/003) and "Collective Communication" of the official
tutorial (001/004), where ``dist.new_group([0, 1])`` limits an all_reduce to ranks 0 and 1.
The lab has already called init_process_group: the default group, the "world", exists.
"""
import torch
import torch.distributed as dist


def run(device):
    rank = dist.get_rank()
    size = dist.get_world_size()

    # Every rank must call new_group, members or not: forming a group is itself collective.
    members = list(range(0, size, 2))  # the even ranks
    group = dist.new_group(members)

    tensor = torch.ones(1, device=device) * (rank + 1)
    if rank in members:
        # Only the members take part (torch would skip a non-member's call with a warning).
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)

    # A non-member has no place in the group: torch answers -1 for both.
    group_rank, group_size = dist.get_rank(group), dist.get_world_size(group)
    print(f"rank {rank}: group of ranks {members}, my rank in it: {group_rank}, I hold {tensor}")
    return {"rank": rank, "world_size": size, "members": members,
            "group_rank": group_rank, "group_size": group_size, "value": tensor.item()}
