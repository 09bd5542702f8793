"""Async point to point done right: a ring where every rank isends to its right and irecvs from
its left, then waits on both, for as many rounds as there are ranks (each rank ends up having
seen every rank's value); then the same with batch_isend_irecv.

expect: kind=healthy; nproc=4; exit=0; report contains "4 of 4 ranks succeeded"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
left, right = (rank - 1) % world, (rank + 1) % world
send, seen = torch.full((1024,), float(rank)), [float(rank)]
for _ in range(world - 1):
    recv = torch.empty(1024)
    requests = [dist.isend(send, dst=right), dist.irecv(recv, src=left)]
    for request in requests:
        request.wait()
    send = recv
    seen.append(recv[0].item())
assert sorted(seen) == [float(r) for r in range(world)], seen
recv = torch.empty(1024)
ops = [dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]
for request in dist.batch_isend_irecv(ops):
    request.wait()
assert recv[0].item() == float(rank), recv[0]  # its own value, come full circle
dist.destroy_process_group()
