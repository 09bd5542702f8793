"""All-gather: every rank's tensor is collected into a list on every rank.

From "Collective Communication, 6) All-gather" (tutorials 002/003): rank i contributes
``ones(1) * i`` and every rank ends with [0, 1, 2, 3].
"""
import torch
import torch.distributed as dist


def run(rank, size, device):
    input = torch.ones(1, device=device) * rank
    # -1 marks a slot that nothing was written into.
    outputs_list = [torch.full((1,), -1.0, device=device) for _ in range(size)]
    dist.all_gather(tensor_list=outputs_list, tensor=input)
    print(outputs_list)
    return {"gathered": [t.tolist() for t in outputs_list]}
