"""WRONG ring all-reduce: one exchange with the neighbour, as if the ring had two ranks.

With two ranks the left neighbour is the only other rank, so one step brings in every
value and the program passes with --nproc 2. A ring of n ranks needs n - 1 steps
(``range(size - 1)``) to carry every rank's tensor round, and the chunked version n - 1
steps of reduce-scatter and n - 1 of all-gather. Here each loop runs once: every send is
still matched by a recv, so nothing hangs on 3+ ranks; the sums are wrong instead. With 4
ranks the check must give
"rank 0: allreduce(send, recv), size 1 float32: positions [0]: expected [SUM], got [PART]" (rank 0
holds only its own input and its left neighbour's, rank 3's, not the sum of all four).
"""
import torch
import torch.distributed as dist

STEPS = 1  # the mistake: should be size - 1


def allreduce(send, recv):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    accum, incoming = send.clone(), send.clone()
    for _ in range(STEPS):
        send_req = dist.isend(send, right)
        dist.recv(incoming, left)
        send_req.wait()
        accum += incoming
    recv[:] = accum[:]


def ring_allreduce(tensor):
    rank, size = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % size, (rank + 1) % size
    flat = tensor.view(-1)
    chunks = list(torch.tensor_split(flat, size))
    for s in range(STEPS):  # reduce-scatter
        out, into = chunks[(rank - s) % size], chunks[(rank - s - 1) % size]
        incoming = torch.empty_like(into)
        send_req = dist.isend(out, right)
        dist.recv(incoming, left)
        send_req.wait()
        into += incoming
    for s in range(STEPS):  # all-gather
        out, into = chunks[(rank + 1 - s) % size], chunks[(rank - s) % size]
        send_req = dist.isend(out, right)
        dist.recv(into, left)
        send_req.wait()

