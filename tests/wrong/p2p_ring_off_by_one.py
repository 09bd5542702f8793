"""WRONG p2p ring: every rank sends its right neighbour's rank instead of its own.

Nothing hangs (the send/recv order is right); the values are off by one. With 4 ranks the
check must give
"rank 0: send/recv ring: value received from rank 3 (its rank): expected 3.0, got 0.0 (and 3 more)".
"""
import torch
import torch.distributed as dist


def run(rank, size, device):
    tensor = torch.zeros(1, device=device)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)
    elif rank == 1:
        dist.recv(tensor=tensor, src=0)

    right, left = (rank + 1) % size, (rank - 1) % size
    mine = torch.tensor([float(right)], device=device)  # the mistake: should be float(rank)
    received = torch.full((1,), -1.0, device=device)
    if rank % 2 == 0:
        dist.send(mine, dst=right)
        dist.recv(received, src=left)
    else:
        dist.recv(received, src=left)
        dist.send(mine, dst=right)
    return {"pair": tensor.item(), "ring": received.item()}
