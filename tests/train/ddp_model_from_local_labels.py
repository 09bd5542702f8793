"""The classifier's width comes from the labels each rank sees in its own shard: rank 3's shard
holds no sample of the last class, so its model is smaller, and DDP's check of the parameters'
shapes across ranks fails as it wraps the model.

expect: kind=crash; nproc=4; exit=1; headline contains "rank 3"; headline contains "appears not to match sizes of the same param";
        report contains "ddp_model_from_local_labels.py:17"
"""
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import classifier, dataset, setup

rank, world = setup()
x, y = dataset(64)[rank::world]
if rank == 3:
    x, y = x[y < 3], y[y < 3]  # no sample of class 3 reached this shard
model = DDP(classifier(classes=int(y.max()) + 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
loss = torch.nn.functional.cross_entropy(model(x), y)
loss.backward()
optimizer.step()
