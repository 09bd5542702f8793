"""An irecv whose wait() never completes: ranks pass activations in pairs, 0 to 1 and 2 to 3, but
rank 0 isends to rank 3. Rank 1's irecv from 0 never completes, nor does rank 0's isend (rank 3
receives only from 2); ranks 2 and 3 finish their exchange and wait in the barrier.

expect: kind=p2p-unmatched; nproc=4; exit=4; headline contains "rank 1"; headline contains "rank 0";
        report contains "irecv_wrong_peer.py:17"; report contains "irecv_wrong_peer.py:20"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
activations = torch.full((4096,), float(rank))
dist.barrier()
if rank % 2 == 0:
    dst = world - 1 if rank == 0 else rank + 1  # meant: rank + 1
    request = dist.isend(activations, dst=dst)
else:
    request = dist.irecv(activations, src=rank - 1)
request.wait()
dist.barrier()
dist.destroy_process_group()
