"""Broadcast: the tensor of the source rank is copied into the same tensor on every rank.

From "Collective Communication, 1) Broadcast" (tutorials 002/003) and "Reduce & Broadcast"
(tutorial 000). The tutorials broadcast from rank 0; any rank can be the source, so the
last rank broadcasts too.
"""
import torch
import torch.distributed as dist


def run(rank, size, device):
    received = {}
    for src in (0, size - 1):
        if rank == src:
            tensor = torch.tensor([1.0, 2.0, 3.0], device=device) + 100 * src
        else:
            tensor = torch.zeros(3, device=device)  # memory to receive into
        dist.broadcast(tensor, src=src)
        print(f"after broadcast from rank {src}, rank {rank}: {tensor}")
        received[f"from_{src}"] = tensor.tolist()
    return received
