"""A student's dsgd solution, only average_gradients, that forgets to divide: the check must
fail with the step in units of one process's step (expected 1.0, got the world size)."""
import torch.distributed as dist


def average_gradients(model):
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
