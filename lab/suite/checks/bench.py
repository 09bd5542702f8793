"""Checker of the bench (``python -m lab bench``): every rank measured the same ops and sizes, and
every checked call came out right (no ``#wrong``), unless the backend lacks the op.

The rings it times (a student's with ``--solution``) are held to what makes their times mean
anything: :func:`check_ring_calls` fails a ring that called a collective (its time would be
gloo's), and notes the bytes each one sent, as the ring-allreduce exercise does."""
from __future__ import annotations

from typing import Any

from lab.suite.check import Expect, Mismatch, Results, Verdict, World, ranks_named
from lab.suite.checks import is_number, reported
from lab.suite.checks.ring import FUNCTIONS, check_ring_traffic
from lab.suite.method import P2P, P2P_NAMES, SYNC, Calls, function_summary


def rows_of(result: Any) -> list[dict[str, Any]] | None:
    """A rank's rows (op, count, bytes, seconds, wrong or unsupported), if they are rows."""
    rows = result.get("rows") if isinstance(result, dict) else None
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and isinstance(r.get("op"), str) and is_number(r.get("bytes"))
            and (isinstance(r.get("unsupported"), str) or (is_number(r.get("seconds")) and is_number(r.get("wrong"))))
            for r in rows):
        return None
    return rows


def tcp_of(result: Any) -> dict[str, Any] | None:
    """A rank's raw TCP baseline (hosts, rtt, bytes, seconds), if it reports one."""
    tcp = result.get("tcp") if isinstance(result, dict) else None
    if not (isinstance(tcp, dict) and all(is_number(tcp.get(k)) and tcp[k] > 0 for k in ("rtt", "bytes", "seconds"))
            and isinstance(tcp.get("hosts"), list)):
        return None
    return tcp


def check_bench(results: Results, world: World) -> Verdict:
    e = Expect()
    ranks = reported(e, results, world)
    shapes = {}
    for rank, result in ranks.items():
        rows = rows_of(result)
        if not e.true(rank, "rows", rows is not None, expected="a row per op and size", got=str(result)[:200]):
            continue
        assert rows is not None
        shapes[rank] = [(r["op"], r["bytes"]) for r in rows]
        for row in rows:
            if "unsupported" in row:
                e.note(f"{row['op']} is not supported here: {row['unsupported']}")
            else:
                e.equal(rank, f"#wrong of {row['op']} on {row['bytes']} bytes", 0, row["wrong"])
    baselines = [rank for rank, result in ranks.items() if isinstance(result, dict) and "tcp" in result]
    e.true(None, "the TCP baseline", len(baselines) == 1 and tcp_of(ranks[baselines[0]]) is not None,
           expected="one rank's round trip and stream", got=str([ranks[r].get("tcp") for r in baselines])[:200])
    first = next(iter(shapes.values()), None)
    for rank, shape in shapes.items():
        e.equal(rank, "the ops and sizes measured", first, shape)
    return e.verdict()


def check_ring_calls(calls: Calls, world: World) -> Verdict:
    """The rings timed: nothing but point-to-point calls inside them (a failure names the rest),
    and a note of the bytes each rank sent inside each one, per byte of its tensor."""
    mismatches: list[Mismatch] = []
    callers: dict[tuple[str, str], list[int]] = {}  # (function, its calls) -> the ranks that made them
    for rank in range(world.world_size):
        for function, label in FUNCTIONS.items():
            inside = function_summary(calls.get(rank), function)
            made = inside.counts if inside is not None else None
            wrong = sorted(n for n in made or {} if n not in P2P | SYNC)
            if made and wrong:
                callers.setdefault((label, ", ".join(wrong)), []).append(rank)
                mismatches.append(Mismatch(rank, f"calls inside {label}", f"only {P2P_NAMES}",
                                           ", ".join(f"{n} x{made[n]}" for n in wrong)))
    reason = "; ".join(f"{label} called {names} on {ranks_named(ranks)}: its time is gloo's, not a ring's "
                       f"(a ring is built from {P2P_NAMES})" for (label, names), ranks in callers.items())
    traffic = check_ring_traffic(calls, world)
    notes = traffic.notes + ((traffic.reason,) if traffic.reason else ())
    return Verdict(not mismatches, reason, tuple(mismatches), notes)
