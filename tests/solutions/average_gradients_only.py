"""A student's dsgd solution as a student writes it: only average_gradients (the lab's
reference program drives it). Correct: all_reduce SUM, then divide by the world size."""
import torch.distributed as dist


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size
