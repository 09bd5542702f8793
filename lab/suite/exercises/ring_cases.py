"""The ring all-reduce's test cases: shapes, dtypes, where each case's inputs lie among a rank's
drawn values, and the digest a rank reports of each result.

Shared by the rank program (``lab/suite/exercises/ring_allreduce.py``) and the checker
(``lab/suite/checks/ring.py``). Pure Python, no torch: the ranks import it.

A rank's inputs are fresh random values the controller draws for that rank and that run
(``lab.core.random_inputs``; the rank takes its own: ``lab.rank.inputs``): :data:`DRAWN` integers in
[-32768, 32767]. Each function of :data:`FUNCTIONS` has inputs of its own (:data:`CASE_VALUES` each,
the cases' one after another in :data:`SHAPES` order; every dtype of a shape starts from the same
values), so the answer of one function's case is nowhere in the process when the other's runs: a
function that looks it up in its caller's frame finds the sum of other values. So no rank can know
another's input without receiving it, and the sum at each position is an integer exact in float32
(below 2**24 up to 512 ranks) and int32: the checker compares exactly.
"""
from __future__ import annotations

import math
from typing import Any

# Shapes of the cases: empty, single elements, sizes that world sizes 2..5 do not divide
# (and that torch.chunk splits into fewer pieces than ranks), a 2-D tensor, and a few larger.
SHAPES: tuple[tuple[int, ...], ...] = ((0,), (1,), (2,), (3,), (5,), (7,), (3, 7), (64,), (65,),
                                       (1000,), (4099,), (65537,))
DTYPES: tuple[str, ...] = ("float32", "float64", "int64", "int32")
ITEM_BYTES = {"float32": 4, "float64": 8, "int64": 8, "int32": 4}
FUNCTIONS: tuple[str, ...] = ("allreduce", "ring_allreduce")  # the functions a student writes, in the order run
LIST_LIMIT = 64  # a result of at most this many elements is reported whole
WEIGHTS = 13  # the digest's weights are 1..13, by position


def numel(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape)


CASE_VALUES = sum(numel(shape) for shape in SHAPES)  # the values one function's cases take
DRAWN = len(FUNCTIONS) * CASE_VALUES  # values drawn for each rank
# the bytes of the tensors one function is given on each rank, over every case
TENSOR_BYTES = sum(numel(shape) * ITEM_BYTES[dtype] for shape in SHAPES for dtype in DTYPES)


def starts(function: str) -> dict[tuple[int, ...], int]:
    """Where each shape's inputs for ``function`` start among a rank's drawn values."""
    offsets, at = {}, FUNCTIONS.index(function) * CASE_VALUES
    for shape in SHAPES:
        offsets[shape] = at
        at += numel(shape)
    return offsets


def case_name(shape: tuple[int, ...] | list[int], dtype: str) -> str:
    """How a case is named in results and reasons: ``size 5 int64``, ``size 3x7 float32``."""
    return f"size {'x'.join(str(d) for d in shape)} {dtype}"


def sample_positions(count: int, world_size: int) -> list[int]:
    """Where a large result is sampled: both ends, where every rank's piece starts and ends
    (both for torch.chunk's split and for torch.tensor_split's), and a spread in between."""
    if count == 0:
        return []
    positions = set(range(min(4, count))) | set(range(max(0, count - 4), count))
    step = -(-count // world_size)  # torch.chunk: pieces of ceil(count / n)
    for k in range(world_size + 1):
        for start in (k * step, k * (count // world_size) + min(k, count % world_size)):  # chunk, tensor_split
            positions |= {p for p in (start - 1, start) if 0 <= p < count}
    positions |= {count * k // 11 for k in range(11)}
    return sorted(positions)


def digest(values: list[Any], world_size: int) -> dict[str, Any]:
    """What a rank reports of one flat result: every value when there are at most
    ``LIST_LIMIT``, else the values at :func:`sample_positions`, the sum and a weighted sum."""
    if len(values) <= LIST_LIMIT:
        return {"values": list(values)}
    return {"numel": len(values),
            "samples": [[p, values[p]] for p in sample_positions(len(values), world_size)],
            "sum": sum(values),
            "weighted": weighted_sum(values)}


def weighted_sum(values: list[Any]) -> Any:
    """The sum of ``values[i] * (i % WEIGHTS + 1)`` (so a permutation shows), a slice per weight
    (exact in any order: every value and sum is an integer well below 2**53)."""
    return sum((k + 1) * sum(values[k::WEIGHTS]) for k in range(WEIGHTS))
