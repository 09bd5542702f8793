"""A rank's flight records (lab.rank.flight) read as what they are: untrusted data.

A rank runs a student's program, which can write anything on the rank's channel, so nothing in
a flight dump is taken on trust: every record is checked field by field (the types and ranges of
the format lab.rank.flight writes), and one that fails is skipped whole, never half-used (a bogus size
would name a wrong cause), and counted with the reason in a note. The lists are read up to
RECORDS_MAX entries (the newest), the counts up to COUNTS_MAX groups and ops, every text is cut
at TEXT_MAX characters and made printable. Nothing here raises on any input.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from lab.core.text import printable
from lab.rank.ops import BATCHES, RECEIVES, SENDS, canonical

RECORDS_MAX = 1024  # records read of each list (a ring holds 64, the calls in flight 256 at most)
COUNTS_MAX = 256  # groups read of a rank's counts, and ops of each group
SHAPE_MAX = 16  # dimensions of a shape
TEXT_MAX = 160  # characters kept of a text field (an op, a file:line, an error)
GROUP_MAX = 4096  # characters kept of a group's id ("g0,1,2#0" names its ranks: a thousand fit)
INT_MAX = 1 << 62  # larger numbers are no sizes, ranks or tags of a real call
STATES = ("in_flight", "waiting", "done", "raised")  # a tuple: `in` must not hash what a rank sent


Direction = Literal["send", "recv", "batch", "collective"]


@dataclass(frozen=True)
class Call:
    """One checked record: a torch.distributed call a rank made (as lab.rank.flight records it)."""

    group: str
    seq: int
    op: str
    state: str  # in_flight, waiting (inside Work.wait()), done, raised
    t0: float
    t1: float | None = None
    numel: int | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    peer: int | None = None  # the other global rank of a send or receive; None: any source
    root: int | None = None
    tag: int | None = None
    reduce_op: str | None = None
    is_async: bool = False
    where: str | None = None
    error: str | None = None
    by: str | None = None  # who issued a collective the program did not call itself ("DDP's gradient")
    world_size: int | None = None  # init_process_group's: the world size the program gave it
    caller: str | None = None  # for one torch issued: the program's line, in another file, that led to ``where``

    @property
    def direction(self) -> Direction:
        if self.op in SENDS:
            return "send"
        if self.op in RECEIVES:
            return "recv"
        return "batch" if self.op in BATCHES else "collective"

    @property
    def pending(self) -> bool:
        return self.state in ("in_flight", "waiting")

    @property
    def blocking(self) -> bool:
        """The rank is inside it now: a blocking call in flight, or a wait() on an async one."""
        return self.state == "waiting" or (self.state == "in_flight" and not self.is_async)


def _is_int(value: object, low: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= INT_MAX


def _is_time(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def text(value: str, limit: int = TEXT_MAX) -> str:
    """Untrusted text as shown: its first line, cut at ``limit`` characters, made printable."""
    line = value.strip().split("\n", 1)[0]
    return printable(line[:limit] + ("..." if len(line) > limit else ""))


def _shape(value: object) -> tuple[int, ...] | None | str:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > SHAPE_MAX or not all(_is_int(d, 0) for d in value):
        return "shape"
    return tuple(value)


def _optional(raw: dict[Any, Any]) -> dict[str, Any] | str:
    """The optional fields of a record, checked; or the name of the first that is malformed."""
    found: dict[str, Any] = {}
    for name, low in (("numel", 0), ("peer", 0), ("root", 0), ("tag", -INT_MAX), ("world_size", 1)):
        value = raw.get(name)
        if value is not None and not _is_int(value, low):
            return name
        found[name] = value
    for name in ("dtype", "reduce_op", "where", "error", "by", "caller"):
        value = raw.get(name)
        if value is not None and not isinstance(value, str):
            return name
        found[name] = text(value) if value else None
    shape = _shape(raw.get("shape"))
    if isinstance(shape, str):
        return shape
    is_async, t1 = raw.get("async", False), raw.get("t1")
    if not isinstance(is_async, bool):
        return "async"
    if t1 is not None and not _is_time(t1):
        return "t1"
    return {**found, "shape": shape, "is_async": is_async, "t1": t1}


def read_record(raw: object) -> Call | str:
    """A record as a Call, or why it is skipped (the name of its first malformed field)."""
    if not isinstance(raw, dict):
        return "not an object"
    seq, group, op, state, t0 = (raw.get(k) for k in ("seq", "group", "op", "state", "t0"))
    if not _is_int(seq, 1):
        return "seq"
    if not isinstance(group, str) or not group.strip():
        return "group"
    if not isinstance(op, str) or not op.strip():
        return "op"
    if not isinstance(state, str) or state not in STATES:
        return "state"
    if not _is_time(t0):
        return "t0"
    optional = _optional(raw)
    if isinstance(optional, str):
        return optional
    return Call(text(group, GROUP_MAX), seq, text(op), state, float(t0), **optional)


def read_calls(records: object, inflight: object, who: str, notes: list[str]) -> list[Call]:
    """Every valid record of a rank's dump, one per group, sequence number and kind (collective or
    point to point, which may be numbered apart), where a record is in both lists the one that says
    more (done or raised over waiting over in flight), oldest first. What is skipped is said in
    ``notes`` (``who``: "rank 2")."""
    skipped: Counter[str] = Counter()
    calls: dict[tuple[str, int, bool], Call] = {}
    for name, given in (("records", records), ("inflight", inflight)):
        if given is None:
            continue
        if not isinstance(given, list):
            notes.append(f"{who}: its flight {name} are not a list: skipped")
            continue
        if len(given) > RECORDS_MAX:
            notes.append(f"{who}: {len(given)} flight {name}: the oldest {len(given) - RECORDS_MAX} skipped")
        for raw in given[-RECORDS_MAX:]:
            call = read_record(raw)
            if isinstance(call, str):
                skipped[call] += 1
                continue
            key = (call.group, call.seq, call.direction == "collective")
            if key not in calls or _rank_of(call.state) >= _rank_of(calls[key].state):
                calls[key] = call
    if skipped:
        reasons = ", ".join(f"{n} {'not an object' if why == 'not an object' else 'with a bad ' + why}"
                            for why, n in sorted(skipped.items()))
        notes.append(f"{who}: {sum(skipped.values())} malformed flight records skipped ({reasons})")
    return sorted(calls.values(), key=lambda c: (c.t0, c.group, c.seq))


def _rank_of(state: str) -> int:
    return {"in_flight": 0, "waiting": 1}.get(state, 2)


def read_counts(counts: object, who: str, notes: list[str]) -> dict[str, Counter[str]] | None:
    """A rank's completed calls per group and op (ops by their :func:`canonical` name), or None
    where it sent none; malformed entries are skipped and said in ``notes``."""
    if counts is None:
        return None
    if not isinstance(counts, dict):
        notes.append(f"{who}: its call counts are not an object: skipped")
        return None
    found: dict[str, Counter[str]] = {}
    bad = 0
    for group, ops in list(counts.items())[:COUNTS_MAX]:
        if not isinstance(group, str) or not isinstance(ops, dict):
            bad += 1
            continue
        tally = found.setdefault(text(group, GROUP_MAX), Counter())
        for op, n in list(ops.items())[:COUNTS_MAX]:
            if isinstance(op, str) and op and _is_int(n, 0):
                tally[canonical(text(op))] += n
            else:
                bad += 1
    if bad or len(counts) > COUNTS_MAX:
        notes.append(f"{who}: malformed or too many call counts skipped")
    return found


@dataclass(frozen=True)
class StepMark:
    """One of a DDP program's training steps as a rank recorded it: a forward of its DDP model or a
    backward pass (lab.rank.flight's ``steps``)."""

    n: int  # its number among the rank's forwards and backward passes, from 1
    kind: Literal["forward", "backward"]
    sync: bool | None  # a forward: whether it syncs the gradients (False under no_sync()); None for a backward
    where: str


def read_steps(steps: object, who: str, notes: list[str]) -> tuple[StepMark, ...] | None:
    """A rank's steps, oldest first (None where it sent none); malformed ones are skipped, counted in
    ``notes``."""
    if steps is None:
        return None
    if not isinstance(steps, list):
        notes.append(f"{who}: its steps are not a list: skipped")
        return None
    read: dict[int, StepMark] = {}
    bad = 0
    for raw in steps[-RECORDS_MAX:]:
        if not (isinstance(raw, list) and len(raw) == 4 and _is_int(raw[0], 1) and raw[1] in ("forward", "backward")
                and (raw[2] is None or isinstance(raw[2], bool)) and isinstance(raw[3], str)):
            bad += 1
            continue
        read[raw[0]] = StepMark(raw[0], raw[1], raw[2] if raw[1] == "forward" else None, text(raw[3]))
    if bad:
        notes.append(f"{who}: {bad} malformed steps skipped")
    return tuple(read[n] for n in sorted(read))
