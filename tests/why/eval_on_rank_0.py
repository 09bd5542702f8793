"""Rank 0 evaluates after step 1 with an all_reduce of its metric (3 floats) that the other rank
never makes: the other is already in step 2's gradient all_reduce (9 floats). gloo aborts rank 0
within milliseconds (SIGABRT: "Received data size doesn't match expected size"); its stacks as it
dies (faulthandler) show where it was, its relay the call it was in (all_reduce of 3 floats).

expect: kind=collective-mismatch; nproc=2; exit=1; headline contains "all_reduce of 3 floats";
        headline contains "rank 0"; headline contains "Received data size doesn't match expected size";
        report contains "eval_on_rank_0.py:16 in evaluate"; report contains "eval_on_rank_0.py:23"
"""
import torch
import torch.distributed as dist


def evaluate():
    metric = torch.ones(3)
    dist.all_reduce(metric)  # rank 0 only
    return metric


dist.init_process_group("gloo")
for step in range(3):
    grads = torch.ones(9)
    dist.all_reduce(grads)
    if dist.get_rank() == 0 and step == 1:
        evaluate()
dist.destroy_process_group()
