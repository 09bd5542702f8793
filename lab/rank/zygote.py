"""``python -m lab.rank.node fork --nprocs N --first-rank F PROGRAM``: the one process per host of
``--launcher lab``, which imports torch once and forks the host's ranks from itself (a zygote).

Rank ``F + i`` gets RANK and LOCAL_RANK in its environment (the rest of the rendezvous settings
are the lab's, in this process's) and runs PROGRAM (``-m MODULE ARGS``: the lab's worker, or
``lab launch``'s script runner) as if it had been started alone: the same environment, its
``main()``, its ``atexit`` functions, its exit status. The ranks of a host so pay for one torch
import between them (about 2 s of CPU each, most of what a small exercise costs) and share its
memory until they write to it. Nothing of a student's runs in this process: only in the ranks.
Where the run drew inputs, this process opens its ranks' files and unlinks them before it forks
any rank, and hands each rank the descriptor of its own alone (``lab.rank.inputs``); it is not
dumpable, so no rank can reach the others' through it. Where the controller asks (``lab grade``'s
one-container sandbox: ``lab.rank.isolation.USERS_VAR``), each rank is kept apart from the others
as a user of its own, in mount and IPC namespaces of its own, before anything of it runs
(``lab.rank.isolation``); the run directory is opened to their users for reading first.

Each rank's fds 1 and 2 are pipes of its own to this process, which passes what comes through
them on to the controller (this process's stdout and stderr), so the controller knows which rank
wrote what without taking any rank's word for it (:class:`StreamFilter`):

* every line of output gets the rank's tag (``lab.rank.protocol.rank_tag``), and any unit
  separator in it is neutralized, as the rank's relay (``lab.rank.output``) does: only the rank's
  channel writes a mark, at the start of a line (or between two pieces of a long line);
* an event line goes on as it came if it is a valid event of this run (``parse_event``), of a
  kind a rank sends, in the rank's own name; any other is dropped, and a ``bad`` event says which
  rank sent what ("sent an event as rank 0 (a rank speaks for itself only)"): its failure;
* when a rank has ended and its streams have (or RELAY_WAIT later), an ``exit`` event says how;
* where the controller asks (``lab grade``: ``LAB_WIRE``), what the host's connections carried
  while its ranks ran, measured from here (:class:`Measure`, ``lab.rank.wire``), in a ``wire``
  event once they have all ended.

This process ends when every rank has (its status: 0 if every rank's was 0, else 1). The
controller closing its stdin (going away) kills the whole process group at once. SIGUSR1 (the lab
asking for stacks) is for the ranks, which are in this process's group: ignored here. Every rank
is forked from a process with one thread: its start-up helper (the pulse, the preflight) is a
process of its own (``lab.rank.preflight``), and this process starts no thread.
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import os
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import NoReturn

from lab.rank import inputs, isolation
from lab.rank.events import MalformedEvent, RankEvent, parse_event
from lab.rank.output import HOLD
from lab.rank.preflight import StartupHelper
from lab.rank.protocol import (
    EVENT_MAX,
    LINE_MAX,
    NEUTRAL,
    UNIT_SEPARATOR,
    EventBudget,
    event_line,
    rank_tag,
    write_all,
)
from lab.rank.reaper import LIVE
from lab.rank.stdin import EVERY_RANK, HOLD_MAX, RANK_0, STDIN_VAR, Feeder
from lab.rank.wire import MODES, WIRE_VAR, Wire, space
from lab.rank.worker import RELAY_WAIT, TOKEN_VAR, WATCHED_BY_PARENT

# What every rank imports, imported here once before the ranks are forked. A module that fails to
# import is left to the ranks, which report the error as theirs (a host without torch, say).
PRELOAD = ("torch", "torch.distributed", "torch.multiprocessing", "torch.nn.parallel", "torch.utils.data",
           "lab.rank.calls", "lab.rank.worker", "lab.rank.script", "lab.suite.registry")
READ = 65536  # bytes read from a rank's pipe at a time
STREAMS_WAIT = RELAY_WAIT + 0.5  # seconds a rank's streams get to end after it has


@dataclass
class StreamFilter:
    """What one of a rank's streams passes on to the controller (see the module): fed the bytes
    as they come, it gives back what to write. It holds at most HOLD bytes of a line of output and
    EVENT_MAX of an event line; the start of a longer line of output is passed on when it ends,
    tagged with its size (``rank_tag(rank, size)``), and the rest dropped, so that the lines of the
    host's ranks never run into one another."""

    rank: int
    token: str
    events: bool  # its stdout: the rank's channel writes its events into it
    line: bytes = b""  # the start of the line of output it is in, not passed on yet
    cut: int = 0  # in a line longer than HOLD: its size so far (``line`` holds its first LINE_MAX bytes)
    event: bytes = b""  # the start of an event line, not passed on yet
    skipping: bool = False  # in a marked line longer than an event may be: dropped to its end
    budget: EventBudget = field(default_factory=EventBudget)  # of its event lines
    tag: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.tag = rank_tag(self.rank)

    def feed(self, data: bytes) -> bytes:
        """Output comes between event lines; an event line starts with a unit separator (the relay
        neutralizes every other one), also between two pieces of a long line of output."""
        out: list[bytes] = []
        while data:
            if self.event or self.skipping or (self.events and data[:1] == UNIT_SEPARATOR):
                end = data.find(b"\n") + 1
                piece, data = (data[:end], data[end:]) if end else (data, b"")
                out.append(self._event_piece(piece))
            else:
                mark = data.find(UNIT_SEPARATOR) if self.events else -1
                piece, data = (data[:mark], data[mark:]) if mark >= 0 else (data, b"")
                out.append(self._output(piece))
        return b"".join(out)

    def close(self) -> bytes:
        """What is left at the end of the stream: a last line without its newline."""
        rest = self._event_piece(b"\n") if self.event else b""
        self.skipping = False
        return rest + (self._output(b"\n") if self.line or self.cut else b"")

    def _output(self, data: bytes) -> bytes:
        """Output: the lines it ends, tagged (a unit separator on stderr neutralized)."""
        data = data.replace(UNIT_SEPARATOR, NEUTRAL)
        end = data.rfind(b"\n") + 1
        if not end:
            self._grow(data)
            return b""
        first = data.find(b"\n") + 1
        if self.cut:
            out = rank_tag(self.rank, self.cut + first) + self.line + b"\n"
        else:
            out = self.tag + self.line + data[:first]
        self.line, self.cut = b"", 0
        if end > first:  # whole lines after it
            out += self.tag + data[first:end - 1].replace(b"\n", b"\n" + self.tag) + b"\n"
        self._grow(data[end:])
        return out

    def _grow(self, data: bytes) -> None:
        """More of the line it is in, without its end."""
        if self.cut:
            self.cut += len(data)
            return
        self.line += data
        if len(self.line) > HOLD:
            self.line, self.cut = self.line[:LINE_MAX], len(self.line)

    def _event_piece(self, data: bytes) -> bytes:
        """A piece of an event line: what to pass on once the line is whole."""
        if self.skipping:
            self.skipping = not data.endswith(b"\n")
            return b""
        self.event += data
        if len(self.event) > EVENT_MAX + 1:
            self.event, self.skipping = b"", not data.endswith(b"\n")
            return self._bad(f"sent an event line longer than {EVENT_MAX} bytes")
        if not data.endswith(b"\n"):
            return b""
        line, self.event = self.event[:-1], b""
        return self._event(line)

    def _event(self, line: bytes) -> bytes:
        """A marked line (without its newline): the event to pass on, a ``bad`` event in its place,
        or output, when it is marked as no event of this run is."""
        if not self.budget.take(line.partition(b" ")[2], len(line) + 1):  # (its JSON: after the mark and token)
            return self._bad(self.budget.over) if self.budget.first_over else b""
        try:
            event = parse_event(line.decode("utf-8", "replace"), self.token)
        except MalformedEvent as exc:
            return self._bad(f"sent a malformed event: {exc}")
        if event is None:  # (a line of its own: output before a mark ends where the mark starts)
            return self.tag + line.replace(UNIT_SEPARATOR, NEUTRAL) + b"\n"
        if event.SENDER != "rank" or not isinstance(event, RankEvent):
            return self._bad(f"sent a {event.kind!r} event, which no rank sends")
        if event.rank != self.rank:
            return self._bad(f"sent an event as rank {event.rank} (a rank speaks for itself only)")
        return line + b"\n"

    def _bad(self, what: str) -> bytes:
        return event_line(self.token, "bad", rank=self.rank, what=what).encode()


@dataclass
class Measure:
    """What the host's connections carry while its ranks run, where the controller asked (``WIRE_VAR``
    names the mode: ``lab.rank.wire``): said in a ``wire`` event when they have all ended, which no
    rank can send (:class:`StreamFilter` drops it), nor alter."""

    asked: bool = False
    wire: Wire | None = None
    error: str = ""  # why it could not begin (the kernel has no socket diagnostics)
    failed: str = ""  # why it stopped while the ranks ran: what it counted is no measure

    @classmethod
    def begin(cls, mode: str | None) -> Measure:
        if not mode:
            return cls()
        if mode not in MODES:
            return cls(True, error=f"no such mode of measure: {mode[:40]!r}")
        try:
            return cls(True, Wire.start(mode))
        except OSError as exc:
            return cls(True, error=f"the kernel's socket diagnostics: {exc.strerror or exc}")

    @property
    def fds(self) -> list[int]:
        """Its descriptor (every rank closes it): readable when sockets have closed."""
        return [self.wire.fileno()] if self.wire is not None else []

    def look(self, closed: bool) -> None:
        if self.wire is None:
            return
        try:
            if closed:
                self.wire.take_closed()
            self.wire.poll()
        except OSError as exc:
            self._failed(exc)

    def end(self) -> dict[str, object]:
        """The ``wire`` event's fields: the bytes carried, the destroy messages lost, why not measured."""
        carried, lost = 0, 0
        if self.wire is not None:
            try:
                carried, lost = self.wire.carried(), self.wire.lost
            except OSError as exc:
                self._failed(exc)
        shared = space() if self.wire is not None and self.wire.mode == "netns" else ""
        return {"carried": carried, "lost": lost, **({"error": self.error} if self.error else {}),
                **({"failed": self.failed} if self.failed else {}), **({"space": shared} if shared else {})}

    def _failed(self, exc: OSError) -> None:
        self.failed = f"the kernel's socket diagnostics failed: {exc.strerror or exc}"
        if self.wire is not None:
            self.wire.close()
            self.wire = None


@dataclass
class Rank:
    """A forked rank, as this process sees it."""

    rank: int
    pid: int
    pipes: dict[int, tuple[StreamFilter, int]]  # read end -> (its stream filter, the fd of ours it goes on to)
    code: int | None = None  # its exit status (-N: killed by signal N), once it ended
    ended_at: float = 0.0
    reported: bool = False


def main(options: argparse.Namespace, first_local_rank: int = 0,
         helper: StartupHelper | None = None) -> NoReturn:
    """Fork ``options.nprocs`` ranks from ``options.first_rank`` on (``lab.rank.node.host_ranks``;
    their local ranks from ``first_local_rank`` on), each running ``options.module``'s main with
    ``options.args`` (once torch is imported and its start-up ``helper`` has ended: with a preflight,
    passed);
    pass their streams on until all end, then end at once: this process ran no
    program's code, so it skips the interpreter's teardown, which with torch loaded takes about
    a second that every run would wait for."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # (each rank installs its stack dump)
    inputs.not_dumpable()  # (its ranks' inputs pass through: lab.rank.inputs)
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if helper is not None:  # (it has ended when this returns)
        helper.end()
    os.environ[WATCHED_BY_PARENT] = "1"  # this process watches stdin for them all
    token = os.environ.get(TOKEN_VAR, "")
    held = inputs.hold(range(options.first_rank, options.first_rank + options.nprocs))
    users = os.environ.pop(isolation.USERS_VAR, None)  # (each rank a user of its own: lab.rank.isolation)
    first_user = int(users) if users is not None else None
    if first_user is not None:
        isolation.open_run_dir(os.getcwd(), private=(inputs.INPUTS_DIR, LIVE))
    measure = Measure.begin(os.environ.get(WIRE_VAR))
    # the ranks whose stdin is the controller's (lab.rank.stdin): rank 0, or every rank (a notebook's)
    asked = os.environ.pop(STDIN_VAR, "")
    reading = asked == EVERY_RANK or asked == RANK_0 and options.first_rank == 0
    ranks: list[Rank] = []
    feeders: list[Feeder] = []
    for local_rank in range(options.nprocs):
        rank = options.first_rank + local_rank
        stdin = os.pipe() if reading and (asked == EVERY_RANK or rank == 0) else None
        feeding = [f.fd for f in feeders if f.fd is not None] + ([stdin[1]] if stdin else [])
        ranks.append(_fork(rank, first_local_rank + local_rank, options.module, options.args, token,
                           [fd for r in ranks for fd in r.pipes] + measure.fds + feeding, held,
                           stdin[0] if stdin else None,
                           isolation.user_of(first_user, rank) if first_user is not None else None))
        if stdin:
            os.close(stdin[0])  # (the rank has it; no rank after it does)
            feeders.append(Feeder(stdin[1], rank))
    for fd in held.values():
        os.close(fd)
    _pass_on(ranks, token, measure, feeders)
    if measure.asked:
        _write(1, event_line(token, "wire", rank=options.first_rank, **measure.end()).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if all(r.code == 0 for r in ranks) else 1)


def _fork(rank: int, local_rank: int, module: str, args: list[str], token: str, others: list[int],
          held: dict[int, int], stdin: int | None = None, user: int | None = None) -> Rank:
    """Start rank ``rank``: a child with pipes of its own for fds 1 and 2, ``stdin`` for its stdin
    (else /dev/null), and the descriptor of its own inputs of those ``held`` (rank -> fd; the
    others' it closes, and ``others``); where ``user`` is given, kept apart from the others as that
    user (lab.rank.isolation), or ended at once, saying why on its stderr."""
    sys.stdout.flush()
    sys.stderr.flush()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            for fd in (out_r, out_w, err_r, err_w, *others, *(fd for r, fd in held.items() if r != rank)):
                os.close(fd)
            if rank in held:
                os.environ[inputs.FD_VAR] = str(held[rank])
            given = os.open(os.devnull, os.O_RDONLY) if stdin is None else stdin
            os.dup2(given, 0)
            os.close(given)
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank))
            sys.argv = [module, *args]
            if user is not None:
                isolation.enter(user, os.getcwd())
        except isolation.IsolationError as exc:
            _write(2, f"lab: rank {rank}: {exc}\n".encode())
            os._exit(127)
        except BaseException:
            os._exit(127)
        _run_main(module)
    os.close(out_w)
    os.close(err_w)
    return Rank(rank, pid, {out_r: (StreamFilter(rank, token, events=True), 1),
                            err_r: (StreamFilter(rank, token, events=False), 2)})


def _run_main(module: str) -> NoReturn:
    """In a forked rank: ``module.main()``, then end as the interpreter would have, never returning
    into this process's loop: wait for the program's other threads, run its ``atexit`` functions
    (the worker's waits for its relay), flush, and exit with the status ``sys.exit`` asked for."""
    try:
        code = _status(importlib.import_module(module).main())
    except SystemExit as exc:
        code = _status(exc.code)
    except BaseException:  # as the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()  # (what the interpreter runs at exit; os._exit does not)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 1
    os._exit(code)


def _status(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _pass_on(ranks: list[Rank], token: str, measure: Measure, feeders: list[Feeder]) -> None:
    """Pass the ranks' streams on, reap them and report each one's end, until all have ended,
    measuring the host's connections all the while (where asked), and the controller's frames to
    the stdin of the ranks that read them (``feeders``: lab.rank.stdin). Stdin closing (the
    controller is gone) or the controller's streams breaking kills the group."""
    stdin_open, dropped_said = True, set()
    while not all(r.reported for r in ranks):
        measured = measure.fds  # (taken once: a measure that fails in look() has none after it)
        fds = [fd for r in ranks for fd in r.pipes] + ([0] if stdin_open else []) + measured
        feeding = [f.fd for f in feeders if f.fd is not None and f.waiting]
        ready, writable, _ = select.select(fds, feeding, [], 0.1)
        measure.look(closed=any(fd in measured for fd in ready))
        for feeder in feeders:
            if feeder.fd in writable:
                feeder.write()
        for fd in ready:
            if fd == 0:
                stdin_open = _stdin_is_open(feeders)
                for feeder in feeders:
                    if feeder.dropped and feeder.rank not in dropped_said:
                        _write(2, f"lab: rank {feeder.rank} has not read {HOLD_MAX >> 20} MiB of its stdin: the rest "
                                  "of it is dropped\n".encode())
                        dropped_said.add(feeder.rank)
                continue
            if fd in measured:
                continue
            rank = next(r for r in ranks if fd in r.pipes)
            stream_filter, target = rank.pipes[fd]
            data = os.read(fd, READ)
            _write(target, stream_filter.feed(data) if data else stream_filter.close())
            if not data:
                _close(rank, fd)
        _reap(ranks)
        now = time.monotonic()
        for rank in ranks:
            if rank.code is not None and not rank.reported and (not rank.pipes or now - rank.ended_at > STREAMS_WAIT):
                for fd in list(rank.pipes):  # (a process the rank left holds them: what came, came)
                    _write(rank.pipes[fd][1], rank.pipes[fd][0].close())
                    _close(rank, fd)
                _write(1, event_line(token, "exit", rank=rank.rank, code=rank.code).encode())
                rank.reported = True


def _stdin_is_open(feeders: list[Feeder]) -> bool:
    """Read what the controller sent (for the ranks' stdin, ``feeders``), whether it is still there."""
    try:
        data = os.read(0, READ)
        if data:
            for feeder in feeders:
                feeder.take(data)
            return True
    except (OSError, ValueError):  # (ValueError: not the frames of lab.rank.stdin)
        pass
    os.killpg(0, signal.SIGKILL)  # the controller is gone: so are we, and every rank
    return False


def _write(fd: int, data: bytes) -> None:
    try:
        write_all(fd, data)
    except OSError:  # the controller's stream is gone
        os.killpg(0, signal.SIGKILL)


def _close(rank: Rank, fd: int) -> None:
    os.close(fd)
    del rank.pipes[fd]


def _reap(ranks: list[Rank]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        for rank in ranks:
            if rank.pid == pid:
                rank.code, rank.ended_at = os.waitstatus_to_exitcode(status), time.monotonic()
