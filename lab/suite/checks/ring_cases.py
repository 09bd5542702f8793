"""The ring all-reduce's test cases: shapes, dtypes, the input formula and the digest.

Shared by the rank program (``lab/suite/exercises/ring_allreduce.py``, which builds its inputs
from :func:`value` and reports :func:`digest` of each result) and the checker
(``lab/suite/checks/ring.py``, which computes the expected sums from the same formula in plain
Python). Pure Python, no torch: lab/ is on every host, so both sides import it.

The input of rank ``r`` at flat position ``i`` is an integer that depends on both, so a
piece sent to the wrong place, a missing remainder or a rank counted twice or not at all
changes the sum there. Every value and every sum is an integer small enough to be exact in
float32 (< 2**24) and in int32, so the checker compares exactly.
"""
from __future__ import annotations

import math
from typing import Any

# Shapes of the cases: empty, single elements, sizes that world sizes 2..5 do not divide
# (and that torch.chunk splits into fewer pieces than ranks), a 2-D tensor, and a few larger.
SHAPES: tuple[tuple[int, ...], ...] = ((0,), (1,), (2,), (3,), (5,), (7,), (3, 7), (64,), (65,),
                                       (1000,), (4099,), (65537,))
DTYPES: tuple[str, ...] = ("float32", "float64", "int64", "int32")
LIST_LIMIT = 64  # a result of at most this many elements is reported whole
WEIGHTS = 13  # the digest's weights are 1..13, by position
PERIOD = 1009  # the formula repeats after this many positions (a prime: no world size divides it)


def value(rank: int, i: Any) -> Any:
    """Rank ``rank``'s input at flat position ``i`` (an int; or a tensor of positions, the inputs at
    each: the rank program builds its tensors so)."""
    return (rank + 1) * ((i % PERIOD) - 500) + 10000 * rank


def expected_value(world_size: int, i: int) -> int:
    """The SUM over every rank's input at flat position ``i``."""
    return sum(value(r, i) for r in range(world_size))


def numel(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape)


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


def expected_digest(shape: tuple[int, ...] | list[int], world_size: int) -> dict[str, Any]:
    """The digest of the correct SUM, from the formula alone."""
    return digest([expected_value(world_size, i) for i in range(numel(shape))], world_size)
