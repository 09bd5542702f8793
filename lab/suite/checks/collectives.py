"""Checkers of the collectives: broadcast, reduce, all-reduce, scatter, gather, all-gather,
reduce-scatter and barrier. Expected values come from arithmetic on the inputs."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from lab.suite.check import Expect, Results, Verdict, World
from lab.suite.checks import is_number, reported

# The reduce operators, applied to the ranks' inputs in plain Python.
OPS: dict[str, Callable[[list[int]], int]] = {"SUM": sum, "PRODUCT": math.prod, "MAX": max, "MIN": min}
BARRIER_TOLERANCE = 0.05  # seconds the ranks' clocks may disagree


def _reduced(op: str, n: int) -> list[list[float]]:
    """What a 2x2 tensor of rank + 1 on each of n ranks reduces to with op."""
    value = float(OPS[op]([rank + 1 for rank in range(n)]))
    return [[value, value], [value, value]]


def _note_workarounds(e: Expect, ranks: Mapping[int, Mapping[str, Any]]) -> None:
    """A program that met an unsupported op says so: pass it on as a note."""
    for result in ranks.values():
        if "unsupported" in result:
            text = f"{result['unsupported']}; the tutorial's workaround was used: {result.get('workaround')}"
            e.note(" ".join(text.split()))


def check_broadcast(results: Results, world: World) -> Verdict:
    """Every rank holds the source's [1, 2, 3] + 100 * src, for src 0 and the last rank."""
    e = Expect()
    n = world.world_size
    for rank, result in reported(e, results, world).items():
        for src in (0, n - 1):
            e.equal(rank, f"broadcast from rank {src}", [1.0 + 100 * src, 2.0 + 100 * src, 3.0 + 100 * src],
                    result.get(f"from_{src}"))
    return e.verdict()


def check_reduce(results: Results, world: World) -> Verdict:
    """Rank 0 holds each operator's reduction of rank + 1; the other ranks' tensors are undefined."""
    e = Expect()
    ranks = reported(e, results, world)
    if 0 in ranks:
        for op in OPS:
            e.equal(0, f"reduce {op} to rank 0", _reduced(op, world.world_size), ranks[0].get(op))
    return e.verdict()


def check_all_reduce(results: Results, world: World) -> Verdict:
    """Every rank holds each operator's reduction of rank + 1."""
    e = Expect()
    for rank, result in reported(e, results, world).items():
        for op in OPS:
            e.equal(rank, f"all_reduce {op}", _reduced(op, world.world_size), result.get(op))
    return e.verdict()


def check_scatter(results: Results, world: World) -> Verdict:
    """Rank i received piece i of rank 0's [10, 20, 30, ...]."""
    e = Expect()
    ranks = reported(e, results, world)
    _note_workarounds(e, ranks)
    for rank, result in ranks.items():
        e.equal(rank, "scatter from rank 0: piece received", [10.0 * (rank + 1)], result.get("received"))
    return e.verdict()


def check_gather(results: Results, world: World) -> Verdict:
    """Rank 0 holds [[0], [1], ..., [n - 1]]; the other ranks have no list."""
    e = Expect()
    ranks = reported(e, results, world)
    _note_workarounds(e, ranks)
    if 0 in ranks:
        e.equal(0, "gather to rank 0", [[float(r)] for r in range(world.world_size)], ranks[0].get("gathered"))
    return e.verdict()


def check_all_gather(results: Results, world: World) -> Verdict:
    """Every rank holds [[0], [1], ..., [n - 1]]."""
    e = Expect()
    for rank, result in reported(e, results, world).items():
        e.equal(rank, "all_gather", [[float(r)] for r in range(world.world_size)], result.get("gathered"))
    return e.verdict()


def check_reduce_scatter(results: Results, world: World) -> Verdict:
    """Rank i holds the sum over ranks r of 10**i * r (6, 60, 600, 6000 with 4 ranks)."""
    e = Expect()
    n = world.world_size
    ranks = reported(e, results, world)
    _note_workarounds(e, ranks)
    for rank, result in ranks.items():
        e.equal(rank, "reduce_scatter SUM: piece received", [sum(10 ** rank * r for r in range(n))],
                result.get("received"))
    return e.verdict()


def check_barrier(results: Results, world: World) -> Verdict:
    """No rank left the barrier before the last rank arrived (clocks within the tolerance)."""
    e = Expect()
    times: dict[int, tuple[float, float]] = {}
    for rank, result in reported(e, results, world).items():
        arrived, left = result.get("arrived"), result.get("left")
        if is_number(arrived) and is_number(left):
            times[rank] = (arrived, left)
        else:
            e.true(rank, "arrived and left (time.time())", False, expected="two numbers", got=[arrived, left])
    if len(times) == world.world_size:
        last = max(times, key=lambda r: times[r][0])
        start = min(arrived for arrived, _ in times.values())
        last_arrival = times[last][0]
        for rank, (_, left) in times.items():
            e.true(rank, f"left the barrier before rank {last} arrived (s after the first arrival)",
                   left >= last_arrival - BARRIER_TOLERANCE,
                   expected=f">= {last_arrival - start:.3f}", got=f"{left - start:.3f}")
    if len(set(world.hosts)) > 1:
        e.note(f"the ranks ran on {len(set(world.hosts))} hosts: the barrier check assumes "
               f"their clocks agree within {BARRIER_TOLERANCE * 1000:.0f} ms")
    return e.verdict()
