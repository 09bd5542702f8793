"""Reading the rank processes' streams: one reader thread per stream of each launch, within bounds.

A reader (``StreamReader``) reads lines of at most EVENT_MAX bytes (the rest of a longer line is
read in pieces and dropped, never held) and sorts them itself:

* an event line of this run (``lab.rank.protocol``) goes whole to the controller's queue, also
  when output without a newline ran into it (it then starts a line of its own); one longer than
  EVENT_MAX, or past its budget (lab.rank.protocol.EventBudget), is its sender's failure, not output;
* any other line is the output of a rank (or of a host's launcher itself): its ``Output``
  (lab.core.outcome) counts it and keeps its last lines, and only the first SHOWN_LINES of each
  rank go on to the queue and ``on_line`` (of each cell, for a notebook's ranks, whose marks always
  go on); then ``on_line`` is told once that the rest of that rank's output is counted, not shown,
  and the report says how much each such rank printed.

Past SHOWN_LINES of a rank, the lines of that rank already buffered in a local pipe are taken in
one block, counted with one pass over their bytes, so a flood of short lines costs no Python per
line. (SSH channels are read a line at a time.) The queue holds at most QUEUE_MAX items:
when the controller falls behind, the readers wait, the pipes fill and the ranks that print wait
in their writes (backpressure), while the watchdog, which only takes from the queue, keeps its
clock. While hung ranks dump their stacks (``dumping``), their stderr goes through whole.
"""
from __future__ import annotations

import functools
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Literal

from lab.core.outcome import SHOWN_LINES, LaunchState, RankState, kept_text
from lab.rank.events import Event, parse_event
from lab.rank.protocol import EVENT_MAX, LINE_MAX, MARK, EventBudget, rank_tag, untag

QUEUE_MAX = 1024  # lines read and not yet handled; when full, the readers (and the ranks) wait
TAG_MAX = 64  # bytes enough for any rank's tag

# (launch index, "event" | "bad" | "out" | "err" | "lab" | "end" (of one of its streams), whose line, line)
Item = tuple[int, str, "RankState | LaunchState | None", str]
Events = queue.Queue[Item]


@dataclass
class StreamReader:
    """Reads one stream of one launch to its end, within bounds (see the module's docstring)."""

    index: int  # the launch's
    stream: str  # "out" | "err"
    launch: LaunchState
    states: list[RankState]
    events: Events
    token: str
    dumping: threading.Event
    stopped: threading.Event
    always: str = ""  # lines that start with it are always shown (a notebook's marks: lab.rank.cells)

    def pump(self, stream: IO[bytes]) -> None:
        """Queue each event line whole, count each other line for its rank and queue the first
        SHOWN_LINES of them (all of stderr while ranks dump their stacks); queue "end" at the end."""
        prefix = f"{MARK}{self.token} ".encode() if self.stream == "out" else b""
        budget = EventBudget()
        try:
            for raw, size, kind in read_lines(stream, prefix, self._in_blocks, self._block):
                self.launch.read.active_at = time.monotonic()
                if kind == "lines":  # one rank's lines (_block)
                    rank = untag(raw[:TAG_MAX])[0]
                    assert rank is not None
                    self.states[rank].output.add_block(raw, rank_tag(rank))
                elif prefix and raw.startswith(prefix):  # an event line: whole, or too long to be one
                    if kind != "whole":
                        self._put("bad", self._sender(raw), f"sent an event line longer than {EVENT_MAX} bytes "
                                                            f"({size} bytes)")
                    elif budget.take(raw[len(prefix):], size, len(self.launch.launch.ranks)):
                        self._put("event", None, raw.decode("utf-8", "replace"))
                    elif budget.first_over:
                        self._put("bad", self._sender(raw), budget.over)
                else:
                    whose, body, size, whole = _whose_line(self.launch, self.states, raw, size, kind == "whole")
                    text = kept_text(body, size, whole)
                    count = whose.output.add(text, size)
                    if count <= SHOWN_LINES or (self.stream == "err" and self.dumping.is_set()) or \
                            self.always and text.startswith(self.always):
                        self._put(self.stream, whose, text)
                    elif count == SHOWN_LINES + 1:
                        self._put("lab", whose, f"[lab: more than {SHOWN_LINES} lines: the rest of this "
                                                f"output is counted, not shown]")
        except (OSError, ValueError):
            pass
        finally:
            self.launch.read.closed_at = time.monotonic()
            self._put("end", None, "")

    def _sender(self, raw: bytes) -> RankState | LaunchState:
        """The rank an event line came from: the one the line names at its start (a line too long
        to be read whole), else the launch."""
        return claimed_rank(raw[:200].decode("utf-8", "replace"), self.states) or self.launch

    def _in_blocks(self) -> bool:
        """Whether to look for blocks: one of the launch's ranks is past SHOWN_LINES (and this is
        not stderr while ranks dump their stacks)."""
        return any(self.states[r].output.in_window > SHOWN_LINES for r in self.launch.launch.ranks) and not (
            self.stream == "err" and self.dumping.is_set()) and not self.always

    def _block(self, data: bytes) -> int:
        """How much of ``data`` (whole lines, buffered) to take as one block: the lines at its
        start that are one rank's, if that rank is past SHOWN_LINES (0: none)."""
        rank, _, cut = untag(data[:TAG_MAX])
        if rank is None or cut is not None or not (
                rank < len(self.states) and self.states[rank].output.in_window > SHOWN_LINES):
            return 0
        other = _other_line(rank_tag(rank)).search(data, 0, len(data) - 1)  # (data ends with a line end)
        return other.start() + 1 if other else len(data)

    def _put(self, kind: str, whose: RankState | LaunchState | None, text: str) -> None:
        """Queue an item; wait while the queue is full, unless the run is over."""
        while not self.stopped.is_set():
            try:
                self.events.put((self.index, kind, whose, text), timeout=0.5)
            except queue.Full:
                continue
            self.launch.read.active_at = time.monotonic()
            return


@functools.cache
def _other_line(tag: bytes) -> re.Pattern[bytes]:
    """A line end followed by a line that does not start with ``tag``."""
    return re.compile(rb"\n(?!" + re.escape(tag) + rb")")


LineKind = Literal["whole", "cut", "lines"]


def read_lines(stream: IO[bytes], prefix: bytes, in_blocks: Callable[[], bool],
               block: Callable[[bytes], int] = len) -> Iterator[tuple[bytes, int, LineKind]]:
    """The lines of ``stream``, each as (its start without its line end, its length in bytes as
    printed, "whole" or "cut"). A line longer than EVENT_MAX is cut: its rest is read in pieces
    and dropped, never held. An event line (``prefix``; b"": none) that output without a line end
    ran into starts a line of its own; one that came in the middle of a long line (a rank's relay
    writes one in pieces, and its channel may write between them) comes first, and the long line
    goes on after it.

    While ``in_blocks()``, whole lines already read (a buffered stream's), as many at their start
    as ``block(lines)`` says, come as one block (their bytes, line ends and all, their length,
    "lines"), unless an event is among them: a flood then costs a pass over its bytes, not a turn
    of this loop per line."""
    peek = getattr(stream, "peek", None)  # a pipe's (not paramiko's): the bytes read and not yet taken
    carried = b""  # the start of the next line, already read
    while True:
        if not carried and peek is not None and in_blocks():
            data = peek(EVENT_MAX)  # what is buffered (reads only while nothing is)
            end = data.rfind(b"\n") + 1
            if end > 0 and (not prefix or data.find(prefix, 0, end) < 0):
                taken = block(data[:end])
                if taken:
                    yield stream.read(taken), taken, "lines"
                    continue
        room = EVENT_MAX - len(carried)
        raw = carried if carried.endswith(b"\n") or room <= 0 else carried + stream.readline(room)
        carried = b""
        if not raw:
            return
        at = raw.find(prefix, 1) if prefix else -1
        if at > 0:  # an event ran into this line: the line ends where the event starts
            raw, carried = raw[:at], raw[at:]
            yield raw, len(raw), "whole"
        elif len(raw) < EVENT_MAX or raw.endswith(b"\n"):
            yield raw.rstrip(b"\r\n"), len(raw), "whole"
        else:
            size, overlap = len(raw), raw[1 - len(prefix):] if prefix else b""
            while more := stream.readline(EVENT_MAX):
                both = overlap + more
                at = both.find(prefix) if prefix else -1
                if at >= 0:  # an event, from the rank's channel, between two pieces of this line
                    event = both[at:]
                    size += len(more) - len(event)
                    if not event.endswith(b"\n"):
                        event += stream.readline(max(1, EVENT_MAX - len(event)))
                    yield (event.rstrip(b"\r\n"), len(event), "whole") if event.endswith(b"\n") else (
                        event[:LINE_MAX], len(event), "cut")
                    overlap = b""
                    continue
                size += len(more)
                if more.endswith(b"\n"):
                    break
                overlap = both[1 - len(prefix):] if prefix else b""
            yield raw[:LINE_MAX], size, "cut"


def _whose_line(launch: LaunchState, states: list[RankState], raw: bytes, size: int,
                whole: bool) -> tuple[RankState | LaunchState, bytes, int, bool]:
    """Whose a line of output is (its tag's rank, else the launch's own), and the line as it
    printed it: (whose, its text or start, its size, whether ``text`` is all of it)."""
    rank, body, cut = untag(raw)
    if rank is None or not 0 <= rank < len(states):
        return launch, raw, size, whole
    if cut is not None:  # the start of a longer line, which the lab's launcher cut
        return states[rank], body, cut, False
    return states[rank], body, size - (len(raw) - len(body)), whole


_RANK_FIELD = re.compile(r'"rank": ?(\d{1,9})\b')


def claimed_rank(line: str, states: list[RankState]) -> RankState | None:
    """The rank an event line names (its ``rank`` field, found where JSON alone cannot read it)."""
    found = _RANK_FIELD.search(line)
    rank = int(found.group(1)) if found else -1
    return states[rank] if 0 <= rank < len(states) else None


def read_events(stream: IO[bytes], token: str, on_line: Callable[[str], None] = lambda _: None,
                ) -> Iterator[Event]:
    """The events of the run ``token`` on ``stream`` (the stdout of one of the lab's own processes on
    a host: the port holder, the doctor's probe), read as a rank's are (:func:`read_lines`: a line is
    held up to an event's size at most, a longer one is dropped in pieces); its other whole lines go
    to ``on_line``. A malformed event raises MalformedEvent (lab.rank.protocol)."""
    for raw, _, kind in read_lines(stream, MARK.encode(), lambda: False):
        if kind != "whole":
            continue
        line = raw.decode("utf-8", "replace")
        event = parse_event(line, token)
        if event is None:
            on_line(line)
        else:
            yield event
