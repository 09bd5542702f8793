"""WRONG distributed SGD: average_gradients raises on rank 1 before its all_reduce, so rank 0 waits
in an all_reduce that rank 1 never makes (rank 1 is in the lab's barrier after the exercise).

The cause is rank 1's exception, said first, at the student's line; the lab's own barrier is no
party to it (not "the ranks are in different collectives: rank 1 in barrier at lab/rank/worker.py"),
and its traceback shows the student's frames, not the lab's driver's.
"""
import torch.distributed as dist


def average_gradients(model):
    size = float(dist.get_world_size())
    if dist.get_rank() == 1:
        raise ValueError("rank 1 gives up")
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size
