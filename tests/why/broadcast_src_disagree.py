"""Ranks that disagree on a broadcast's source: each rank takes the weights from "the first rank of
its node" (2 nodes of 2) where the program meant rank 0, so ranks 0-1 broadcast from 0 and ranks
2-3 from 2. The same call on every rank, two roots: all four wait in it.

expect: kind=collective-mismatch; nproc=4; exit=4; headline contains "broadcast"; headline contains "source";
        report contains "broadcast_src_disagree.py:16"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
weights = torch.full((1024,), float(rank))
dist.barrier()
src = rank - rank % 2  # meant: 0
dist.broadcast(weights, src=src)
grad = weights.clone()
dist.all_reduce(grad)
dist.destroy_process_group()
