"""Run a plan: start its launches through each host's transport, stream, collect, stop.

The runner never prints: each output line goes to an ``on_line`` callback and the
outcome comes back as data. It guarantees that when :func:`run_plan` returns or
raises (a failure, a timeout, Ctrl-C), no rank process is left on any host.

Before the ranks start, every host gets the run's directory and files (``Transport.prepare``)
and rank 0's host a port holder (``lab.rank.ports``) that chooses the run's rendezvous ports
there and holds them until the run ends; each launch then starts with the plan's macros
(``${run_dir}``, ``${portN}``) filled in for its host.

A launch is one process per host, the host's launcher, which starts the host's ranks (the lab's
zygote forks them, torchrun and mp.spawn start them). Every line of a rank's is tagged with it
(by the zygote, else by the rank's relay: lab.rank.output) and every event names its rank, so
each line reaches the right rank; torchrun numbers the ranks itself, so a rank's host is the one
whose launch its hello event came through.

Events come only through each rank's private channel (lab.rank.protocol): nothing a rank prints
is one. Every event is validated (``parse_event``) and checked against the run (an exercise of
the plan, a step it has). One that fails is not applied: it is the failure of the rank that sent
it, in the exercise that rank is in (``ExerciseRun.violations``), never the controller's; the run
goes on. Under ``--launcher lab`` the zygote has checked each event against the rank whose pipe it
came through (``lab.rank.zygote``): one in another rank's name comes as a ``bad`` event of its
sender's; under torchrun and mp.spawn an event's ``rank`` field says whose it is.

A watchdog gives every step a rank takes (start-up, rendezvous, one exercise) at most
``plan.timeout`` seconds, and every exercise a deadline as long, from when the rank began it,
that no later event moves (a step it is in already, or steps past as many as the plan has, do
not restart its clock either). A rank past either is hung: the runner asks every live rank for
its Python stacks (SIGUSR1, see lab.rank.worker), notes where each one stopped, and kills
them all.

Output is bounded, whatever a rank prints. One reader thread per stream (``_Reader``) reads
lines of at most EVENT_MAX bytes (the rest of a longer line is read in pieces and dropped,
never held) and sorts them itself:

* an event line of this run (``lab.rank.protocol``) goes whole to the controller's queue, also
  when output without a newline ran into it (it then starts a line of its own); one longer than
  EVENT_MAX, or past EVENTS_MAX bytes of a stream's events, is its sender's failure, not output;
* any other line is the output of a rank (or of a host's launcher itself): its ``Output``
  counts it (lines, bytes), keeps it, cut at LINE_MAX bytes, among its last TAIL_LINES
  lines (the report's "last lines"; past OUTPUT_MAX bytes of a rank's output its lines are
  counted, not kept), and only the first SHOWN_LINES of each rank go on
  to the queue and ``on_line``; then ``on_line`` is told once that the rest of that rank's
  output is counted, not shown, and the report says how much each such rank printed.

Past SHOWN_LINES of a rank, the lines of that rank already buffered in a local pipe are taken in
one block, counted with one pass over their bytes, so a flood of short lines costs no Python per
line. (SSH channels are read a line at a time.) The queue holds at most QUEUE_MAX items:
when the controller falls behind, the readers wait, the pipes fill and the ranks that print wait
in their writes (backpressure), while the watchdog, which only takes from the queue, keeps its
clock. While hung ranks dump their stacks (``dumping``), their stderr goes through whole.
"""
from __future__ import annotations

import functools
import logging
import queue
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal

from lab.core import slurm
from lab.core.plan import SRUN_LAUNCHERS, Launch, Plan, RankSpec, bind_macros
from lab.errors import HostsUnreachable, HostUnreachable, LabError, RunError
from lab.rank.protocol import (
    EVENT_MAX,
    EVENTS_MAX,
    LAUNCHER_EVENTS,
    LINE_MAX,
    MARK,
    RANK_EVENTS,
    MalformedEvent,
    parse_event,
    rank_tag,
    untag,
)
from lab.transport import (
    PACKAGE_DIR,
    RankProcess,
    Transport,
    code_uploads,
    for_each_host,
    release,
    transport_for,
)
from lab.transport.ssh import SSHSettings

log = logging.getLogger(__name__)

TAIL_LINES = 200  # the last lines of each rank's output kept (for the report)
SHOWN_LINES = 1000  # lines of each rank's output passed on to ``on_line``; the rest is counted, not shown
# LINE_MAX (lab.rank.protocol): bytes kept of a line of output; the rest of a longer one is counted and dropped
# EVENT_MAX (lab.rank.protocol): bytes an event line may have; a longer marked line is its sender's failure
OUTPUT_MAX = 64 << 20  # bytes of a rank's output whose lines are kept; past it they are counted only
QUEUE_MAX = 1024  # lines read and not yet handled; when full, the readers (and the ranks) wait
BATCH = 256  # queued items handled between two looks at the processes and the clock
DUMP_MAX = 10_000  # lines of one rank's stack dump kept
DUMP_WAIT = 1.5  # seconds to wait for stack dumps after SIGUSR1
CRASH_GRACE = 5.0  # seconds peers get to report after a rank died
STREAM_GRACE = 1.0  # seconds to wait for the last lines of a process that ended
PORTS_WAIT = 30.0  # seconds for rank 0's host to report the ports it holds


@dataclass(eq=False)
class Output:
    """What one rank (or a host's launcher itself) printed, within bounds whatever it prints:
    every line counted, the first SHOWN_LINES shown, the last TAIL_LINES kept (each cut at
    LINE_MAX bytes), the rest dropped. Its stdout and stderr readers both add to it."""

    lines: int = 0
    size: int = 0  # its bytes as printed, line ends included
    last: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, text: str, size: int) -> int:
        """Count a line of ``size`` bytes and keep ``text``, its start (up to OUTPUT_MAX bytes
        printed); how many lines so far."""
        with self.lock:
            self.lines += 1
            self.size += size
            if self.size <= OUTPUT_MAX:
                self.last.append(text)
            elif self.size - size <= OUTPUT_MAX:
                self.last.append(_PAST_MAX)
            return self.lines

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
        last = [_text(raw[len(tag):].rstrip(b"\r"), len(raw) + 1 - len(tag))
                for raw in block[:-1].rsplit(b"\n", TAIL_LINES)[-TAIL_LINES:]]
        with self.lock:
            self.last.extend(last if self.size <= OUTPUT_MAX else [*last, _PAST_MAX])

    @property
    def shown(self) -> int:
        return min(self.lines, SHOWN_LINES)

    @property
    def dropped(self) -> int:
        """Lines counted but never shown (some of the last ones are still in ``tail``)."""
        return self.lines - self.shown

    def tail(self) -> list[str]:
        with self.lock:
            return list(self.last)


_PAST_MAX = f"[lab: more than {OUTPUT_MAX >> 20} MiB printed: the rest was counted, not kept]"


def _text(raw: bytes, size: int, whole: bool = True) -> str:
    """A line of output as kept: at most LINE_MAX bytes of it, and a word where it was cut."""
    if whole and len(raw) <= LINE_MAX:
        return raw.decode("utf-8", "replace")
    return raw[:LINE_MAX].decode("utf-8", "replace") + f" [cut: {size} bytes]"


@dataclass
class LaunchState:
    """One started process: a rank, or a host's launcher and the ranks it started."""

    launch: Launch
    launcher: str
    process: RankProcess | None = None
    exit_code: int | None = None
    exited_at: float | None = None
    settled: bool = False  # its ranks were told it ended (once its last lines were read)
    open_streams: int = 2
    active_at: float = 0.0  # when a reader last read or queued one of its lines
    closed_at: float | None = None  # when a reader last met the end of one of its streams
    output: Output = field(default_factory=Output)  # a launcher's own lines (torchrun's)

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
    """What the controller knows about one rank while and after it runs."""

    spec: RankSpec
    launch: LaunchState
    step: str = "startup"
    step_started: float = field(default_factory=time.monotonic)
    done: bool = False  # the worker said it finished
    exit_code: int | None = None  # its launch's, once that ended
    fatal: str | None = None  # start-up or rendezvous failed outside any exercise
    info: dict[str, Any] = field(default_factory=dict)  # hostname, pid, torch version
    output: Output = field(default_factory=Output)
    dump: list[str] = field(default_factory=list)  # stack dump after SIGUSR1
    stopped_at: str | None = None  # where a hung rank was stopped
    ended_at: float | None = None  # when it was seen to end by itself (not killed by the lab)
    entered: dict[str, float] = field(default_factory=dict)  # exercise -> when the rank began it
    steps: int = 0  # step events taken (at most a plan's steps count)
    violations: list[str] = field(default_factory=list)  # events it sent that break the protocol

    @property
    def label(self) -> str:
        return f"{self.spec.host} r{self.spec.rank}"

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
    errors: dict[int, dict[str, str]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    calls: dict[int, Any] = field(default_factory=dict)  # the calls each rank made (lab.rank.calls)
    violations: dict[int, str] = field(default_factory=dict)  # rank -> the first event of its that broke the protocol

    def reported(self, rank: int) -> bool:
        return rank in self.results or rank in self.errors


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

    @property
    def master_port(self) -> int | None:
        """The port rank 0's store (or torchrun's rendezvous) listened on."""
        return int(bind_macros(self.plan.master_port, "", self.ports)) if self.plan.master_port and self.ports else None


RunStatus = Literal["completed", "timeout", "interrupted", "crashed"]
# (whose line, "out" | "err" | "lab" (the lab's own word about that output: the rest is not shown), line)
OnLine = Callable[["RankState | LaunchState", str, str], None]
# (launch index, "event" | "out" | "err" | "lab" | "end" (of one of its streams), whose line, line)
Item = tuple[int, str, "RankState | LaunchState | None", str]
Events = queue.Queue[Item]


def run_plan(plan: Plan, on_line: OnLine = lambda *_: None, keep: bool = False,
             ssh: SSHSettings | None = None, wall: float | None = None,
             stop: threading.Event | None = None) -> RunOutcome:
    """Run ``plan`` to the end, a timeout or an interrupt; leave nothing running.

    ``wall``: the longest the whole run may take (a timeout, like a step's). ``stop``: another
    thread's way to interrupt the run (as Ctrl-C does in this one)."""
    transports: dict[str, Transport] = {h.name: transport_for(h, ssh) for h in plan.hosts}
    launches = [LaunchState(launch, plan.launcher) for launch in plan.launches()]
    states = [RankState(spec, next(launch for launch in launches if spec.rank in launch.launch.ranks))
              for spec in plan.ranks]
    runs = {name: ExerciseRun(name) for name in plan.exercise_names}
    events: Events = queue.Queue(QUEUE_MAX)
    dumping = threading.Event()  # set while hung ranks dump their stacks: their stderr goes through whole
    stopped = threading.Event()  # set when the run is over: readers stop waiting for room in the queue
    started = time.monotonic()
    status: RunStatus = "completed"
    hung: list[int] = []
    holder: RankProcess | None = None
    ports: tuple[int, ...] = ()
    try:
        run_dirs = _prepare_all(plan, transports)
        if plan.launcher in SRUN_LAUNCHERS:
            _check_same_run_dir(plan, run_dirs)
        if plan.port_count:
            holder, ports = _hold_ports(plan, transports[plan.hosts[0].name])

        def start(launch: LaunchState) -> None:  # recorded at once, so `finally` stops it
            host = launch.launch.host
            launch.process = _start(plan, launch.launch.bound(run_dirs[host], ports), transports[host])

        with ThreadPoolExecutor(max_workers=min(32, len(launches))) as pool:
            for future in [pool.submit(start, launch) for launch in launches]:
                future.result()
        now = time.monotonic()
        for i, launch in enumerate(launches):
            assert launch.process is not None
            for stream_name, stream in (("out", launch.process.stdout), ("err", launch.process.stderr)):
                reader = _Reader(i, stream_name, launch, states, events, plan.token, dumping, stopped)
                threading.Thread(target=reader.pump, args=(stream,), name=f"lab-read-{i}-{stream_name}",
                                 daemon=True).start()
        for state in states:
            state.step_started = now
        limits = _Limits(started + wall if wall else None, stop or threading.Event())
        status, hung = _watch(plan, launches, states, runs, events, on_line, dumping, limits)
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        stopped.set()
        if holder is not None:
            holder.kill()
        _stop_all(launches, states, transports)
        if plan.launcher in SRUN_LAUNCHERS and status != "completed" and launches[0].process is not None:
            slurm.cancel(transports[plan.hosts[0].name], plan.job_name)
        also = [plan.shared_run_dir] if plan.shared_run_dir else []
        for_each_host(transports, lambda t: release(t, keep, also))
    if plan.launcher in SRUN_LAUNCHERS and not any(s.info for s in states):
        refused = slurm.refusal(launches[0].output.tail(), f"host {plan.hosts[0].name}")
        if refused is not None:
            raise refused
    walled = wall if status == "timeout" and wall and time.monotonic() - started >= wall else None
    return RunOutcome(plan, states, runs, status, time.monotonic() - started, hung, ports, walled)


@dataclass(frozen=True)
class _Limits:
    """What ends a run besides its ranks: the wall-clock deadline, and a stop asked by another thread."""

    deadline: float | None
    stop: threading.Event


def _prepare_all(plan: Plan, transports: dict[str, Transport]) -> dict[str, str]:
    """Reach every host at once and carry the run's files there; each host's run directory. A
    group never stops at the first failure: every host is tried, and every one that failed is named."""
    uploads = {**code_uploads(), **{rel: Path(local) for rel, local in plan.uploads.items()}}
    outcomes = for_each_host(transports, lambda t: t.prepare(plan.run_name, uploads))
    unreachable = [e for e in outcomes.values() if isinstance(e, HostUnreachable)]
    failed = [(name, e) for name, e in outcomes.items()
              if isinstance(e, Exception) and not isinstance(e, HostUnreachable)]
    if failed:
        name, error = failed[0]
        if isinstance(error, LabError):
            raise error
        raise RunError(f"host {name}: cannot prepare the run: {error}") from error
    if unreachable:
        raise HostsUnreachable.of(unreachable)
    return {name: str(run_dir) for name, run_dir in outcomes.items()}


def _check_same_run_dir(plan: Plan, run_dirs: dict[str, str]) -> None:
    """``srun`` starts every task in its own directory, the run's on the login host: every node
    needs the run's directory at that same path."""
    login = run_dirs[plan.hosts[0].name]
    other = next(((name, d) for name, d in run_dirs.items() if d != login), None)
    if other is not None:
        raise RunError(f"host {other[0]}: its run directory is {other[1]}, not {login} as on {plan.hosts[0].name}: "
                       f"srun runs the tasks in the same directory on every node (give the hosts the same TMPDIR)")


def _hold_ports(plan: Plan, transport: Transport) -> tuple[RankProcess, tuple[int, ...]]:
    """Start the port holder on rank 0's host: the process (kill it to free the ports) and the
    ports it holds for the run."""
    assert transport.run_dir is not None
    env = {"PYTHONPATH": f"{transport.run_dir}/code", "LAB_TOKEN": plan.token, "PYTHONUNBUFFERED": "1"}
    try:
        holder = transport.start([*transport.module_argv("lab.rank.ports"), str(plan.port_count)], env,
                                 transport.run_dir)
    except OSError as exc:
        raise RunError(f"host {transport.host.name}: cannot start the port holder: {exc}") from exc
    try:
        ports = _ports_in(_first_event(holder, plan.token, PORTS_WAIT))
    except BaseException:
        holder.kill()
        raise
    if len(ports) != plan.port_count:
        ended = holder.poll() is not None
        error = holder.stderr.read(LINE_MAX).decode("utf-8", "replace").strip().splitlines() if ended else []
        holder.kill()
        raise RunError(f"host {transport.host.name}: could not hold {plan.port_count} free port(s) for the "
                       f"rendezvous: {error[-1] if error else f'no answer within {PORTS_WAIT:g}s'}")
    return holder, ports


def _ports_in(event: dict[str, Any] | None) -> tuple[int, ...]:
    """The ports a ``ports`` event names; none when it is not one, or not a list of ports."""
    ports = event.get("ports") if event and event.get("event") == "ports" else None
    if not isinstance(ports, list) or not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
        return ()
    return tuple(ports)


def _first_event(process: RankProcess, token: str, timeout: float) -> dict[str, Any] | None:
    """The first event on ``process``'s stdout within ``timeout`` seconds (None: none came)."""
    found: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        try:
            for raw in iter(lambda: process.stdout.readline(EVENT_MAX + 1), b""):  # (a longer line is no event)
                event = parse_event(raw.decode("utf-8", "replace").rstrip("\r\n"), token)
                if event is not None:
                    found.put(event)
                    return
        except (OSError, ValueError):  # (MalformedEvent is a ValueError)
            pass
        found.put(None)

    threading.Thread(target=read, name="lab-read-ports", daemon=True).start()
    try:
        return found.get(timeout=timeout)
    except queue.Empty:
        return None


def _start(plan: Plan, launch: Launch, transport: Transport) -> RankProcess:
    try:
        assert transport.run_dir is not None
        return transport.start([transport.python, *launch.args], launch.env, transport.run_dir)
    except OSError as exc:
        raise RunError(f"host {launch.host}: cannot start its ranks ({plan.launcher}): {exc}") from exc


@dataclass
class _Reader:
    """Reads one stream of one launch to its end, within bounds (see the module's docstring)."""

    index: int  # the launch's
    stream: str  # "out" | "err"
    launch: LaunchState
    states: list[RankState]
    events: Events
    token: str
    dumping: threading.Event
    stopped: threading.Event

    def pump(self, stream: IO[bytes]) -> None:
        """Queue each event line whole, count each other line for its rank and queue the first
        SHOWN_LINES of them (all of stderr while ranks dump their stacks); queue "end" at the end."""
        prefix = f"{MARK}{self.token} ".encode() if self.stream == "out" else b""
        events = 0  # bytes of event lines read
        try:
            for raw, size, kind in _lines(stream, prefix, self._in_blocks, self._block):
                self.launch.active_at = time.monotonic()
                if kind == "lines":  # one rank's lines (_block)
                    rank = untag(raw[:TAG_MAX])[0]
                    assert rank is not None
                    self.states[rank].output.add_block(raw, rank_tag(rank))
                elif prefix and raw.startswith(prefix):  # an event line: whole, or too long to be one
                    events += size
                    if kind != "whole":
                        self._put("bad", self._sender(raw), f"sent an event line longer than {EVENT_MAX} bytes "
                                                            f"({size} bytes)")
                    elif events <= EVENTS_MAX:
                        self._put("event", None, raw.decode("utf-8", "replace"))
                    elif events - size <= EVENTS_MAX:
                        self._put("bad", self._sender(raw), f"sent more than {EVENTS_MAX >> 20} MiB of events "
                                                            f"(the rest were dropped)")
                else:
                    whose, body, size, whole = _whose_line(self.launch, self.states, raw, size, kind == "whole")
                    text = _text(body, size, whole)
                    count = whose.output.add(text, size)
                    if count <= SHOWN_LINES or (self.stream == "err" and self.dumping.is_set()):
                        self._put(self.stream, whose, text)
                    elif count == SHOWN_LINES + 1:
                        self._put("lab", whose, f"[lab: more than {SHOWN_LINES} lines: the rest of this "
                                                f"output is counted, not shown]")
        except (OSError, ValueError):
            pass
        finally:
            self.launch.closed_at = time.monotonic()
            self._put("end", None, "")

    def _sender(self, raw: bytes) -> RankState | LaunchState:
        """The rank an event line came from: the one the line names at its start (a line too long
        to be read whole), else the launch."""
        return _claimed(raw[:200].decode("utf-8", "replace"), self.states) or self.launch

    def _in_blocks(self) -> bool:
        """Whether to look for blocks: one of the launch's ranks is past SHOWN_LINES (and this is
        not stderr while ranks dump their stacks)."""
        return any(self.states[r].output.lines > SHOWN_LINES for r in self.launch.launch.ranks) and not (
            self.stream == "err" and self.dumping.is_set())

    def _block(self, data: bytes) -> int:
        """How much of ``data`` (whole lines, buffered) to take as one block: the lines at its
        start that are one rank's, if that rank is past SHOWN_LINES (0: none)."""
        rank, _, cut = untag(data[:TAG_MAX])
        if rank is None or cut is not None or not (
                rank < len(self.states) and self.states[rank].output.lines > SHOWN_LINES):
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
            self.launch.active_at = time.monotonic()
            return


TAG_MAX = 64  # bytes enough for any rank's tag


@functools.cache
def _other_line(tag: bytes) -> re.Pattern[bytes]:
    """A line end followed by a line that does not start with ``tag``."""
    return re.compile(rb"\n(?!" + re.escape(tag) + rb")")


LineKind = Literal["whole", "cut", "lines"]


def _lines(stream: IO[bytes], prefix: bytes, in_blocks: Callable[[], bool],
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


def _watch(plan: Plan, launches: list[LaunchState], states: list[RankState], runs: dict[str, ExerciseRun],
           events: Events, on_line: OnLine, dumping: threading.Event,
           limits: _Limits) -> tuple[RunStatus, list[int]]:
    """Consume events until every launch has finished, a rank hangs, one dies, the run's wall
    time is up or it is asked to stop."""
    crashed_at: float | None = None
    while not all(launch.finished for launch in launches):
        if limits.stop.is_set():
            return "interrupted", []
        for index, kind, whose, line in _take(events, 0.2):
            launch = launches[index]
            if kind == "end":
                launch.open_streams -= 1
            elif kind == "event":
                _on_event(plan, launch, states, runs, line)
            elif kind == "bad":
                _violation(runs, whose if isinstance(whose, RankState) else states[launch.launch.ranks[0]], line)
            elif whose is not None:
                on_line(whose, kind, line)
        now = time.monotonic()
        for launch in launches:
            if launch.exit_code is None and launch.process is not None:
                launch.exit_code = launch.process.poll()
                launch.exited_at = now if launch.exit_code is not None else None
            # Its ranks end with it once its last lines are read: they may say how each one ended.
            # (Its readers may be still busy with a flood it printed: the grace runs from their last line.)
            if launch.exited_at is not None and not launch.settled and (
                    launch.open_streams == 0 or now - max(launch.exited_at, launch.active_at) > STREAM_GRACE):
                launch.settled = True
                ended = _ended(plan, launch, states, now)
                crashed_at = crashed_at or ended
        if crashed_at is None and any(s.died for s in states):  # (a host's launcher said one ended)
            crashed_at = now
        if crashed_at is not None and now - crashed_at > CRASH_GRACE:
            return "crashed", []
        late = [s.spec.rank for s in states if s.exit_code is None and (
            now - s.step_started > plan.timeout or _past_deadline(s, runs, now, plan.timeout))]
        if limits.deadline is not None and now > limits.deadline:
            late = [s.spec.rank for s in states if s.exit_code is None]
        if late:
            _locate_hangs(plan, launches, states, events, dumping)
            return "timeout", late
    return ("completed" if all(s.done for s in states) else "crashed"), []


def _take(events: Events, wait: float) -> list[Item]:
    """The queued items, up to BATCH of them, waiting up to ``wait`` seconds for the first."""
    try:
        items = [events.get(timeout=wait)]
    except queue.Empty:
        return []
    while len(items) < BATCH:
        try:
            items.append(events.get_nowait())
        except queue.Empty:
            break
    return items


def _ended(plan: Plan, launch: LaunchState, states: list[RankState], now: float) -> float | None:
    """Its ranks ended with it; ``now`` if one of them had not finished (a crash)."""
    mine = [state for state in states if state.launch is launch]
    # when it ended: its streams' end, as its readers met it (so the first of several ranks
    # to die is told apart from those that followed it within the same look), else now
    ended = launch.closed_at if launch.open_streams == 0 and launch.closed_at is not None else now
    for state in mine:
        if state.exit_code is None:  # (a host's launcher may have said already how a rank ended)
            state.exit_code, state.step_started, state.ended_at = launch.exit_code, now, ended
        state.done |= bool(plan.script) and launch.exit_code == 0  # a script says nothing
    return now if any(not state.done for state in mine) else None


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


def _claimed(line: str, states: list[RankState]) -> RankState | None:
    """The rank an event line names (its ``rank`` field, found where JSON alone cannot read it)."""
    found = _RANK_FIELD.search(line)
    rank = int(found.group(1)) if found else -1
    return states[rank] if 0 <= rank < len(states) else None


def _on_event(plan: Plan, launch: LaunchState, states: list[RankState], runs: dict[str, ExerciseRun],
              line: str) -> None:
    """Check an event line of ``launch``'s stdout and apply it. One that breaks the protocol is not
    applied: it is the failure of the rank that sent it, the one it names (under ``--launcher lab``
    the zygote has made sure of that: ``lab.rank.zygote``)."""
    try:
        event = parse_event(line, plan.token)
    except MalformedEvent as exc:
        _violation(runs, _claimed(line[:200], states) or states[launch.launch.ranks[0]],
                   f"sent a malformed event: {exc}")
        return
    if event is None:
        return
    kind = event["event"]
    if kind not in RANK_EVENTS | LAUNCHER_EVENTS:
        _violation(runs, states[launch.launch.ranks[0]], f"sent a {kind!r} event, which no rank sends")
        return
    rank: int = event["rank"]
    if not 0 <= rank < len(states):
        _violation(runs, states[launch.launch.ranks[0]], f"sent an event as rank {rank}, which the run does not have")
        return
    state = states[rank]
    if kind in ("result", "error"):
        name = event["exercise"]
        if name not in runs:
            _violation(runs, state, f"reported on {name!r}, which is not an exercise of the run")
            return
        if runs[name].reported(rank):
            _violation(runs, state, f"reported on {name} twice")
            return
    if kind == "step" and not _known_step(event["step"], runs):
        _violation(runs, state, f"began a step the run does not have: {event['step'][:100]!r}")
        return
    _handle_event(plan, launch, state, runs, event)


def _known_step(step: str, runs: dict[str, ExerciseRun]) -> bool:
    """A worker's step: ``init:<method>``, an exercise's name, or ``wait:<exercise>``."""
    return step in runs or step.removeprefix("wait:") in runs or (step.startswith("init:") and len(step) < 100)


def _handle_event(plan: Plan, launch: LaunchState, state: RankState, runs: dict[str, ExerciseRun],
                  event: dict[str, Any]) -> None:
    """Apply a valid event (``lab.rank.protocol.check_event``) of ``state``'s rank."""
    rank, kind = state.spec.rank, event["event"]
    if kind == "step":
        # A step the rank is in already keeps its clock; so do steps past the plan's count of them,
        # and an exercise's deadline runs from when the rank first began it (_past_deadline).
        state.steps += 1
        if event["step"] != state.step and state.steps <= _step_budget(plan):
            state.step, state.step_started = event["step"], time.monotonic()
            if state.step in runs:
                state.entered.setdefault(state.step, state.step_started)
    elif kind == "hello":
        state.info = event
        host = _host_of(plan, launch, event["hostname"])
        if state.launch is not launch or state.spec.host != host or state.spec.local_rank != event["local_rank"]:
            # torchrun or Slurm placed it elsewhere than planned: it runs where it says it does
            state.launch = launch
            state.spec = replace(state.spec, host=host, local_rank=event["local_rank"])
    elif kind == "result":
        run = runs[event["exercise"]]
        run.results[rank] = event["value"]
        run.seconds[rank] = float(event["seconds"])
        run.calls[rank] = event.get("calls")
    elif kind == "error":
        runs[event["exercise"]].errors[rank] = {k: event[k] for k in ("error", "where", "traceback")}
    elif kind == "fatal":
        state.fatal = event["error"]
    elif kind == "exit":  # a host's launcher says how this rank ended, before it ends itself
        state.exit_code, state.ended_at = event["code"], time.monotonic()
        state.done |= bool(plan.script) and event["code"] == 0  # a script says nothing
    elif kind == "bad":  # the lab's launcher says the rank broke the protocol
        _violation(runs, state, event["what"])
    elif kind == "done":
        state.done = True


def _host_of(plan: Plan, launch: LaunchState, hostname: str) -> str:
    """The host a rank that said hello runs on: its launch's, or under Slurm (one launch for every
    node) the host its hostname names."""
    if plan.launcher not in SRUN_LAUNCHERS:
        return launch.launch.host
    names = {h.name for h in plan.hosts}
    return next((n for n in (hostname, hostname.split(".", 1)[0]) if n in names), launch.launch.host)


def _step_budget(plan: Plan) -> int:
    """The most step events a worker sends: a rendezvous per stage, an exercise and the barrier after it."""
    return 2 * len(plan.stages) + 2 * len(plan.exercise_names) + 2


def _past_deadline(state: RankState, runs: dict[str, ExerciseRun], now: float, timeout: float) -> bool:
    """Whether the rank is past an exercise's deadline: ``timeout`` seconds from when it began the
    exercise, whatever steps it took since, until it reports on it."""
    return any(now - began > timeout and not runs[name].reported(state.spec.rank)
               for name, began in state.entered.items())


VIOLATIONS_KEPT = 10  # of one rank's


def _violation(runs: dict[str, ExerciseRun], state: RankState, what: str) -> None:
    """The rank broke the protocol (``what``: "sent a malformed event: ..."): the exercise it is in
    fails for it (before any, its next one; after the last, the last one)."""
    log.debug("rank %d: %s", state.spec.rank, what)
    if len(state.violations) < VIOLATIONS_KEPT:
        state.violations.append(what)
    if not runs:
        state.fatal = state.fatal or what
        return
    step = state.step.removeprefix("wait:")
    name = step if step in runs else next((n for n, run in runs.items() if not run.reported(state.spec.rank)),
                                          list(runs)[-1])
    runs[name].violations.setdefault(state.spec.rank, what)


def _locate_hangs(plan: Plan, launches: list[LaunchState], states: list[RankState], events: Events,
                  dumping: threading.Event) -> None:
    """Ask every live rank for its stacks and note where each one stopped."""
    dumping.set()  # from now on the readers pass on every line of stderr, shown or not
    alive = [launch for launch in launches if launch.exit_code is None and launch.process is not None]
    for launch in alive:
        launch.process.signal(signal.SIGUSR1)  # type: ignore[union-attr]
    deadline = time.monotonic() + DUMP_WAIT
    while time.monotonic() < deadline:
        for _, kind, whose, line in _take(events, 0.1):
            if kind == "err" and isinstance(whose, RankState) and len(whose.dump) < DUMP_MAX and (
                    line.startswith(_THREAD) or _FRAME.match(line)):  # a rank that floods stderr floods no dump
                whose.dump.append(line)
    programs = _program_files(plan)
    for s in states:
        if s.exit_code is None:
            s.stopped_at = where_stopped(s.dump, programs)


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = ("Thread 0x", "Current thread 0x")  # how faulthandler starts each thread's stack


def where_stopped(dump: list[str], programs: dict[str, Path]) -> str | None:
    """Where a faulthandler dump shows the rank: the innermost frame inside an exercise
    program, as ``file.py:LINE in FUNC: source``; else the innermost frame of the thread
    that runs the exercises (the one with lab/rank/worker.py frames), e.g. inside torch."""
    threads: list[list[re.Match[str]]] = [[]]
    for text in dump:
        if text.startswith(_THREAD):
            threads.append([])
        elif m := _FRAME.match(text):
            threads[-1].append(m)
    frames = [f for t in threads for f in t]
    mine = [m for m in frames if Path(m["path"]).name in programs]
    main = next((t for t in threads if any(f["path"].endswith("lab/rank/worker.py") and f["func"] != "watch"
                                           for f in t)), None)
    candidates = mine or main or frames
    if not candidates:
        return None
    frame = candidates[0]
    name, line = Path(frame["path"]).name, int(frame["line"])
    source = ""
    local = programs.get(name)
    if local is not None and local.exists():
        lines = local.read_text(encoding="utf-8", errors="replace").splitlines()
        source = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f"{name}:{line} in {frame['func']}" + (f": {source}" if source else "")


def _program_files(plan: Plan) -> dict[str, Path]:
    """File name -> local path of every program the plan runs."""
    files = {Path(local).name: Path(local) for local in plan.uploads.values()}
    for stage in plan.stages:
        for exercise in stage.exercises:
            program = exercise["program"]
            if not program.endswith(".py"):
                path = PACKAGE_DIR.joinpath(*program.split(".")[1:]).with_suffix(".py")
                files[path.name] = path
    return files


def _stop_all(launches: list[LaunchState], states: list[RankState], transports: dict[str, Transport]) -> None:
    """Kill every launch's process group, on all hosts at once: one command per host for all its
    groups (``Transport.kill_all``: a session per rank would pass sshd's MaxSessions)."""
    started = [launch for launch in launches if launch.process is not None]
    by_host: dict[str, tuple[Transport, list[RankProcess]]] = {}
    for launch in started:
        assert launch.process is not None
        by_host.setdefault(launch.launch.host, (transports[launch.launch.host], []))[1].append(launch.process)
    for_each_host(by_host, lambda host: host[0].kill_all(host[1]))
    for launch in started:
        if launch.exit_code is None:
            launch.exit_code = launch.process.poll()  # type: ignore[union-attr]
    for state in states:
        if state.exit_code is None:
            state.exit_code = state.launch.exit_code
