"""The inputs a run draws for its ranks: where an exercise computes from inputs (``Exercise.drawn``),
fresh random values for every rank, drawn here for every run, so that no submission can predict
them; the checker expects what the drawn values give (``World.inputs``).

A run's values come from its seed (:func:`new_seed`: 128 bits from the operating system's random
source, never given to a rank): each rank's are SHAKE-256 of the seed and the rank, so a rank that
knows its own values learns nothing of another's, and ``lab run EXERCISE --seed SEED`` draws a
graded run's values again, to replay it exactly.

Each rank's values are little-endian int16 (:data:`VALUE_BYTES` each): a file per rank,
``inputs/rank-R`` in the run directory (``lab.rank.inputs``), carried only to the host the plan
puts the rank on. Under torchrun and srun, which place the ranks themselves, every host gets
every rank's file (docs/classroom.md says what that leaves open).
"""
from __future__ import annotations

import hashlib
import re
import secrets
import struct

VALUE_BYTES = 2


SEED = re.compile(r"[0-9a-f]{32}")  # what a seed looks like


def new_seed() -> str:
    """A fresh seed: 128 random bits, as hex."""
    return secrets.token_hex(16)


def draw(count: int, seed: str, rank: int) -> bytes:
    """Rank ``rank``'s ``count`` values of the run of ``seed``."""
    return hashlib.shake_256(f"lab-inputs {seed} rank {rank}".encode()).digest(VALUE_BYTES * count)


def values(data: bytes) -> tuple[int, ...]:
    """The values of one rank's draw."""
    return struct.unpack(f"<{len(data) // VALUE_BYTES}h", data)
