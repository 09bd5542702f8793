"""Tensors of different sizes in one all_reduce: rank 3 builds its gradient for a vocabulary of
1000 words (its own shard's), the others for 1024. gloo aborts rank 3 (SIGABRT: "Received data
size doesn't match expected size", 512 vs 500 bytes); its relay tells its call ("which passes 1000
floats"); the others lose their connection to it.

expect: kind=collective-mismatch; nproc=4; exit=1; headline contains "rank 3 (local), which passes 1000 floats";
        headline contains "Received data size doesn't match expected size";
        report contains "size_mismatch.py:17"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
vocabulary = 1000 if rank == 3 else 1024
grad = torch.ones(vocabulary)
dist.all_reduce(grad)
dist.destroy_process_group()
