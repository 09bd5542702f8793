"""A flight record: one torch.distributed call as a rank recorded it, in the one schema that every
writer of records (the rank's recorder, ``lab.rank.flight``; the page its relay tells after a death,
``lab.rank.lastcall``) and their reader (the controller's, ``lab.rank.flightrecords``) are made from.

A record on the wire (:func:`to_wire`)::

    {"seq": 3, "group": "world", "op": "all_reduce", "state": "done", "t0": 1732530000.12,
     "t1": 1732530000.13, "numel": 256, "shape": [256], "dtype": "float32", "peer": null, "root": null,
     "tag": null, "reduce_op": "SUM", "async": false, "where": "train.py:42", "error": null}

and, where they apply (:data:`SCHEMA` marks them sparse: left out when empty), ``by``, ``world_size``,
``caller``, ``in_splits`` and ``out_splits``.

* ``seq`` counts from 1 the rank's calls on the group of one kind: collectives among collectives,
  point-to-point calls among point-to-point ones, so that the n-th collective of a group is the same
  call on every rank, whatever each sent to whom before it. The world's collective 1 is
  ``init_process_group`` (no tensor).
* ``group``: "world", or ``g<its global ranks, sorted, joined by ,>#<n>``, n the groups of those
  ranks the rank made before (every rank makes its groups in the same order); a group made
  otherwise (``split_group``): ``g<ranks>@<its torch group name>``.
* ``state``: "in_flight" (running, or async and not waited), "waiting" (in its Work's ``wait()``),
  "done", "raised" (``error``: ``Type: message``).
* ``peer`` (dst or src; None: any source) and ``root`` are global ranks; ``tag`` is a p2p call's.
* ``async``: the call returned a Work (isend, irecv, ``async_op=True``, a ProcessGroup method).
* ``where``: the first frame outside torch and the lab (the user's), ``file.py:LINE``; for a call the
  lab makes itself, its first frame outside torch, as ``lab/...py:LINE``.
* ``by``: who issued a collective the program did not call itself ("DDP's gradient", "DDP's",
  "torch's"); ``caller``: for one of those, the program's line in another file that led to ``where``;
  ``world_size``: the one the program gave ``init_process_group``.
* ``in_splits``, ``out_splits``: what the call sends each rank of the group and takes from each:
  an ``all_to_all_single``'s ``input_split_sizes`` and ``output_split_sizes`` as the program gave
  them (rows), where it gave them; the elements of each tensor of a list that holds one a rank
  (``all_to_all``'s input and output lists, ``scatter``'s ``scatter_list``, ``all_gather``'s
  ``tensor_list`` and ``gather``'s ``gather_list``: their ``out_splits``), where the rank gave one.

What a rank sends is its own word, and a rank runs a student's program: the reader
(:func:`from_wire`) takes nothing on trust. A record is checked field by field against the schema,
and one that fails is refused whole (with the name of its first bad field), never half-used.

Standard library only: ranks and their relays import it before torch.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

from lab.rank.ops import BATCHES, RECEIVES, SENDS

State = Literal["in_flight", "waiting", "done", "raised"]
STATES: tuple[str, ...] = get_args(State)  # (a tuple: `in` must not hash what a rank sent)
Direction = Literal["send", "recv", "batch", "collective"]
INT_MAX = 1 << 62  # larger numbers are no sizes, ranks or tags of a real call
SHAPE_MAX = 16  # dimensions of a shape
SPLITS_MAX = 4096  # ranks of an all_to_all's splits (a longer list is not recorded)


@dataclass(frozen=True)
class Record:
    """One torch.distributed call a rank made (the module says what each field holds)."""

    seq: int
    group: str
    op: str
    state: State
    t0: float
    t1: float | None = None
    numel: int | None = None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    peer: int | None = None
    root: int | None = None
    tag: int | None = None
    reduce_op: str | None = None
    is_async: bool = False
    where: str | None = None
    error: str | None = None
    by: str | None = None
    world_size: int | None = None
    caller: str | None = None
    in_splits: tuple[int, ...] | None = None
    out_splits: tuple[int, ...] | None = None

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


Kind = Literal["count", "int", "time", "bool", "text", "shape", "splits", "state"]


@dataclass(frozen=True)
class Wire:
    """How one field of a :class:`Record` goes on the wire."""

    key: str  # its name in the JSON object
    kind: Kind  # what a value of it is: a count (an integer of at least ``low``), any integer, a finite time...
    required: bool = False
    low: int = 0  # a count's least value
    sparse: bool = False  # left out when empty (None, False, "")


# The schema: every field of a Record, in its order, as the wire carries it.
SCHEMA: dict[str, Wire] = {
    "seq": Wire("seq", "count", required=True, low=1),
    "group": Wire("group", "text", required=True),
    "op": Wire("op", "text", required=True),
    "state": Wire("state", "state", required=True),
    "t0": Wire("t0", "time", required=True),
    "t1": Wire("t1", "time"),
    "numel": Wire("numel", "count"),
    "shape": Wire("shape", "shape"),
    "dtype": Wire("dtype", "text"),
    "peer": Wire("peer", "count"),
    "root": Wire("root", "count"),
    "tag": Wire("tag", "int"),
    "reduce_op": Wire("reduce_op", "text"),
    "is_async": Wire("async", "bool"),
    "where": Wire("where", "text"),
    "error": Wire("error", "text"),
    "by": Wire("by", "text", sparse=True),
    "world_size": Wire("world_size", "count", low=1, sparse=True),
    "caller": Wire("caller", "text", sparse=True),
    "in_splits": Wire("in_splits", "splits", sparse=True),
    "out_splits": Wire("out_splits", "splits", sparse=True),
}
if list(SCHEMA) != [f.name for f in fields(Record)]:  # (the schema is the class's, field for field)
    raise AssertionError("lab.rank.record: SCHEMA and Record name different fields")


def to_wire(record: Record) -> dict[str, Any]:
    """A record as the events carry it."""
    found: dict[str, Any] = {}
    for name, wire in SCHEMA.items():
        value = getattr(record, name)
        if wire.sparse and not value:
            continue
        found[wire.key] = list(value) if wire.kind in ("shape", "splits") and value is not None else value
    return found


def _whole(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= INT_MAX


def _shape(value: object) -> bool:
    return isinstance(value, list) and len(value) <= SHAPE_MAX and all(_whole(d, 0) for d in value)


# A kind -> whether a value (not None) is one of it
_CHECKS: dict[Kind, Callable[[object, Wire], bool]] = {
    "count": lambda value, wire: _whole(value, wire.low),
    "int": lambda value, wire: _whole(value, -INT_MAX),
    "time": lambda value, wire: isinstance(value, (int, float)) and not isinstance(value, bool)
    and math.isfinite(value),
    "bool": lambda value, wire: isinstance(value, bool),
    "text": lambda value, wire: isinstance(value, str),
    "shape": lambda value, wire: _shape(value),
    "splits": lambda value, wire: isinstance(value, list) and 0 < len(value) <= SPLITS_MAX
    and all(_whole(n, 0) for n in value),
    "state": lambda value, wire: isinstance(value, str) and value in STATES,
}


def from_wire(raw: object, text: Callable[[str, str], str]) -> Record | str:
    """A record from what a rank sent, or why it is refused (the name of its first malformed field;
    "not an object"). ``text(name, value)`` makes each text field as the reader shows it (cut,
    printable); a required one must hold more than blanks. Fields the schema does not name are left
    alone."""
    if not isinstance(raw, dict):
        return "not an object"
    found: dict[str, Any] = {}
    for name, wire in SCHEMA.items():
        value = raw.get(wire.key)
        if value is None:
            if wire.required:
                return wire.key
            continue
        if not _CHECKS[wire.kind](value, wire) or wire.required and wire.kind == "text" and not value.strip():
            return wire.key
        if wire.kind == "text":
            value = text(name, value) if value else None
        elif wire.kind in ("shape", "splits"):
            value = tuple(value)
        elif wire.kind == "time":
            value = float(value)
        found[name] = value
    return Record(**found)
