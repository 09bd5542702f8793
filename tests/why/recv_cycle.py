"""Every rank receives first: rank r waits for r-1's token before it passes its own to r+1, so
nobody sends and the ring never starts. The fix: even ranks send first and odd ranks receive
first (p2p_even_odd.py), or isend/irecv (async_ring.py).

expect: kind=p2p-cycle; nproc=4; exit=4; headline contains "0 waits for 3";
        report contains "recv_cycle.py:17"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
left, right = (rank - 1) % world, (rank + 1) % world
dist.barrier()  # every rank is in the ring before it starts: the cycle forms the same way each time
token = torch.full((1024,), float(rank))
for _ in range(world - 1):
    dist.recv(token, src=left)
    dist.send(token, dst=right)
dist.destroy_process_group()
