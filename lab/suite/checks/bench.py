"""Checker of the bench (``python -m lab bench``): every rank measured the same ops and sizes, and
every checked call came out right (no ``#wrong``), unless the backend lacks the op."""
from __future__ import annotations

from typing import Any

from lab.suite.check import Expect, Results, Verdict, World
from lab.suite.checks import is_number, reported


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
