"""A subgroup mismatch: the pairs are made right ({0, 1} and {2, 3}) but picked by rank % 2, so
ranks 1 and 2 all_reduce on a pair they are not in, which torch skips with a warning, and go on to
the world's all_reduce, while ranks 0 and 3 wait in their pair's all_reduce for them.

expect: kind=missing-rank; nproc=4; exit=4; headline contains "all_reduce"; headline contains "group";
        report contains "rank 1"; report contains "rank 2"; report contains "subgroup_mismatch.py:18";
        report contains "subgroup_mismatch.py:19"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
pair = pairs[rank % 2]  # meant: rank // 2
for step in range(3):
    grad = torch.full((256,), float(rank + step))
    dist.all_reduce(grad, group=pair)  # average within the pair ...
    dist.all_reduce(grad)  # ... then across pairs
dist.destroy_process_group()
