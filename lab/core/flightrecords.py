"""A rank's flight records (lab.rank.flight) read as what they are: untrusted data.

A rank runs a student's program, which can write anything on the rank's channel, so nothing in
a flight dump is taken on trust: every record is checked field by field (against the one schema of
a record, ``lab.rank.record``), and one that fails is skipped whole, never half-used (a bogus size
would name a wrong cause), and counted with the reason in a note. The lists are read up to
RECORDS_MAX entries (the newest), the counts up to COUNTS_MAX groups and ops, every text is cut
at TEXT_MAX characters and made printable. Nothing here raises on any input.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from lab.core.text import printable
from lab.rank.ops import canonical
from lab.rank.record import INT_MAX, Record, from_wire

RECORDS_MAX = 1024  # records read of each list (a ring holds 64, the calls in flight 256 at most)
COUNTS_MAX = 256  # groups read of a rank's counts, and ops of each group
TEXT_MAX = 160  # characters kept of a text field (an op, a file:line, an error)
GROUP_MAX = 4096  # characters kept of a group's id ("g0,1,2#0" names its ranks: a thousand fit)


def text(value: str, limit: int = TEXT_MAX) -> str:
    """Untrusted text as shown: its first line, cut at ``limit`` characters, made printable."""
    line = value.strip().split("\n", 1)[0]
    return printable(line[:limit] + ("..." if len(line) > limit else ""))


def _is_int(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= INT_MAX


def _field_text(name: str, value: str) -> str:
    return text(value, GROUP_MAX if name == "group" else TEXT_MAX)


def read_record(raw: object) -> Record | str:
    """A record as a Record (``lab.rank.record``'s schema), its texts as shown, or why it is skipped
    (the name of its first malformed field)."""
    return from_wire(raw, _field_text)


def read_calls(records: object, inflight: object, who: str, notes: list[str]) -> list[Record]:
    """Every valid record of a rank's dump, one per group, sequence number and kind (collective or
    point to point, which may be numbered apart), where a record is in both lists the one that says
    more (done or raised over waiting over in flight), oldest first. What is skipped is said in
    ``notes`` (``who``: "rank 2")."""
    skipped: Counter[str] = Counter()
    calls: dict[tuple[str, int, bool], Record] = {}
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
