"""A run's timeline as Chrome trace-event JSON (``--trace FILE``), which Perfetto (ui.perfetto.dev),
chrome://tracing and Chrome DevTools' performance panel open.

A process per rank ("rank 2 (node1)"), on two tracks: the torch.distributed calls its program made,
and the collectives torch issued itself (DDP's reducer, from C++). Every rank's times are put on the
controller's clock (each rank's offset, :attr:`RankState.clock`: the least difference seen between
when its progress events were sent, on its clock, and when they came), so ranks of several hosts line
up. A call still in flight when the run ended is drawn to that end; a blocked send or receive has an
arrow to the rank it waits for; the lab's verdict (a hang, a crash) is a mark across the ranks at the
run's end, with its headline and fix; ``otherData`` holds, on the same clock (microseconds from the
first call), when the hang finder found the ranks hung, when the first rank that failed was seen to, and
when the run ended with its verdict (``hang_found``, ``first_failure``, ``verdict``, where they happened:
``benchmarks/lab_speed.py`` times the verdicts from them). The records are the ranks' (untrusted: each is checked as
lab.rank.flightrecords checks a dump) from their ``trace`` events and last dump. No I/O but
:func:`write`'s (and this machine's clocks, read for a run where no rank said its own).
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from lab.core.outcome import RankState, RunOutcome
from lab.core.rankview import describe, named
from lab.rank.record import Record

PROGRAM, TORCH = 1, 2  # a rank's tracks: its program's calls, the collectives torch issued
MIN_DUR = 1.0  # microseconds drawn for a call whose end is not known (torch's, seen done at once)


def chrome_trace(outcome: RunOutcome) -> dict[str, Any]:
    """The run as a trace-event JSON object: ``{"traceEvents": [...], "displayTimeUnit": "ms", ...}``."""
    default = _default_clock(outcome.ranks)
    calls = {s.spec.rank: _calls(s) for s in outcome.ranks}
    clocks = {s.spec.rank: s.clock if s.clock is not None else default for s in outcome.ranks}
    times = [c.t0 + clocks[k] for k, cs in calls.items() for c in cs]
    start = min(times, default=0.0)
    end = max((max(c.t0, c.t1 or c.t0) + clocks[k] for k, cs in calls.items() for c in cs), default=start)

    def us(t: float, rank: int) -> float:
        return round((t + clocks[rank] - start) * 1e6, 1)

    events: list[dict[str, Any]] = []
    for state in outcome.ranks:
        rank = state.spec.rank
        events += [
            {"ph": "M", "pid": rank, "tid": PROGRAM, "name": "process_name",
             "args": {"name": f"rank {rank} ({state.spec.host})"}},
            {"ph": "M", "pid": rank, "tid": PROGRAM, "name": "process_sort_index", "args": {"sort_index": rank}},
            {"ph": "M", "pid": rank, "tid": PROGRAM, "name": "thread_name", "args": {"name": "the program's calls"}},
            {"ph": "M", "pid": rank, "tid": TORCH, "name": "thread_name",
             "args": {"name": "collectives torch issued (DDP)"}}]
        if state.trace_dropped:
            events.append({"ph": "i", "s": "p", "pid": rank, "tid": PROGRAM, "ts": 0, "name": "calls left out",
                           "args": {"calls": state.trace_dropped}})
        for call in calls[rank]:
            ts = us(call.t0, rank)
            done = call.t1 if call.t1 is not None else (None if not call.pending else end - clocks[rank])
            dur = max(MIN_DUR, us(done, rank) - ts) if done is not None else MIN_DUR
            events.append({"ph": "X", "pid": rank, "tid": TORCH if call.by else PROGRAM, "ts": ts, "dur": dur,
                           "name": named(call) + (" (in flight at the end)" if call.pending else ""),
                           "cat": call.direction, "args": _args(call)})
    events += _waits(calls, us)
    if outcome.cause is not None:
        events.append({"ph": "i", "s": "g", "pid": 0, "tid": PROGRAM, "ts": round((end - start) * 1e6, 1),
                       "name": f"lab: {outcome.cause.kind}",
                       "args": {"headline": outcome.cause.headline, "fix": outcome.cause.fix or ""}})
    moments = {"hang_found": outcome.hang_found, "first_failure": outcome.first_failure(), "verdict": outcome.ended_at}
    found = {name: round((t - start) * 1e6, 1) for name, t in moments.items() if t is not None}
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"status": outcome.status, "ranks": len(outcome.ranks), **found}}


def write(path: str, outcome: RunOutcome) -> None:
    """Write the run's trace to ``path``."""
    Path(path).write_text(json.dumps(chrome_trace(outcome)))


def _default_clock(ranks: list[RankState]) -> float:
    """The offset of a rank that sent no progress: the others' (most share its host's clock), else
    this machine's own between its two clocks."""
    known = [s.clock for s in ranks if s.clock is not None]
    return statistics.median(known) if known else time.monotonic() - time.time()


def _calls(state: RankState) -> list[Record]:
    """A rank's calls, the newest word on each: its trace records, then its last dump's."""
    found: dict[tuple[str, str, float], Record] = {}
    said = [*state.trace.values()]
    if state.flight is not None:
        said += [*state.flight.records.records, *state.flight.inflight.records]
    for call in said:
        found[(call.group, call.op, call.t0)] = call  # (its number may have moved: the newest says)
    return sorted(found.values(), key=lambda c: c.t0)


def _args(call: Record) -> dict[str, Any]:
    said = {"call": describe(call), "state": call.state, "where": call.where, "caller": call.caller,
            "group": call.group, "seq": call.seq, "error": call.error, "issued by": call.by}
    return {k: v for k, v in said.items() if v is not None}


def _waits(calls: dict[int, list[Record]], us: Any) -> list[dict[str, Any]]:
    """An arrow from each send or receive still in flight to the call its peer is in, when it is in one.
    (Each end of an arrow has the time, rank, track and category of the call it starts or ends on:
    DevTools binds it to that call alone, Perfetto to the call around it.)"""
    arrows: list[dict[str, Any]] = []
    for rank, made in calls.items():
        for call in made:
            if not (call.pending and call.direction in ("send", "recv") and call.peer in calls and call.peer != rank):
                continue
            theirs = next((c for c in reversed(calls[call.peer]) if c.pending), None)
            if theirs is None:
                continue
            n = len(arrows) // 2
            arrows += [{"ph": "s", "id": n, "pid": rank, "tid": TORCH if call.by else PROGRAM, "ts": us(call.t0, rank),
                        "cat": call.direction, "name": "waits for"},
                       {"ph": "f", "bp": "e", "id": n, "pid": call.peer, "tid": TORCH if theirs.by else PROGRAM,
                        "ts": us(theirs.t0, call.peer), "cat": theirs.direction, "name": "waits for"}]
    return arrows
