"""What a run is and was, as data: each launch's and each rank's state, each exercise's reports, the outcome.

The runner (lab.core.runner) fills these in as the run goes; the judge, the report and the doctor
read them afterwards. Nothing here starts, reads or stops a process.

Output is bounded, whatever a rank prints: its ``Output`` counts every line (lines, bytes),
keeps it, cut at LINE_MAX bytes, among its last TAIL_LINES lines (the report's "last lines";
past OUTPUT_MAX bytes of a rank's output its lines are counted, not kept), and only the first
SHOWN_LINES of each rank are shown (lab.core.streams decides which lines reach ``on_line``).
"""
from __future__ import annotations

import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lab.core.plan import Launch, Plan, RankSpec, bind_macros
from lab.rank.events import Cell, Died, End, Error, Flight, Hello, Progress
from lab.rank.protocol import LINE_MAX
from lab.rank.record import Record
from lab.rank.steps import STARTUP, RankStep
from lab.suite.check import Carried

TAIL_LINES = 200  # the last lines of each rank's output kept (for the report)
SHOWN_LINES = 1000  # lines of each rank's output passed on to ``on_line``; the rest is counted, not shown
# LINE_MAX (lab.rank.protocol): bytes kept of a line of output; the rest of a longer one is counted and dropped
OUTPUT_MAX = 64 << 20  # bytes of a rank's output whose lines are kept; past it they are counted only
SYS_EXIT = "SystemExit: "  # how the worker reports an exercise that called sys.exit (lab.rank.worker)


@dataclass(eq=False)
class Output:
    """What one rank (or a host's launcher itself) printed, within bounds whatever it prints:
    every line counted, the first SHOWN_LINES shown, the last TAIL_LINES kept (each cut at
    LINE_MAX bytes), the rest dropped. Its stdout and stderr readers both add to it. A notebook's
    rank shows SHOWN_LINES of each cell: each cell opens a new window (:meth:`new_window`)."""

    lines: int = 0
    size: int = 0  # its bytes as printed, line ends included
    window: int = 0  # the lines counted before the window that is open now
    shown_before: int = 0  # the lines shown in the windows before it
    last: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, text: str, size: int) -> int:
        """Count a line of ``size`` bytes and keep ``text``, its start (up to OUTPUT_MAX bytes
        printed); how many lines so far in the window."""
        with self.lock:
            self.lines += 1
            self.size += size
            if self.size <= OUTPUT_MAX:
                self.last.append(text)
            elif self.size - size <= OUTPUT_MAX:
                self.last.append(_PAST_MAX)
            return self.lines - self.window

    def new_window(self) -> None:
        """Show the next SHOWN_LINES lines too (a notebook's cell begins)."""
        with self.lock:
            self.shown_before += min(self.lines - self.window, SHOWN_LINES)
            self.window = self.lines

    @property
    def in_window(self) -> int:
        """The lines counted since the window opened."""
        return self.lines - self.window

    def add_block(self, block: bytes, tag: bytes = b"") -> None:
        """Count a block of whole lines (each ends with its newline and starts with ``tag``, which
        is not the rank's) and keep its last ones (up to OUTPUT_MAX bytes printed)."""
        lines = block.count(b"\n")
        with self.lock:
            before = self.size
            self.lines += lines
            self.size += len(block) - lines * len(tag)
            if before > OUTPUT_MAX:
                return
        last = [kept_text(raw[len(tag):].rstrip(b"\r"), len(raw) + 1 - len(tag))
                for raw in block[:-1].rsplit(b"\n", TAIL_LINES)[-TAIL_LINES:]]
        with self.lock:
            self.last.extend(last if self.size <= OUTPUT_MAX else [*last, _PAST_MAX])

    @property
    def shown(self) -> int:
        return self.shown_before + min(self.lines - self.window, SHOWN_LINES)

    @property
    def dropped(self) -> int:
        """Lines counted but never shown (some of the last ones are still in ``tail``)."""
        return self.lines - self.shown

    def tail(self) -> list[str]:
        with self.lock:
            return list(self.last)


_PAST_MAX = f"[lab: more than {OUTPUT_MAX >> 20} MiB printed: the rest was counted, not kept]"


def kept_text(raw: bytes, size: int, whole: bool = True) -> str:
    """A line of output as kept: at most LINE_MAX bytes of it, and a word where it was cut."""
    if whole and len(raw) <= LINE_MAX:
        return raw.decode("utf-8", "replace")
    return raw[:LINE_MAX].decode("utf-8", "replace") + f" [cut: {size} bytes]"


@dataclass
class Reading:
    """When a launch's stream readers (lab.core.streams) last read or queued one of its lines, and last
    met the end of one of its streams: the readers' to write (like the Output buffers they fill), the
    ledger's to read. Every other field of a LaunchState or a RankState is the ledger's alone to write."""

    active_at: float = 0.0
    closed_at: float | None = None


@dataclass
class LaunchState:
    """One started process: a rank, or a host's launcher and the ranks it started."""

    launch: Launch
    launcher: str
    exit_code: int | None = None
    exited_at: float | None = None
    settled: bool = False  # its ranks were told it ended (once its last lines were read)
    open_streams: int = 2
    read: Reading = field(default_factory=Reading)  # when its readers last read, and met an end
    output: Output = field(default_factory=Output)  # a launcher's own lines (torchrun's)
    carried: Carried | None = None  # where the plan measures the connections (Plan.wire): the launcher's word

    @property
    def label(self) -> str:
        return f"{self.launch.host} {self.launcher}"

    @property
    def color(self) -> int:
        return self.launch.ranks[0] if self.launch.ranks else 0

    @property
    def finished(self) -> bool:
        return self.open_streams == 0 and self.exit_code is not None


@dataclass
class RankState:
    """What the controller knows about one rank while and after it runs: the ledger's alone to write
    (lab.core.ledger), but for its Output buffer, which the stream readers fill."""

    spec: RankSpec
    launch: LaunchState
    step: RankStep = STARTUP
    step_started: float = field(default_factory=time.monotonic)
    startup_cpu: float = 0.0  # the CPU seconds its process had used in start-up, as it last said (alive)
    done: bool = False  # the worker said it finished
    exit_code: int | None = None  # its launch's, once that ended
    fatal: str | None = None  # start-up or rendezvous failed outside any exercise
    info: Hello | None = None  # what it said of itself as it started: hostname, pid, torch version
    output: Output = field(default_factory=Output)
    dump: list[str] = field(default_factory=list)  # stack dump after SIGUSR1
    stopped_at: str | None = None  # where a hung rank was stopped
    ended_at: float | None = None  # when it was seen to end by itself (not killed by the lab)
    entered: dict[str, float] = field(default_factory=dict)  # exercise -> when the rank began it
    steps: int = 0  # step events taken (at most a plan's steps count)
    violations: list[str] = field(default_factory=list)  # events it sent that break the protocol
    progress: Progress | None = None  # its last progress event (lab.rank.flight): calls completed, in flight
    progress_at: float | None = None  # when that came
    flight: Flight | None = None  # its last flight event: its flight recorder's records
    flight_at: float | None = None  # when that came
    end: End | None = None  # its end event: how and where its program ended (raised, exited)
    end_at: float | None = None  # when that came
    traceback: str | None = None  # a fatal error's
    # Its clock against the controller's (time.monotonic() here less time.time() there, the least seen as its
    # progress events came): a record's time plus this is when it happened on the controller's clock.
    clock: float | None = None
    trace: dict[tuple[str, str, float], Record] = field(default_factory=dict)  # --trace: the newest record of each call
    trace_said_dropped: int = 0  # calls it said it left out of its trace
    trace_overflow: int = 0  # records of its the controller left out (past TRACE_MAX)
    torch_dump: dict[str, Any] | None = None  # --fr-dir: torch's own recorder, as it last sent it
    last_call: Died | None = None  # what its relay said it was in as it died (lab.rank.lastcall)
    cell: Cell | None = None  # a notebook's rank: the cell it last began or ended (lab.rank.cells)

    @property
    def label(self) -> str:
        return f"{self.spec.host} r{self.spec.rank}"

    @property
    def trace_dropped(self) -> int:
        return self.trace_said_dropped + self.trace_overflow

    @property
    def color(self) -> int:
        return self.spec.rank

    @property
    def tail(self) -> list[str]:
        """Its last lines of output (TAIL_LINES at most)."""
        return self.output.tail()

    @property
    def died(self) -> bool:
        """It ended by itself before saying it was done, whatever its exit status (0 too:
        ``os._exit(0)`` in an exercise): a crash, an exit, a signal, or its host went away.
        (A script says nothing: it is done when it exits with status 0.)"""
        return self.ended_at is not None and not self.done


@dataclass
class ExerciseRun:
    """Every rank's report for one exercise."""

    name: str
    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, Error] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    calls: dict[int, Any] = field(default_factory=dict)  # the calls each rank made (lab.rank.calls)
    violations: dict[int, str] = field(default_factory=dict)  # rank -> the first event of its that broke the protocol

    def reported(self, rank: int) -> bool:
        return rank in self.results or rank in self.errors


@dataclass(frozen=True)
class Evidence:
    """One rank's line of evidence: ``rank 1 (node2): recv from 0, tag 0, 4 floats at ring.py:12``; or,
    without a rank, a host's (the preflight's: ``call`` says what is wrong, naming the hosts)."""

    rank: int | None
    host: str
    call: str  # the call it is in (or the one the cause is about), or what it does instead
    where: str | None  # file.py:LINE in the user's program

    def line(self) -> str:
        if self.rank is None:
            return self.call
        return f"rank {self.rank} ({self.host}): {self.call}" + (f" at {self.where}" if self.where else "")

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "call": self.call, "where": self.where}


@dataclass(frozen=True)
class Cause:
    """What happened across the ranks: ``headline`` is one sentence, the report's first line."""

    kind: CauseKind
    headline: str
    evidence: tuple[Evidence, ...] = ()  # one line per rank, by rank
    fix: str | None = None  # what usually fixes it
    notes: tuple[str, ...] = ()  # what else to know: the records that were malformed and skipped...

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "headline": self.headline, "evidence": [e.to_json() for e in self.evidence],
                "fix": self.fix, "notes": list(self.notes)}


CauseKind = Literal["network", "crash", "rendezvous", "collective-mismatch", "p2p-cycle", "p2p-unmatched",
                    "missing-rank", "uneven-counts", "straggler", "none", "unknown"]


@dataclass(frozen=True)
class Restart:
    """torchrun restarted the ranks (``--max-restarts``): which restart (1: the first), how long the
    attempt before ran, and how its ranks ended, as far as they said, in the order they said it (none:
    no rank said)."""

    count: int
    ended: tuple[str, ...]
    seconds: float = 0.0  # how long the attempt before ran, from its start to the restart

    def line(self, limit: int) -> str:
        why = "no rank said how it ended (a signal, or before the lab's recorder)"
        if self.ended:
            why = self.ended[0] + (f" (first; {len(self.ended) - 1} more after it)" if len(self.ended) > 1 else "")
        return (f"torchrun restarted the ranks ({self.count} of --max-restarts {limit}) after attempt {self.count} "
                f"ran {self.seconds:.1f}s: {why}")


@dataclass
class RunOutcome:
    plan: Plan
    ranks: list[RankState]
    exercises: dict[str, ExerciseRun]
    status: RunStatus
    seconds: float
    hung: list[int] = field(default_factory=list)  # ranks found past the timeout
    ports: tuple[int, ...] = ()  # the ports held on rank 0's host (``${port0}``...)
    wall: float | None = None  # the run was stopped at this limit on its whole time (not one step's)
    cause: Cause | None = None  # why it hung or failed, across ranks (lab.core.why); None when it completed
    restarts: list[Restart] = field(default_factory=list)  # torchrun's restarts of the ranks, in order
    hang_found: float | None = None  # when (time.monotonic(), the controller's) the hang finder found it hung
    brought_back: list[str] = field(default_factory=list)  # what the ranks wrote came back (lab.core.bringback)
    ended_at: float | None = None  # when (time.monotonic(), the controller's) the run ended and its verdict was made

    def first_failure(self) -> float | None:
        """When (the controller's clock) the first rank that failed was seen to: its end event, or its end."""
        said = [s.end_at if s.end_at is not None else s.ended_at for s in self.ranks
                if s.died and s.exit_code not in (0, None)]
        return min((t for t in said if t is not None), default=None)

    @property
    def stopped(self) -> bool:
        """The lab stopped it: a hang it found, or a timeout."""
        return self.status in ("hung", "timeout")

    def ended_early(self) -> list[RankState]:
        """The ranks that ended with status 0 in a job that did not succeed (another rank failed, hung or
        was lost): no success of theirs, for the job went on without them."""
        if all(s.done for s in self.ranks):
            return []
        return [s for s in self.ranks if s.done]

    @property
    def master_port(self) -> int | None:
        """The port rank 0's store (or torchrun's rendezvous) listened on."""
        return int(bind_macros(self.plan.master_port, "", self.ports)) if self.plan.master_port and self.ports else None


def between_cells(states: Sequence[RankState]) -> dict[int, Cell]:
    """The notebook's ranks that wait for their next cell (lab.rank.cells), each with the cell it ended:
    the newest cell any rank began was not sent to it, or it has ended it (a peer that waits on it in a
    call waits in vain). None of a run that is no notebook's."""
    began = [s.cell for s in states if s.cell is not None]
    if not began:
        return {}
    newest = max(began, key=lambda cell: cell.n)
    return {s.spec.rank: s.cell for s in states if s.cell is not None and (
        s.spec.rank not in newest.ranks or s.cell.n == newest.n and s.cell.ended)}


# preflight: the hosts' launchers found the network unfit for the job; no rank started (lab.core.preflight)
RunStatus = Literal["completed", "hung", "timeout", "interrupted", "crashed", "preflight"]
# (whose line, "out" | "err" | "lab" (the lab's own word about that output: the rest is not shown), line)
OnLine = Callable[["RankState | LaunchState", str, str], None]


def ended(code: int | None) -> str:
    """How a process ended, in words that follow its name: "exited with status 3", "was killed
    by SIGKILL". A status of 128+N is read as a shell (or the lab's reaper) reports death by
    signal N; -1 is what SSH reports when a process ended without a status."""
    if code is None:
        return "did not end by itself"
    if code == -1:
        return "was killed by a signal or lost its connection (no exit status)"
    if code < 0:
        return f"was killed by {_signal_name(-code)}"
    if code > 128 and _signal_name(code - 128, ""):
        return f"was killed by {_signal_name(code - 128)} (exit status {code})"
    return f"exited with status {code}"


def _signal_name(number: int, unknown: str | None = None) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}" if unknown is None else unknown
