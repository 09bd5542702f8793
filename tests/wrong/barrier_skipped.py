"""WRONG barrier: rank 0 reads the clock for "left" before the barrier, as if it had not waited.

Rank 0 still calls barrier (so every rank makes the same collective calls and nothing
hangs), but what it reports is a rank that left first. With 4 ranks the check must give
"rank 0: left the barrier before rank 3 arrived (s after the first arrival): expected '>= 0.600', got '0.000'"
(give or take a few ms).
"""
import time

import torch.distributed as dist


def run(rank):
    time.sleep(0.2 * rank)
    arrived = time.time()
    if rank == 0:
        left = time.time()  # the mistake: leaves without waiting
        dist.barrier()
    else:
        dist.barrier()
        left = time.time()
    return {"arrived": arrived, "left": left}
