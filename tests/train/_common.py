"""What the training programs share, as a project's own module would: a small classifier, a
synthetic data set (the same on every rank: seeded), the process group from the environment."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

FEATURES, CLASSES = 16, 4


def setup():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    return dist.get_rank(), dist.get_world_size()


def dataset(samples, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return TensorDataset(x, y)


def classifier(classes=CLASSES):
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, classes))


def sharded_classifier():
    """The classifier under FSDP2: each linear layer sharded over the ranks, then the whole."""
    from torch.distributed.fsdp import fully_shard

    model = classifier()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def loader(data, batch_size=8, **sampler):
    return DataLoader(data, batch_size=batch_size, sampler=DistributedSampler(data, **sampler))


def train_step(model, optimizer, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss
