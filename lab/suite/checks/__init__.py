"""The checkers: pure-Python oracles, one module per family of exercises (never torch).

Helpers shared by the checker modules live here: reading the ranks' results without
trusting their shape, since a student's program may return anything.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from lab.suite.check import Expect, World


def reported(e: Expect, results: Mapping[int, Any], world: World) -> dict[int, Mapping[str, Any]]:
    """The ranks whose result is a dict; a missing rank or another kind of value is a mismatch."""
    e.every_rank_reported(results, world)
    ranks: dict[int, Mapping[str, Any]] = {}
    for rank in range(world.world_size):
        if rank not in results:
            continue
        if e.true(rank, "result", isinstance(results[rank], Mapping), expected="a dict", got=results[rank]):
            ranks[rank] = results[rank]
    return ranks


def is_number(value: Any) -> TypeGuard[float]:
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
