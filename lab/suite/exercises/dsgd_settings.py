"""The dsgd exercise's settings: the rank program trains with them, the checker
(``lab.suite.checks.dsgd``) expects what they give. Pure Python: the ranks import it."""
from __future__ import annotations

import math

SEED = 1234
SAMPLES = 240  # synthetic 2-class points
FEATURES = 4
HIDDEN = 8
CLASSES = 2
GLOBAL_BATCH = 32  # the tutorial's 128, smaller for a small data set
EPOCHS = 3
LR = 0.05
MOMENTUM = 0.5
PARAMETERS = FEATURES * HIDDEN + HIDDEN + HIDDEN * CLASSES + CLASSES  # fc1.weight, fc1.bias, fc2.weight, fc2.bias


def batch_per_rank(world_size: int) -> int:
    """The tutorial's ``bsz = 128 / float(size)``, as the int DataLoader needs: global // n
    (with 3 ranks and 32: 10 per rank, so a global batch of 30)."""
    return GLOBAL_BATCH // world_size


def samples_per_rank(world_size: int) -> int:
    """The tutorial's DataPartitioner: ``int(frac * data_len)`` with ``frac = 1.0 / size``."""
    return int(1.0 / world_size * SAMPLES)


def steps_per_epoch(world_size: int) -> int:
    return math.ceil(samples_per_rank(world_size) / batch_per_rank(world_size))
