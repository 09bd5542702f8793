"""WRONG p2p: right values, wrong method. Rank 0's value reaches rank 1, and each rank's its
right neighbour, by broadcasts from every rank in turn: no send or recv at all. The check
must fail with "called broadcast: p2p must be built from point-to-point calls".
"""
import torch
import torch.distributed as dist


def run(rank, size, device):
    tensor = torch.zeros(1, device=device)
    if rank == 0:
        tensor += 1
    dist.broadcast(tensor, src=0)
    if rank > 1:
        tensor.zero_()  # only ranks 0 and 1 take part in the pair

    received = torch.full((1,), -1.0, device=device)
    for src in range(size):
        value = torch.tensor([float(rank)], device=device)
        dist.broadcast(value, src=src)
        if (src + 1) % size == rank:
            received.copy_(value)
    return {"pair": tensor.item(), "ring": received.item()}
