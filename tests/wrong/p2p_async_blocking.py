"""WRONG p2p-async: right values, but only the blocking send and recv, never isend, irecv or
wait(). The check must fail with "made no batch_isend_irecv or irecv or isend call:
p2p-async must use the non-blocking point-to-point calls".
"""
import torch
import torch.distributed as dist


def run(rank, size, device):
    tensor = torch.zeros(1, device=device)
    if rank == 0:
        tensor += 1
        dist.send(tensor, dst=1)
    elif rank == 1:
        dist.recv(tensor, src=0)

    right, left = (rank + 1) % size, (rank - 1) % size
    mine = torch.tensor([float(rank)], device=device)
    received = torch.full((1,), -1.0, device=device)
    if rank % 2 == 0:
        dist.send(mine, dst=right)
        dist.recv(received, src=left)
    else:
        dist.recv(received, src=left)
        dist.send(mine, dst=right)
    return {"pair": tensor.item(), "ring": received.item()}
