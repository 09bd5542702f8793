"""Non-blocking point-to-point: isend/irecv return at once; wait() says the transfer is done.

From "Point-to-Point Communication" of the official tutorial (001/004) and "Non-blocking
Communication in PyTorch" (tutorial 000). Until req.wait() returns, do not write to a tensor
being sent nor read a tensor being received: the result would be undefined.
"""
import torch
import torch.distributed as dist


def run(rank, size, device):
    # The tutorial, rank 0 to rank 1, without blocking.
    tensor = torch.zeros(1, device=device)
    req = None
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=1)
        print("Rank 0 started sending")
    elif rank == 1:
        req = dist.irecv(tensor=tensor, src=0)
        print("Rank 1 started receiving")
    if req is not None:
        req.wait()  # from here on tensor is safe to use
    print("Rank ", rank, " has data ", tensor[0])

    # The ring: post the send to the right and the receive from the left, then wait for both.
    # Nothing blocks before wait(), so there is no send/recv order to get right. nccl wants a
    # send and a receive between the same two ranks started together, which is what
    # batch_isend_irecv does with these isend/irecv operations.
    right, left = (rank + 1) % size, (rank - 1) % size
    mine = torch.tensor([float(rank)], device=device)
    received = torch.full((1,), -1.0, device=device)  # -1: nothing has arrived
    requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, right),
                                       dist.P2POp(dist.irecv, received, left)])
    for req in requests:
        req.wait()

    print(f"rank {rank}: ring: received {received} from rank {left}")
    return {"pair": tensor.item(), "ring": received.item()}
