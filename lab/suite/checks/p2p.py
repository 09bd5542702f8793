"""Checkers of point-to-point exercises: 0 -> 1, then a pass around the ring."""
from __future__ import annotations

from lab.suite.check import Expect, Results, Verdict, World
from lab.suite.checks import reported


def check_p2p(results: Results, world: World) -> Verdict:
    """Blocking send/recv."""
    return _check_pair_and_ring(results, world, "send/recv")


def check_p2p_async(results: Results, world: World) -> Verdict:
    """Non-blocking isend/irecv + wait()."""
    return _check_pair_and_ring(results, world, "isend/irecv")


def _check_pair_and_ring(results: Results, world: World, how: str) -> Verdict:
    """Ranks 0 and 1 hold 1.0 after 0 -> 1 (the others keep 0.0); each rank got its left's rank."""
    e = Expect()
    n = world.world_size
    for rank, result in reported(e, results, world).items():
        e.equal(rank, f"{how} 0 -> 1: tensor", 1.0 if rank in (0, 1) else 0.0, result.get("pair"))
        left = (rank - 1) % n
        e.equal(rank, f"{how} ring: value received from rank {left} (its rank)", float(left), result.get("ring"))
    return e.verdict()
