"""A student's homework as the README once showed it: only the chunked ``ring_allreduce``.
The exercise grades both functions, so the reference's own ``allreduce`` would be graded in
place of the missing one: the lab must say "defines ring_allreduce() but not allreduce()"."""
import torch
import torch.distributed as dist


def ring_allreduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    chunks = list(torch.tensor_split(tensor.view(-1), size))
    for s in range(size - 1):
        out, into = chunks[(rank - s) % size], chunks[(rank - s - 1) % size]
        incoming = torch.empty_like(into)
        request = dist.isend(out, right)
        dist.recv(incoming, left)
        request.wait()
        into += incoming
    for s in range(size - 1):
        out, into = chunks[(rank + 1 - s) % size], chunks[(rank - s) % size]
        request = dist.isend(out, right)
        dist.recv(into, left)
        request.wait()
