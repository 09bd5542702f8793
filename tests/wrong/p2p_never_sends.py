"""WRONG p2p: rank 0 never sends, so rank 1 waits in recv forever.

The check never sees rank 1's result: the run must stop the hung rank at its timeout and
say where rank 1 hangs (in ``dist.recv``), rather than report a wrong value. (If the
process group's own timeout ends first, gloo raises "Timed out waiting ...ms for recv
operation to complete" there instead.)
"""
import torch
import torch.distributed as dist


def run(rank, device):
    tensor = torch.zeros(1, device=device)
    if rank == 0:
        tensor += 1  # ... and forgets dist.send(tensor=tensor, dst=1)
    elif rank == 1:
        dist.recv(tensor=tensor, src=0)
    return {"pair": tensor.item()}
