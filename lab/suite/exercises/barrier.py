"""Barrier: a rank that reaches it waits there until every rank of the group has reached it.

From "Collective Communication, 8) Barrier" (tutorials 002/003), where rank 0 sleeps for a
few seconds and the others wait for it, and ``dist.barrier(group)`` in the official
tutorial (001/004). The ranks arrive one after another, 0.2 s apart; none may leave
before the last one has arrived.
"""
import time

import torch.distributed as dist


def run(rank):
    time.sleep(0.2 * rank)
    arrived = time.time()
    print(f"rank {rank}: no-barrier")
    dist.barrier()
    left = time.time()
    print(f"rank {rank}: barrier")
    return {"arrived": arrived, "left": left}
