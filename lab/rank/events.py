"""What the events of the run say, as the controller (and the zygote, which checks its ranks') takes
them: a frozen class a kind, whose fields are those the table of ``lab.rank.protocol`` gives, checked
as a line is parsed (:func:`parse_event`); the probe's events (facts, runtime, links, heard, closed)
come as a :class:`Probe` holding their fields, which the doctor's checks read.

Apart from ``lab.rank.protocol``, which every process the lab starts on a host imports (a rank's
relay too) and which stays light: making these classes costs tens of milliseconds a process.

Standard library only: the zygote checks its ranks' events on the host.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, ClassVar, Final, Literal, TypeAlias

from lab.rank.flightrecords import (
    Calls,
    Counts,
    FilesSeen,
    GroupsMade,
    GroupTimeouts,
    Steps,
    read_calls,
    read_counts,
    read_files,
    read_made,
    read_record,
    read_steps,
    read_timeouts,
    text,
)
from lab.rank.protocol import EVENT_KINDS, EVENT_MAX, MARK
from lab.rank.record import Record


class MalformedEvent(ValueError):
    """A line marked as an event of this run that is not one: bad JSON, no known ``event``, a field
    missing, unknown or of the wrong type."""


# The events as the controller takes them: a frozen class a kind, whose fields (their names and types)
# are what :func:`check_event` asks of an event of that kind; one with a default may be left out.
# Who sends an event of a kind: a rank (or its relay, on the rank's channel); a host's launcher, of one of
# its ranks; a host's launcher of its own (the lab's: ``wire``, which no rank can send: the launcher drops
# it); the port holder; a host's launcher in its preflight; the doctor's probe.
Sender = Literal["rank", "launcher", "host", "holder", "preflight", "probe"]
PortNumbers: TypeAlias = tuple[int, ...]  # (a ``ports`` event's list, each checked to be a TCP port)
RankNumbers: TypeAlias = tuple[int, ...]  # (a list of ranks, each checked to be 0 or more)


@dataclass(frozen=True)
class Event:
    """An event of the run, its fields checked (:func:`parse_event`)."""

    KIND: ClassVar[str] = ""
    SENDER: ClassVar[Sender] = "rank"

    @property
    def kind(self) -> str:
        return self.KIND


@dataclass(frozen=True)
class RankEvent(Event):
    """An event of one rank's (or, ``exit``, ``bad`` and ``wire``, its host's launcher's about it)."""

    rank: int


@dataclass(frozen=True)
class Hello(RankEvent):
    KIND: ClassVar[str] = "hello"
    pid: int
    hostname: str
    local_rank: int
    python: str = ""
    torch: str = ""
    restart: int = 0  # torchrun's count of the times it restarted the ranks (TORCHELASTIC_RESTART_COUNT)


@dataclass(frozen=True)
class Step(RankEvent):
    KIND: ClassVar[str] = "step"
    step: str


@dataclass(frozen=True)
class Result(RankEvent):
    KIND: ClassVar[str] = "result"
    exercise: str
    value: object
    seconds: float
    calls: dict[str, Any] | None = None  # its calls summary (lab.rank.calls), read where it is judged: Recorded


@dataclass(frozen=True)
class Error(RankEvent):
    KIND: ClassVar[str] = "error"
    exercise: str
    error: str
    where: str
    traceback: str
    calls: dict[str, Any] | None = None  # its calls summary (lab.rank.calls), read where it is judged: Recorded


@dataclass(frozen=True)
class Fatal(RankEvent):
    KIND: ClassVar[str] = "fatal"
    error: str
    traceback: str


@dataclass(frozen=True)
class Done(RankEvent):
    KIND: ClassVar[str] = "done"
    failures: int


# (the records of progress, flight, trace and died are read as lab.rank.flightrecords reads them: a malformed
# record in a list is skipped, and counted; the one of a progress or died event makes the event malformed)
@dataclass(frozen=True)
class Progress(RankEvent):
    KIND: ClassVar[str] = "progress"
    completed: int
    inflight: Record | None
    moved: int
    quiet: float
    at: float = 0.0  # the rank's clock (time.time()) as it sent it: the controller puts the ranks on one clock


@dataclass(frozen=True)
class Flight(RankEvent):
    KIND: ClassVar[str] = "flight"
    records: Calls
    inflight: Calls
    counts: Counts
    dropped: int
    steps: Steps | None = None  # a DDP program's last forwards and backward passes (lab.rank.flight)
    made: GroupsMade | None = None  # the groups the rank made since the world formed, in order (lab.rank.flight)
    destroyed: str | None = None  # where its program destroyed the world ("file.py:LINE"), if it did
    timeouts: GroupTimeouts | None = None  # the timeouts its program gave its groups, and where (lab.rank.flight)
    files: FilesSeen | None = None  # the files its program saved and looked for in vain (lab.rank.files)


@dataclass(frozen=True)
class Trace(RankEvent):
    KIND: ClassVar[str] = "trace"
    records: Calls
    dropped: int  # calls that began and left the recorder's ring before a trace event took them


@dataclass(frozen=True)
class TorchDump(RankEvent):
    KIND: ClassVar[str] = "torchdump"
    dump: dict[str, Any]  # torch's flight recorder as it dumps itself (JSON; lab.rank.torchfr)


@dataclass(frozen=True)
class Died(RankEvent):
    KIND: ClassVar[str] = "died"
    call: Record | None  # the call the rank was in as it died, a flight record (lab.rank.lastcall)
    oom: str = ""  # the kernel's line that it killed the rank for memory, where the host let the relay read it


@dataclass(frozen=True)
class End(RankEvent):
    KIND: ClassVar[str] = "end"
    how: str
    code: int
    error: str
    where: str
    traceback: str


@dataclass(frozen=True)
class Exit(RankEvent):
    KIND: ClassVar[str] = "exit"
    SENDER: ClassVar[Sender] = "launcher"
    code: int


@dataclass(frozen=True)
class Bad(RankEvent):
    KIND: ClassVar[str] = "bad"
    SENDER: ClassVar[Sender] = "launcher"
    what: str


@dataclass(frozen=True)
class Saved(RankEvent):
    KIND: ClassVar[str] = "saved"
    path: str  # a file torch.save wrote, absolute on the rank's host (lab.rank.saves)
    size: int  # its size once written


@dataclass(frozen=True)
class Cell(RankEvent):
    KIND: ClassVar[str] = "cell"
    n: int  # the cell's number in the session (lab.rank.cells)
    name: str  # its name in the notebook ("cell [7]": its code's file name)
    ended: bool  # false as it begins, true once it ended
    ranks: RankNumbers  # the ranks it was sent to
    error: str = ""  # once ended: the exception it raised ("Type: message"), "" where it raised none


@dataclass(frozen=True)
class Ports(Event):
    KIND: ClassVar[str] = "ports"
    SENDER: ClassVar[Sender] = "holder"
    ports: PortNumbers  # the ports it holds, each a TCP port (1-65535)


@dataclass(frozen=True)
class WireMeasure(RankEvent):
    KIND: ClassVar[str] = "wire"
    SENDER: ClassVar[Sender] = "host"
    carried: int
    lost: int
    error: str = ""
    failed: str = ""
    space: str = ""  # the network namespace whose every socket it counted (lab.rank.wire.space)


@dataclass(frozen=True)
class Alive(RankEvent):
    KIND: ClassVar[str] = "alive"
    cpu: float


@dataclass(frozen=True)
class Pulse(Event):
    KIND: ClassVar[str] = "pulse"
    SENDER: ClassVar[Sender] = "preflight"
    cpu: float


@dataclass(frozen=True)
class Probe(Event):
    """An event of the doctor's probe, or of a host's launcher in its preflight (facts, runtime, links,
    heard, closed): its fields as sent, which the doctor's own checks read (``lab.netcheck``)."""

    SENDER: ClassVar[Sender] = "probe"
    what: str
    fields: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.what


EVENT_TYPES: Final[dict[str, type[Event]]] = {cls.KIND: cls for cls in (
    Hello, Step, Result, Error, Fatal, Done, Progress, Flight, Trace, TorchDump, Died, End, Exit, Bad, Ports,
    WireMeasure, Alive, Pulse, Saved, Cell)}
PROBE_EVENTS: Final = EVENT_KINDS - set(EVENT_TYPES)


def parse_event(line: str, token: str) -> Event | None:
    """The event a line carries, if it is an event line of the run ``token``; None for any other
    line (a program's output). Raises :class:`MalformedEvent` for a marked line that is no valid
    event (see :func:`check_event`)."""
    prefix = f"{MARK}{token} "
    if not line.startswith(prefix):
        return None
    if len(line.encode("utf-8", "replace")) > EVENT_MAX:
        raise MalformedEvent(f"longer than {EVENT_MAX} bytes")
    try:
        event = json.loads(line[len(prefix):], parse_int=_bounded_int)
    except RecursionError:
        raise MalformedEvent("nested too deeply") from None
    except MalformedEvent:
        raise
    except ValueError as exc:
        raise MalformedEvent(f"not JSON: {exc}") from None
    return check_event(event)


INT_DIGITS = 19  # digits of the largest whole number an event may hold (any 64-bit integer's)


def _bounded_int(digits: str) -> int:
    """A whole number of an event line, bounded: a rank's sizes, counts, shapes and values are 64-bit
    numbers, and a larger one (10**400) would be the overflow of every check that computes with it."""
    if len(digits.lstrip("-")) > INT_DIGITS:
        raise MalformedEvent(f"it holds a number of {len(digits.lstrip('-'))} digits (at most {INT_DIGITS})")
    return int(digits)


def check_event(event: Any) -> Event:
    """The event a decoded event line holds. Raises :class:`MalformedEvent` unless it is an object with
    a known ``event`` and exactly the fields of its kind's class (those with a default may be left out),
    each of its type."""
    if not isinstance(event, dict):
        raise MalformedEvent(f"not an object but {_kind_of(event)}")
    kind = event.get("event")
    if not isinstance(kind, str) or kind not in EVENT_KINDS:
        raise MalformedEvent(f"no known 'event' (got {_short(kind)})")
    cls = EVENT_TYPES.get(kind)
    if cls is None:
        return Probe(kind, {name: value for name, value in event.items() if name != "event"})
    fields = _FIELDS[cls]
    unknown = sorted(name for name in event if name != "event" and name not in fields)
    if unknown:
        raise MalformedEvent(f"a {kind!r} event has no field {_short(unknown[0])}")
    read: dict[str, Any] = {}
    for name, (type_, optional) in fields.items():
        if name not in event:
            if optional:
                continue
            raise MalformedEvent(f"a {kind!r} event without its {name!r}")
        value = _READERS[type_](event[name])
        if value is _REFUSED:
            raise MalformedEvent(f"the {name!r} of a {kind!r} event is {_kind_of(event[name])} "
                                 f"{_short(event[name])}, not {_TYPE_WORDS[type_]}")
        read[name] = value
    return cls(**read)


_REFUSED: Final = object()  # what a reader gives for a value that is not of its type


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(check: Callable[[Any], bool]) -> Callable[[Any], Any]:
    return lambda value: value if check(value) else _REFUSED


def _record(value: Any) -> Any:
    if value is None:
        return None
    found = read_record(value)
    return _REFUSED if isinstance(found, str) else found


# A field's type, as its class declares it -> its reader (the value as the event holds it, or _REFUSED),
# and what a value of it is, said in words
_READERS: Final[dict[str, Callable[[Any], Any]]] = {
    "int": _checked(_whole),
    "bool": _checked(lambda value: isinstance(value, bool)),
    "str": _checked(lambda value: isinstance(value, str)),
    "str | None": lambda value: None if value is None else text(value) if isinstance(value, str) else _REFUSED,
    "float": _checked(lambda value: (_whole(value) or isinstance(value, float)) and math.isfinite(value)),
    "object": lambda value: value,
    "PortNumbers": lambda value: tuple(value) if isinstance(value, list) and all(
        _whole(p) and 0 < p < 65536 for p in value) else _REFUSED,
    "RankNumbers": lambda value: tuple(value) if isinstance(value, list) and all(
        _whole(r) and r >= 0 for r in value) else _REFUSED,
    "dict[str, Any]": _checked(lambda value: isinstance(value, dict)),
    "dict[str, Any] | None": _checked(lambda value: value is None or isinstance(value, dict)),
    "Record | None": _record,
    "Calls": lambda value: read_calls(value) if isinstance(value, list) else _REFUSED,
    "Counts": lambda value: read_counts(value) if isinstance(value, dict) else _REFUSED,
    "Steps | None": lambda value: None if value is None else read_steps(value) if isinstance(value, list) else _REFUSED,
    "GroupsMade | None": lambda value: None if value is None else read_made(value) if isinstance(value, list)
    else _REFUSED,
    "GroupTimeouts | None": lambda value: None if value is None else read_timeouts(value) if isinstance(value, list)
    else _REFUSED,
    "FilesSeen | None": lambda value: None if value is None else read_files(value) if isinstance(value, list)
    else _REFUSED,
}
_TYPE_WORDS: Final[dict[str, str]] = {
    "int": "an integer", "bool": "true or false", "str": "a string", "str | None": "a string or null",
    "float": "a finite number", "object": "a value",
    "PortNumbers": "a list of TCP ports", "RankNumbers": "a list of ranks", "dict[str, Any]": "an object",
    "dict[str, Any] | None": "an object or null",
    "Record | None": "a flight record or null", "Calls": "a list of flight records", "Counts": "an object",
    "Steps | None": "a list or null", "GroupsMade | None": "a list or null",
    "GroupTimeouts | None": "a list or null", "FilesSeen | None": "a list or null"}
# each class's fields: name -> (its type, whether it may be left out)
_FIELDS: Final[dict[type[Event], dict[str, tuple[str, bool]]]] = {
    cls: {f.name: (str(f.type), f.default is not MISSING) for f in dataclass_fields(cls)}
    for cls in EVENT_TYPES.values()}


def _kind_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
