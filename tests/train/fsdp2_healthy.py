"""FSDP2 (fully_shard) on the CPU: each linear layer sharded over the ranks, a few steps of SGD,
the loss all_reduced for the log; its all_gathers and reduce_scatters run under the lab's recorder.

expect: kind=healthy; nproc=2; exit=0
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
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    logged = loss.detach().reshape(1)
    dist.all_reduce(logged)
dist.destroy_process_group()
