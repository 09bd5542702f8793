"""WRONG ring all-reduce: no message at all. Each rank takes its own input for everyone's (the
tutorials' examples start every rank from the same tensor) and multiplies it by the world size.
Before the inputs were drawn afresh for every rank of every run, they followed a formula anyone
could read in the exercise's files, and a rank that summed the formula itself passed the values
check; now no rank can know another's input without receiving it.

Both checks fail it: the values, and the method's "rank 0 sent 0 bytes in allreduce(): it
computed the result without communicating".
"""
import torch.distributed as dist


def allreduce(send, recv):
    recv.copy_(send * dist.get_world_size())


def ring_allreduce(tensor):
    tensor.mul_(dist.get_world_size())
