"""What a rank's recorder sends (``lab.rank.flight``) read as what it is: untrusted data, made into
the types the events hold (``lab.rank.events``: a ``flight`` event's records, counts, steps, groups
made and the timeouts they were given, the files saved and missed; a ``progress`` event's call in
flight, a ``died`` event's call).

A rank runs a student's program, which can write anything on the rank's channel, so nothing in
a flight dump is taken on trust: every record is checked field by field (against the one schema of
a record, ``lab.rank.record``), and one that fails is skipped whole, never half-used (a bogus size
would name a wrong cause), and counted with the reason, which the analysis says in a note. The
lists are read up to RECORDS_MAX entries (the newest), the counts up to COUNTS_MAX groups and ops,
every text is cut at TEXT_MAX characters and made printable. Nothing here raises on any input.

Standard library only: the zygote checks its ranks' events on the host.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from lab.rank.ops import canonical
from lab.rank.record import INT_MAX, Record, from_wire
from lab.rank.text import printable

RECORDS_MAX = 1024  # records read of each list (a ring holds 64, the calls in flight 256 at most)
COUNTS_MAX = 256  # groups read of a rank's counts, and ops of each group
TEXT_MAX = 160  # characters kept of a text field (an op, a file:line, an error)
GROUP_MAX = 4096  # characters kept of a group's id ("g0,1,2#0" names its ranks: a thousand fit)
PATH_MAX = 4096  # characters of a file's path (a longer one is skipped: cut, it would name another file)


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


@dataclass(frozen=True)
class Calls:
    """A list of flight records as a rank sent it, read: the valid ones of its newest RECORDS_MAX, in
    its order, and what was refused."""

    records: tuple[Record, ...] = ()
    sent: int = 0  # entries the list held
    refused: tuple[tuple[str, int], ...] = ()  # (why: its first malformed field, or "not an object"; how many)

    def of_the_program(self) -> Calls:
        """These calls but the lab's own (made at ``lab/...``: the worker's barriers)."""
        return Calls(tuple(r for r in self.records if not (r.where or "").startswith("lab/")), self.sent, self.refused)


def read_calls(raw: list[object]) -> Calls:
    """A list of records as a rank sent it (see :class:`Calls`)."""
    refused: Counter[str] = Counter()
    records = []
    for entry in raw[-RECORDS_MAX:]:
        call = read_record(entry)
        if isinstance(call, str):
            refused[call] += 1
        else:
            records.append(call)
    return Calls(tuple(records), len(raw), tuple(sorted(refused.items())))


def merged(lists: dict[str, Calls], who: str, notes: list[str]) -> list[Record]:
    """Every call of a rank's lists (by name: "records", "inflight"), one per group, sequence number
    and kind (collective or point to point, which may be numbered apart), where a call is in more than
    one the record that says more (done or raised over waiting over in flight), oldest first. What
    was skipped is said in ``notes`` (``who``: "rank 2")."""
    refused: Counter[str] = Counter()
    calls: dict[tuple[str, int, bool], Record] = {}
    for name, given in lists.items():
        if given.sent > RECORDS_MAX:
            notes.append(f"{who}: {given.sent} flight {name}: the oldest {given.sent - RECORDS_MAX} skipped")
        refused.update(dict(given.refused))
        for call in given.records:
            key = (call.group, call.seq, call.direction == "collective")
            if key not in calls or _rank_of(call.state) >= _rank_of(calls[key].state):
                calls[key] = call
    if refused:
        reasons = ", ".join(f"{n} {'not an object' if why == 'not an object' else 'with a bad ' + why}"
                            for why, n in sorted(refused.items()))
        notes.append(f"{who}: {sum(refused.values())} malformed flight records skipped ({reasons})")
    return sorted(calls.values(), key=lambda c: (c.t0, c.group, c.seq))


def _rank_of(state: str) -> int:
    return {"in_flight": 0, "waiting": 1}.get(state, 2)


@dataclass(frozen=True)
class Counts:
    """A rank's completed calls per group and op (ops by their :func:`canonical` name), as read."""

    by_group: dict[str, Counter[str]] = field(default_factory=dict)
    malformed: bool = False  # entries were skipped: malformed, or past COUNTS_MAX


def read_counts(counts: dict[object, object]) -> Counts:
    """A rank's counts as it sent them (``{group: {op: completed calls}}``); malformed entries are
    skipped."""
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
    return Counts(found, bool(bad) or len(counts) > COUNTS_MAX)


@dataclass(frozen=True)
class StepMark:
    """One of a DDP program's training steps as a rank recorded it: a forward of its DDP model or a
    backward pass (lab.rank.flight's ``steps``)."""

    n: int  # its number among the rank's forwards and backward passes, from 1
    kind: Literal["forward", "backward"]
    sync: bool | None  # a forward: whether it syncs the gradients (False under no_sync()); None for a backward
    where: str


@dataclass(frozen=True)
class Steps:
    """A rank's steps as read, oldest first, and how many were skipped as malformed."""

    marks: tuple[StepMark, ...] = ()
    malformed: int = 0


def read_steps(steps: list[object]) -> Steps:
    """A rank's steps as it sent them (``[n, kind, sync, where]`` each); malformed ones are skipped."""
    read: dict[int, StepMark] = {}
    bad = 0
    for raw in steps[-RECORDS_MAX:]:
        if not (isinstance(raw, list) and len(raw) == 4 and _is_int(raw[0], 1) and raw[1] in ("forward", "backward")
                and (raw[2] is None or isinstance(raw[2], bool)) and isinstance(raw[3], str)):
            bad += 1
            continue
        read[raw[0]] = StepMark(raw[0], raw[1], raw[2] if raw[1] == "forward" else None, text(raw[3]))
    return Steps(tuple(read[n] for n in sorted(read)), bad)


@dataclass(frozen=True)
class GroupMade:
    """One of the groups a rank made, as it recorded it (lab.rank.flight's ``made``): the n-th
    ``new_group`` it called since the world formed, a member of the group or not."""

    n: int  # from 1
    members: tuple[int, ...]  # the group's global ranks, sorted
    where: str


@dataclass(frozen=True)
class GroupsMade:
    """The groups a rank made as read, in the order it made them, and how many were skipped as malformed."""

    groups: tuple[GroupMade, ...] = ()
    malformed: int = 0


MEMBERS_MAX = 1 << 10  # ranks of a group made (a rank records no larger one: lab.rank.flight)


def read_made(made: list[object]) -> GroupsMade:
    """The groups a rank made as it sent them (``[n, members, where]`` each); malformed ones are skipped."""
    read: dict[int, GroupMade] = {}
    bad = 0
    for raw in made[:RECORDS_MAX]:
        if not (isinstance(raw, list) and len(raw) == 3 and _is_int(raw[0], 1) and isinstance(raw[1], list)
                and len(raw[1]) <= MEMBERS_MAX and all(_is_int(k, 0) for k in raw[1]) and isinstance(raw[2], str)):
            bad += 1
            continue
        read[raw[0]] = GroupMade(raw[0], tuple(sorted(raw[1])), text(raw[2]))
    return GroupsMade(tuple(read[n] for n in sorted(read)), bad)


@dataclass(frozen=True)
class GroupTimeout:
    """The timeout a rank's program gave a group (``timeout=`` of ``init_process_group`` for the world,
    of ``new_group`` for another), as it recorded it (lab.rank.flight's ``timeouts``)."""

    group: str  # the group's id, as its records name it ("world", "g0,1#0")
    seconds: float
    where: str  # where the program gave it ("file.py:LINE")


@dataclass(frozen=True)
class GroupTimeouts:
    """The timeouts a rank's program gave its groups, as read, and how many were skipped as malformed."""

    timeouts: tuple[GroupTimeout, ...] = ()
    malformed: int = 0

    def of(self, group: str) -> GroupTimeout | None:
        """The timeout given to ``group`` (None: none was, as far as the rank recorded)."""
        return next((t for t in self.timeouts if t.group == group), None)


def read_timeouts(timeouts: list[object]) -> GroupTimeouts:
    """The timeouts a rank's program gave its groups as it sent them (``[group, seconds, where]`` each);
    malformed ones are skipped."""
    read: list[GroupTimeout] = []
    bad = 0
    for raw in timeouts[:RECORDS_MAX]:
        if not (isinstance(raw, list) and len(raw) == 3 and isinstance(raw[0], str)
                and isinstance(raw[1], (int, float)) and not isinstance(raw[1], bool)
                and 0 < raw[1] < INT_MAX and isinstance(raw[2], str)):
            bad += 1
            continue
        read.append(GroupTimeout(text(raw[0], GROUP_MAX), float(raw[1]), text(raw[2])))
    return GroupTimeouts(tuple(read), bad)


@dataclass(frozen=True)
class FileSeen:
    """A file a rank's program saved (torch.save) or looked for in vain (torch.load), as it recorded it
    (lab.rank.files)."""

    kind: Literal["saved", "missing"]
    path: str  # absolute, on the rank's host
    where: str  # the program's line ("file.py:LINE")
    at: float  # the rank's clock (time.time()) as it saved it or looked


@dataclass(frozen=True)
class FilesSeen:
    """The files a rank's program saved and missed, as read, and how many were skipped as malformed."""

    files: tuple[FileSeen, ...] = ()
    malformed: int = 0

    def of(self, kind: Literal["saved", "missing"]) -> tuple[FileSeen, ...]:
        return tuple(f for f in self.files if f.kind == kind)


def read_files(files: list[object]) -> FilesSeen:
    """The files as a rank sent them (``[kind, path, where, at]`` each); malformed ones are skipped."""
    read: list[FileSeen] = []
    bad = 0
    for raw in files[:RECORDS_MAX]:
        if not (isinstance(raw, list) and len(raw) == 4 and raw[0] in ("saved", "missing")
                and isinstance(raw[1], str) and raw[1].startswith("/") and len(raw[1]) <= PATH_MAX
                and raw[1] == printable(raw[1]) and isinstance(raw[2], str)
                and isinstance(raw[3], (int, float)) and not isinstance(raw[3], bool) and 0 <= raw[3] < INT_MAX):
            bad += 1
            continue
        read.append(FileSeen(raw[0], raw[1], text(raw[2]), float(raw[3])))
    return FilesSeen(tuple(read), bad)
