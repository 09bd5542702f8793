"""WRONG distributed SGD: average_gradients sums the gradients (all_reduce SUM) but never
divides by the world size, so every step is world-size times too long.

The ranks still agree with each other (they all hold the same sum); they differ from one
process training on the full batch. With 4 ranks the check must give
"rank 0: dsgd's first step, in units of one process's step on the full batch: expected 1.0, got 4.0 (and 14 more)"
and the note "the first step was 4x one process's: the gradients were summed over the 4 ranks
but not divided by the world size".
"""
import torch.distributed as dist


def average_gradients(model):
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        # the mistake: param.grad.data /= dist.get_world_size() is missing

