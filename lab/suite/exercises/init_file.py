"""init_method="file:///PATH": the ranks meet in a file on a filesystem they all share.

From "Initialization Methods: 공유 파일 시스템" of the official tutorial (001/004):
``dist.init_process_group(init_method='file:///mnt/nfs/sharedfile', rank=args.rank, world_size=4)``.
Each rank opens the file, writes its information and waits for the others; the filesystem
must support locking with fcntl, or the ranks race.
"""
import torch
import torch.distributed as dist


def run(rank, size, backend, device, init_method):
    # The path must be the same file for every rank: on several hosts, a shared (e.g. NFS) one.
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    try:
        tensor = torch.ones(1, device=device) * (dist.get_rank() + 1)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()} (via {init_method}): sum {tensor}")
        return {"init_method": init_method, "rank": dist.get_rank(),
                "world_size": dist.get_world_size(), "sum": tensor.item()}
    finally:
        dist.destroy_process_group()
