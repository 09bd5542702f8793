"""The rule of quiet: from what a rank's looks find (the calls it completed, the call it blocks in,
what its TCP connections carried) and when (its own clocks), for how long nothing moved, whether a
``progress`` event is news, and when to look next. Pure: told the counts and the time, so it is
tested on made-up counters and a made-up clock; the flight recorder's watcher (``lab.rank.watcher``)
looks and sends, and the controller's ledger holds a run hung with :func:`quiet_enough` on what
every rank said.

Two looks that found the same counters are the kernel's word that no byte moved in between, which
a busy machine delaying the looks cannot fake. The records time the rest: the newest call's end and
the blocking call's start (or its wait's), so a call that began between two looks has been quiet
since it began, not since the look that first found it.

While a call blocks, the rank looks each PROGRESS_EVERY seconds, and at the moment its quiet reaches
--hang-after (LOOK_LATE past it, so that the hang is said when it is due, not at the next whole
second), until it has said that; then nothing until something changes: output every second would
keep a partitioned host's sshd from ever finding its client gone, and the ranks with it.

Standard library only: it runs in every rank.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

PROGRESS_EVERY = 1.0  # seconds between two looks of the flight recorder's watcher
LOOK_LATE = 0.02  # seconds past the moment a blocking call's quiet reaches --hang-after that it is looked at


def quiet_enough(quiet: float, hang_after: float) -> bool:
    """Whether a blocking call that has been quiet ``quiet`` seconds is a hang's (``hang_after`` 0: never)."""
    return hang_after > 0 and quiet >= hang_after


@dataclass(frozen=True)
class Look:
    """What one look found, and when."""

    completed: int  # the calls the rank completed (or that raised) so far
    call: int | None  # the call it blocks in (the oldest, if several threads do), by identity; None: none
    state: str  # that call's state ("in_flight", "waiting"); "" with none
    since: float | None  # when (the wall clock) it began blocking in it
    mark: Hashable  # what its connections carried, as counters
    changed_at: float  # when (the wall clock) its newest call ended
    now: float  # the monotonic clock
    wall: float  # the wall clock


@dataclass(frozen=True)
class Verdict:
    """What a look decides: whether to say ``progress`` now (with ``quiet``), whether it says the call is
    quiet for --hang-after (the records are dumped with it, for the verdict to read at once), and the
    seconds to the next look."""

    say: bool
    quiet: float
    quiet_enough: bool
    next_look: float


class Quiet:
    """One rank's quiet, look after look, for a run's --hang-after (0: no hang is judged)."""

    def __init__(self, hang_after: float = 0.0) -> None:
        self.hang_after = hang_after
        self.said: tuple[int, int | None, str] | None = None  # what the last progress said
        self.told = False  # the last progress said the blocking call is quiet enough
        self.seen: tuple[object, ...] | None = None  # what the last look found, the counters with it
        self.mark: Hashable = None  # the counters at the last look
        self.still_since = 0.0  # since when (the monotonic clock) nothing moved, as the looks and records tell

    def look(self, look: Look) -> Verdict:
        said = (look.completed, look.call, look.state)
        if look.mark != self.mark:  # bytes moved since the last look: when, only the kernel knew
            self.mark, self.still_since = look.mark, look.now
        changed = max(look.changed_at, -math.inf if look.since is None else look.since)
        self.still_since = max(self.still_since, look.now - max(0.0, look.wall - changed))
        quiet = look.now - self.still_since
        if (*said, look.mark) != self.seen:
            self.seen, self.told = (*said, look.mark), False
        watching = look.call is not None and self.hang_after > 0
        say = said != self.said or watching and not self.told
        if say:
            self.said, self.told = said, watching and quiet_enough(quiet, self.hang_after)
        if watching and not self.told:
            next_look = min(PROGRESS_EVERY, max(0.0, self.hang_after - quiet) + LOOK_LATE)
        else:
            next_look = PROGRESS_EVERY
        return Verdict(say, quiet, say and self.told, next_look)
