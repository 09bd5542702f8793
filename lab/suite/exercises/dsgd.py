"""Distributed synchronous SGD: every rank trains a copy of the model on its part of the data
and averages the gradients with all_reduce before every step.

From "Distributed Training" (분산 학습) of the official tutorial (001/004): DataPartitioner
gives each rank 1/size of the data, the per-rank batch is the global batch / world size, and
``average_gradients(model)`` all-reduces every gradient (SUM) and divides by the world size.
Here the data is synthetic (2-class points, seeded, no download) and the model a 2-layer MLP,
so that it takes seconds. To grade your own ``average_gradients``: copy this file, change it,
``python -m lab run dsgd --solution mine.py``.

Besides the tutorial's loop, every rank also trains, from the same initial parameters,
(1) ONE process on the union of every rank's batch of the step, with no collective at all,
and (2) the same loop with ``torch.nn.parallel.DistributedDataParallel``; the checker wants
the three equal after every step (averaged gradients of equal-sized batches are the
gradient of their union) and the same on every rank.

What changed since the tutorial (004) was written:

* ``dist.reduce_op.SUM`` is now ``dist.ReduceOp.SUM`` (``reduce_op`` was removed);
* ``epoch_loss += loss.data[0]`` fails on a 0-dim loss: use ``loss.item()``;
* ``Variable(data)`` is not needed any more: tensors carry autograd themselves;
* ``init_process_group(backend='tcp')``: the TCP backend is gone; use ``"gloo"`` (``tcp://``
  is still an init method);
* ``bsz = 128 / float(size)`` is a float, and DataLoader wants an int: here
  ``GLOBAL_BATCH // size`` (with 3 ranks and 32, 10 per rank: the global batch is 30, and
  the remainder of the division is dropped, as DataPartitioner drops the samples
  ``int(frac * len)`` leaves over);
* the tutorial's ``Net`` (MNIST convolutions) has dropout; this MLP has none: random masks
  would differ between a rank's batch and the same samples in the one-process batch;
* ``shuffle=True`` draws from torch's global RNG: here every loader gets its own
  ``torch.Generator`` seeded alike, so the one-process reference can replay every rank's batches.
"""
import copy
from math import ceil
from random import Random

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from lab.suite.exercises.dsgd_settings import (
    CLASSES,
    EPOCHS,
    FEATURES,
    HIDDEN,
    LR,
    MOMENTUM,
    SAMPLES,
    SEED,
    batch_per_rank,
)


class Partition:
    """ Dataset-like object, but only access a subset of it. """

    def __init__(self, data, index):
        self.data = data
        self.index = index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        data_idx = self.index[index]
        return self.data[data_idx]


class DataPartitioner:
    """ Partitions a dataset into different chuncks. """

    def __init__(self, data, sizes=[0.7, 0.2, 0.1], seed=1234):
        self.data = data
        self.partitions = []
        rng = Random()
        rng.seed(seed)
        data_len = len(data)
        indexes = [x for x in range(data_len)]
        rng.shuffle(indexes)

        for frac in sizes:
            part_len = int(frac * data_len)
            self.partitions.append(indexes[0:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


def synthetic_dataset():
    """In place of MNIST: SAMPLES points, labelled by the side of a plane they fall on (with
    noise). Seeded, so every rank builds the same data set."""
    g = torch.Generator().manual_seed(SEED)
    points = torch.randn(SAMPLES, FEATURES, generator=g)
    plane = torch.randn(FEATURES, generator=g)
    labels = ((points @ plane + 0.5 * torch.randn(SAMPLES, generator=g)) > 0).long()
    return TensorDataset(points, labels)


def rank_loader(dataset, size, rank, bsz):
    """Rank ``rank``'s partition, shuffled each epoch by a generator seeded alike on every rank."""
    partition = DataPartitioner(dataset, [1.0 / size for _ in range(size)]).use(rank)
    return DataLoader(partition, batch_size=bsz, shuffle=True, generator=torch.Generator().manual_seed(SEED))


def partition_dataset(dataset):
    """ Partitioning the data set """
    size = dist.get_world_size()
    bsz = batch_per_rank(size)  # GLOBAL_BATCH // size; the tutorial: 128 / float(size)
    train_set = rank_loader(dataset, size, dist.get_rank(), bsz)
    return train_set, bsz


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def average_gradients(model):
    """ Gradient averaging. """
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)  # the tutorial (004): dist.reduce_op.SUM
        param.grad.data /= size


def train(rank, size, device, average_gradients):
    """ Distributed Synchronous SGD Example """
    torch.manual_seed(SEED)
    dataset = synthetic_dataset()
    train_set, bsz = partition_dataset(dataset)
    model = Net().to(device)
    initial = copy.deepcopy(model)  # the one-process reference and DDP start from here too
    optimizer = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)

    trace, losses = Trace(), []
    num_batches = ceil(len(train_set.dataset) / float(bsz))
    for epoch in range(EPOCHS):
        epoch_loss = 0.0
        for data, target in train_set:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            epoch_loss += loss.item()  # the tutorial (004): loss.data[0]
            loss.backward()
            average_gradients(model)
            optimizer.step()
            trace.step(model)  # what the checker compares
        print('Rank ', dist.get_rank(), ', epoch ', epoch, ': ', epoch_loss / num_batches)
        losses.append(epoch_loss / num_batches)

    return {"batch_per_rank": bsz, "samples_per_rank": len(train_set.dataset),
            "names": [name for name, _ in model.named_parameters()],
            "sizes": [p.numel() for p in model.parameters()], "initial": flat(initial),
            "dsgd": trace.report(model, losses),
            "reference": one_process(initial, dataset, size, bsz, device),
            "ddp": with_ddp(initial, dataset, size, rank, bsz, device)}


def one_process(initial, dataset, size, bsz, device):
    """ONE process, no collective: each step on the union of every rank's batch of that step
    (their loaders replayed here), the loss averaged over all of it."""
    loaders = [rank_loader(dataset, size, r, bsz) for r in range(size)]

    def union():
        # Read every rank's loader to its end, as each rank's own loop does: zip stops at the
        # first loader's end, and a loader whose last batch is full still draws from its
        # generator on the next() that ends it, so the next epoch's shuffles would differ.
        for batches in zip(*[list(loader) for loader in loaders]):
            yield torch.cat([data for data, _ in batches]), torch.cat([target for _, target in batches])

    return sgd(copy.deepcopy(initial), union, device)


def with_ddp(initial, dataset, size, rank, bsz, device):
    """The same loop with DistributedDataParallel: it averages the gradients during backward()."""
    ids = [device.index] if device.type == "cuda" else None
    model = DistributedDataParallel(copy.deepcopy(initial), device_ids=ids)
    train_set = rank_loader(dataset, size, rank, bsz)
    return sgd(model, lambda: train_set, device)


def sgd(model, batches, device):
    optimizer = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    trace, losses = Trace(), []
    for epoch in range(EPOCHS):
        epoch_loss, count = 0.0, 0
        for data, target in batches():
            optimizer.zero_grad()
            loss = F.nll_loss(model(data.to(device)), target.to(device))
            epoch_loss, count = epoch_loss + loss.item(), count + 1
            loss.backward()
            optimizer.step()
            trace.step(model)
        losses.append(epoch_loss / count)
    return trace.report(model, losses)


class Trace:
    """What the checker gets of a training: after every step each parameter tensor's sum and
    the sum of squares of all of them; every parameter after the first step and at the end."""

    def __init__(self):
        self.steps, self.first = [], None

    def step(self, model):
        params = [p.detach() for p in model.parameters()]
        self.steps.append([p.sum().item() for p in params] + [sum((p * p).sum().item() for p in params)])
        if self.first is None:
            self.first = flat(model)

    def report(self, model, losses):
        return {"losses": losses, "steps": self.steps, "first": self.first, "final": flat(model)}


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def run(rank, size, device):
    return train(rank, size, device, average_gradients)
