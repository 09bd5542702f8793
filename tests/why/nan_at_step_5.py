"""A rank that raises mid-loop: rank 1's loss is nan at step 5; it raises, and the others, waiting
for it in step 5's all_reduce, lose their connection to it. The cause is rank 1's exception, not
the three "Connection closed by peer" that follow.

expect: kind=crash; nproc=4; exit=1; headline contains "rank 1"; headline contains "loss is nan at step 5";
        report contains "nan_at_step_5.py:19"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
weights = torch.ones(1024)
for step in range(10):
    loss = (weights * (rank + 1)).mean() / (step + 1)
    if rank == 1 and step == 5:
        loss = loss * float("nan")  # (a bad batch)
    if torch.isnan(loss):
        raise FloatingPointError(f"loss is nan at step {step}")
    grad = weights * loss
    dist.all_reduce(grad)
    weights -= 0.01 * grad
dist.destroy_process_group()
