"""One rank with an extra batch: 41 samples dealt to 4 ranks give rank 0 eleven and the others ten,
so rank 0 waits in its 11th all_reduce while ranks 1-3 have finished. The fix: drop_last (the
DistributedSampler's), or DDP's join() for uneven inputs.

expect: kind=uneven-counts; nproc=4; exit=1; headline contains "rank 0"; headline contains "11th all_reduce";
        report contains "extra_batch.py:17"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
samples = list(range(rank, 41, world))
dist.barrier()  # (the ranks start the epoch together)
for sample in samples:
    grad = torch.full((1024,), float(sample))
    dist.all_reduce(grad)
dist.destroy_process_group()
