"""A healthy training loop: all_reduce, all_gather and a broadcast every few steps, then a barrier.
Every rank checks what it got, so passing means right, not only done.

expect: kind=healthy; nproc=4; exit=0; report contains "4 of 4 ranks succeeded"
"""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
weights = torch.zeros(1024)
for step in range(30):
    grad = torch.full((1024,), float(rank + step))
    dist.all_reduce(grad)
    assert grad[0].item() == sum(r + step for r in range(world)), grad[0]
    weights -= 0.01 * grad / world
    if step % 10 == 9:
        dist.broadcast(weights, src=0)
        losses = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(losses, torch.tensor([float(rank)]))
        assert [t.item() for t in losses] == [float(r) for r in range(world)], losses
dist.barrier()
dist.destroy_process_group()
