"""Dishonest, and a forger of its records: it clears the call recorder's own flag around the
collective the exercise forbids, as walter does, and then writes into the recorder's counts what
each function would have sent (the tutorial's n-1 whole tensors, the chunked ring's 2(n-1)/n of
one), so that its records look like two honest rings and the connections never seem to carry
more than the records say. The values are right, and so is each function's record; but gloo's
all-reduce moves less than the tutorial's ring, so the records claim more than went over the
wire, measured outside the ranks, and that is no evidence: "the ranks' records say they sent ...
but their connections carried ..."."""
import torch.distributed as dist

from lab.rank.calls import RECORDER


def _hidden_all_reduce(tensor, tensors_sent):
    RECORDER._active = False
    try:
        dist.all_reduce(tensor)
    finally:
        RECORDER._active = True
    right = (dist.get_rank() + 1) % dist.get_world_size()
    RECORDER._add_sent(right, int(tensors_sent * tensor.numel() * tensor.element_size()))


def allreduce(send, recv):
    recv.copy_(send)
    _hidden_all_reduce(recv, dist.get_world_size() - 1)


def ring_allreduce(tensor):
    size = dist.get_world_size()
    _hidden_all_reduce(tensor, 2 * (size - 1) / size)
