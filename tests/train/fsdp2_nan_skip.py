"""FSDP2 with a guard that skips a step whose loss is not finite, taken on each rank alone: rank 1's
loss is nan at step 2, so it goes on to step 3's forward (an all_gather) while the others are in
step 2's backward (a reduce_scatter of the gradients).

expect: kind=collective-mismatch; nproc=2; exit=1; headline contains "rank 1"; headline contains "all_gather_single";
        headline contains "rank 0"; report contains "fsdp2_nan_skip.py:25 in <module>: loss.backward()";
        report contains "fsdp2_nan_skip.py:19"
"""
import torch
import torch.distributed as dist

from _common import dataset, setup, sharded_classifier

rank, world = setup()
model = sharded_classifier()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = dataset(64)[:]
for step in range(5):
    loss = torch.nn.functional.cross_entropy(model(x[step::5]), y[step::5])
    if rank == 1 and step == 2:
        loss = loss * float("nan")
    if not torch.isfinite(loss):
        continue
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
