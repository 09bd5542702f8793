"""Blocking send and recv done right: even ranks send first and odd ranks receive first, so each
pair exchanges 16 MiB both ways without waiting on each other (the fix of both_send_first.py).

expect: kind=healthy; nproc=2; exit=0; report contains "2 of 2 ranks succeeded"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
peer = rank ^ 1
mine, theirs = torch.full((4 * 1024 * 1024,), float(rank)), torch.empty(4 * 1024 * 1024)
for _ in range(2):
    if rank % 2 == 0:
        dist.send(mine, dst=peer)
        dist.recv(theirs, src=peer)
    else:
        dist.recv(theirs, src=peer)
        dist.send(mine, dst=peer)
    assert theirs[0].item() == float(peer), theirs[0]
dist.destroy_process_group()
