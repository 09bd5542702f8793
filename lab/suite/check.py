"""What a checker returns, and a small helper for writing checkers.

A checker is a pure function ``check(results, world) -> Verdict``:

* ``results`` maps each rank to the dict its rank program returned (JSON data:
  tensors arrive as nested lists). A rank that returned nothing is absent.
* ``world`` describes the run (world size, backend, which host each rank ran on, the
  inputs drawn for each rank where the exercise takes some).

Checkers compute the expected values themselves in plain Python, never by calling
the collective under test, so they are an independent oracle. They never import
torch.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Results = Mapping[int, Any]  # rank -> what its program returned (JSON data, untrusted)


@dataclass(frozen=True)
class Carried:
    """What a host's connections carried while its ranks ran, in the lab's launcher's word, measured
    outside the ranks (lab.rank.wire)."""

    carried: int  # bytes its ranks' TCP connections carried (each byte once, at its sender)
    lost: int = 0  # the kernel's messages of closed connections it lost: it may fall short
    error: str = ""  # why it could not measure (then ``carried`` says nothing)
    failed: str = ""  # why it stopped measuring while the ranks ran (then ``carried`` says nothing)
    space: str = ""  # the network namespace whose every socket it counted: hosts that name one count the same


@dataclass(frozen=True)
class Launched:
    """What the launcher that started the ranks does that a checker sees in them (each launcher says
    its own: ``lab.core.launchers``)."""

    # the process on each host whose children that host's ranks are ("torchrun agent"); None: each
    # rank may have a parent of its own
    rank_parent: str | None = None
    sets_group_rank: bool = False  # GROUP_RANK numbers the hosts


@dataclass(frozen=True)
class World:
    """The facts of a run a checker may rely on."""

    world_size: int
    backend: str
    hosts: tuple[str, ...]  # hosts[rank] is the host that rank ran on
    local_ranks: tuple[int, ...]
    launched: Launched = Launched()  # what the launcher that started the ranks does
    # each rank's drawn values (lab.core.random_inputs)
    inputs: Mapping[int, Sequence[int]] = field(default_factory=dict)
    # Where the run measured its hosts' connections (lab grade: Plan.wire): host -> what they carried; a
    # host missing said nothing (its launcher was stopped first). None: not measured.
    carried: Mapping[str, Carried] | None = None

    @classmethod
    def local(cls, world_size: int, backend: str = "gloo") -> World:
        return cls(world_size, backend, ("local",) * world_size, tuple(range(world_size)))


@dataclass(frozen=True)
class Mismatch:
    """One wrong value: on which rank, what was compared, expected vs got."""

    rank: int | None
    what: str
    expected: Any
    got: Any

    def __str__(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "all ranks"
        return f"{who}: {self.what}: expected {_short(self.expected)}, got {_short(self.got)}"


@dataclass(frozen=True)
class PartVerdict:
    """One function of a student's, judged on its own: ``reason`` says why it failed."""

    name: str
    passed: bool
    reason: str = ""


@dataclass(frozen=True)
class Verdict:
    """A checker's answer. ``reason`` is one line a student can act on."""

    passed: bool
    reason: str = ""
    mismatches: tuple[Mismatch, ...] = ()
    notes: tuple[str, ...] = ()  # e.g. "gloo lacks X; the tutorial's workaround was used"
    parts: tuple[PartVerdict, ...] = ()  # an exercise of several functions: each one's (lab.suite.registry)

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        return tuple(sorted({m.rank for m in self.mismatches if m.rank is not None}))


@dataclass
class Expect:
    """Collects mismatches while a checker compares; ``verdict()`` sums them up.

    >>> e = Expect(); e.equal(1, "sum", 3, 4); e.verdict().reason
    'rank 1: sum: expected 3, got 4'
    """

    mismatches: list[Mismatch] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def equal(self, rank: int | None, what: str, expected: Any, got: Any, tol: float = 1e-6) -> bool:
        ok = values_match(expected, got, tol)
        if not ok:
            self.mismatches.append(Mismatch(rank, what, expected, got))
        return ok

    def true(self, rank: int | None, what: str, condition: bool, expected: Any = True, got: Any = False) -> bool:
        if not condition:
            self.mismatches.append(Mismatch(rank, what, expected, got))
        return condition

    def every_rank_reported(self, results: Mapping[int, Any], world: World) -> bool:
        missing = [r for r in range(world.world_size) if r not in results]
        for r in missing:
            self.mismatches.append(Mismatch(r, "result", "a result", "nothing"))
        return not missing

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def verdict(self) -> Verdict:
        if not self.mismatches:
            return Verdict(True, notes=tuple(self.notes))
        first = str(self.mismatches[0])
        more = len(self.mismatches) - 1
        reason = first + (f" (and {more} more)" if more else "")
        return Verdict(False, reason, tuple(self.mismatches), tuple(self.notes))


def values_match(expected: Any, got: Any, tol: float = 1e-6) -> bool:
    """Structural equality; floats compare with a relative tolerance ``tol``."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return bool(expected == got)
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(expected, got, rel_tol=tol, abs_tol=tol)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(expected) == len(got) and all(values_match(e, g, tol) for e, g in zip(expected, got))
    if isinstance(expected, Mapping) and isinstance(got, Mapping):
        return expected.keys() == got.keys() and all(values_match(expected[k], got[k], tol) for k in expected)
    return bool(expected == got)


_DTYPE = re.compile(r" (bool|u?int(?:8|16|32|64)|b?float(?:16|32|64)|complex(?:64|128))(?=:|$)")  # of a case's name


def distinct(mismatches: Sequence[Mismatch]) -> list[str]:
    """The mismatches as distinct errors, a line each: those that differ only in the case's dtype
    and give the same values (one bug, seen over four dtypes) are one line naming the dtypes; each
    function's first error comes before any function's second, so that no function's failures
    hide behind another's."""
    groups: dict[tuple[Any, ...], tuple[Mismatch, list[str]]] = {}
    for m in mismatches:
        found = _DTYPE.search(m.what)
        key = (m.rank, _DTYPE.sub("", m.what), _numbers(m.expected), _numbers(m.got))
        first, dtypes = groups.setdefault(key, (m, []))
        if found:
            dtypes.append(found[1])
    lines: list[tuple[int, int, str]] = []  # (its rank among its function's errors, its order, its line)
    seen: dict[str, int] = {}
    for order, (first, dtypes) in enumerate(groups.values()):
        function = first.what.split("(", 1)[0]
        seen[function] = seen.get(function, -1) + 1
        what = _DTYPE.sub(f" ({', '.join(dtypes)})", first.what) if len(dtypes) > 1 else first.what
        lines.append((seen[function], order, str(Mismatch(first.rank, what, first.expected, first.got))))
    return [line for _, _, line in sorted(lines)]


def _numbers(value: Any) -> Any:
    """A value as compared across dtypes: its numbers as floats (``[3]`` and ``[3.0]`` are one)."""
    if isinstance(value, (list, tuple)):
        return tuple(_numbers(v) for v in value)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ranks_named(ranks: list[int] | tuple[int, ...]) -> str:
    """``rank 3``, or ``ranks 0, 1, 2``: several ranks that did the same, in one phrase."""
    ordered = sorted(ranks)
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {', '.join(map(str, ordered))}"
