"""Tags that don't match: rank 0 sends its activations with tag ACTIVATIONS, rank 1 receives them
with tag GRADIENTS. gloo matches a send to a recv by source and tag: both wait for ever.

expect: kind=p2p-unmatched; nproc=2; exit=4; headline contains "tag 1"; headline contains "tag 2";
        report contains "tag_mismatch.py:17"; report contains "tag_mismatch.py:19"
"""
import torch
import torch.distributed as dist

ACTIVATIONS, GRADIENTS = 1, 2
dist.init_process_group("gloo")
rank = dist.get_rank()
activations = torch.zeros(4096)
dist.barrier()
if rank == 0:
    activations += 1
    dist.send(activations, dst=1, tag=ACTIVATIONS)
else:
    dist.recv(activations, src=0, tag=GRADIENTS)  # the wrong constant
dist.destroy_process_group()
