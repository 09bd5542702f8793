"""Tensors of different dtypes in one all_reduce: rank 2 reads its statistics as float64, the others
as float32 (the same number of elements, not the same bytes). gloo aborts rank 1, which receives
rank 2's larger chunks (SIGABRT, 1024 vs 512 bytes); rank 2 itself only loses its connection.

expect: kind=collective-mismatch; nproc=4; exit=1; headline contains "all_reduce"; headline contains "rank 2";
        report contains "float64"; report contains "dtype_mismatch.py:15"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dtype = torch.float64 if rank == 2 else torch.float32
stats = torch.ones(1024, dtype=dtype)
dist.all_reduce(stats)
dist.destroy_process_group()
