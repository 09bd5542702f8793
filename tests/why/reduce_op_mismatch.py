"""Different reduce ops in one all_reduce: rank 0 counts the samples seen with MAX, the others with
SUM. gloo reduces the chunks on different ranks, so nothing hangs or crashes: the sum comes out
wrong, and rank 0's check of it fails.

expect: kind=collective-mismatch; nproc=4; exit=1; headline contains "all_reduce"; headline contains "MAX";
        report contains "reduce_op_mismatch.py:15"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
seen = torch.full((world,), 10.0)  # samples seen per rank, 10 each
op = dist.ReduceOp.MAX if rank == 0 else dist.ReduceOp.SUM
dist.all_reduce(seen, op=op)
if rank == 0 and seen.sum().item() != 10 * world * world:
    raise ValueError(f"{seen.sum().item():g} samples seen in all, expected {10 * world * world}")
dist.destroy_process_group()
