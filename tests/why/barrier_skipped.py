"""A barrier one rank skips: each rank waits for the checkpoint only when its own loss improved.
Rank 3's loss did not improve in epoch 2, so it goes on to epoch 3's all_reduce while ranks 0-2
wait in the barrier for it. The fix: decide on a value every rank agrees on (all_reduce the loss).

expect: kind=missing-rank; nproc=4; exit=4; headline contains "rank 3"; headline contains "barrier";
        report contains "barrier_skipped.py:17"; report contains "barrier_skipped.py:21"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
losses = [3.0, 2.5, 2.6, 2.0] if rank == 3 else [3.0, 2.0, 1.5, 1.0]
best = float("inf")
for _epoch, loss in enumerate(losses):
    grad = torch.full((256,), loss)
    dist.all_reduce(grad)
    if loss < best:  # this rank's own loss: the ranks disagree
        best = loss
        # (rank 0 writes the checkpoint here)
        dist.barrier()
dist.destroy_process_group()
