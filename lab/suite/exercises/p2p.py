"""Blocking point-to-point: send/recv from rank 0 to rank 1, then once around the ring.

From "Point-to-Point Communication" of the official tutorial (001/004) and "Blocking
Communications in PyTorch" (tutorial 000). send and recv block: each waits until the
message has gone through, so the order of the calls matters.
"""
import torch
import torch.distributed as dist


def run(rank, size, device):
    # The tutorial: both start from zero; rank 0 adds 1 and sends, rank 1 receives
    # into a tensor it allocated itself. Both end with 1.0.
    tensor = torch.zeros(1, device=device)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)
    elif rank == 1:  # the tutorial's plain `else` would leave ranks 2, 3, ... waiting forever
        dist.recv(tensor=tensor, src=0)
    print("Rank ", rank, " has data ", tensor[0])

    # The ring: every rank sends its rank to the right and receives from the left.
    # If every rank sent first, every one could wait for a recv nobody has reached yet,
    # so even ranks send first and odd ranks receive first: the cycle is broken.
    right, left = (rank + 1) % size, (rank - 1) % size
    mine = torch.tensor([float(rank)], device=device)
    received = torch.full((1,), -1.0, device=device)  # -1: nothing has arrived
    if rank % 2 == 0:
        dist.send(mine, dst=right)
        dist.recv(received, src=left)
    else:
        dist.recv(received, src=left)
        dist.send(mine, dst=right)

    print(f"rank {rank}: ring: received {received} from rank {left}")
    return {"pair": tensor.item(), "ring": received.item()}
