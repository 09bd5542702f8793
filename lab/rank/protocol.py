"""How the processes the lab starts on a host talk to the controller.

Every such process (a rank's worker or script, a host's launcher, the doctor's probe, the port
holder) reports on its stdout in *event lines*::

    <MARK><token> <JSON object with an "event" field>

The mark starts with an ASCII unit separator, which nothing prints by chance; the token is the
run's own (``Plan.token``), so lines of another run, or a token-less imitation, are not events
of this one. Everything else a process prints is its output and is shown as such.

Before anything else, every process the lab starts says which process group to signal, in
one line of its own: ``lab-pid:<pgid>`` (``lab.rank.reaper`` writes it).

**A rank's channel.** A rank runs a student's code, which must not be able to speak for the
lab. So a rank (``lab.rank.worker.start_rank``), before it imports torch or any exercise
program, keeps its real stdout as a private descriptor of its own (close-on-exec: no program it
starts inherits it): its :data:`CHANNEL`, the only way its events go out. Its descriptors 1 and 2
become pipes to a small relay process (``lab.rank.output``) that copies whatever the rank and
its children write there, line by line, with every unit separator (the first byte of a mark)
replaced by ``␟``: nothing a rank prints, writes to fd 1 or 2 or ``sys.__stdout__``, or a process
it starts prints, can be read as an event, whoever knows the token. The relay is a process of its
own, so a rank that ends itself (``os._exit``, a signal) loses none of its last lines. The rank
takes LAB_TOKEN (and the plan that holds it) out of its environment before any program loads.

What that does not do: isolate the rank's own process. Code running in it (the exercise program)
can find the channel's descriptor (``/proc/self/fd``, this module's CHANNEL, a fork before the
exec) and the token (``/proc/self/environ`` still holds the environment the rank started with),
and write event lines there. The controller limits what such lines can do: every event is
validated here (:func:`parse_event`: the fields of its kind, their types), and one that is not
valid is the failure of the rank it came through, named ("rank 1 sent a malformed event: ...");
under ``--launcher lab`` an event's rank is the one whose pipe it came through (the host's
zygote, ``lab.rank.zygote``, checks it), and one that claims another rank fails its sender; a
rank's ``step`` events cannot keep it alive past its exercise's deadline (the runner's watchdog).

A host's ranks reach the controller through one process's streams (the host's launcher), so
every other line is tagged with the rank that wrote it::

    <RANK_TAG><rank> <the line as the rank wrote it>
    <RANK_TAG><rank>/<size> <the start of a longer line, of size bytes, that the zygote cut>

Under ``--launcher lab`` the zygote tags each line with the rank whose pipe it came through;
under torchrun and mp.spawn each rank's relay (``lab.rank.output``) tags its own, and the
controller takes an event's rank from its ``rank`` field (each rank's channel is its own, as above).

The events, by who sends them (fields besides ``event``):

========  ==========================================  ==============================================
event     fields                                      meaning
========  ==========================================  ==============================================
hello     rank, pid, hostname, local_rank,            a rank is up, and where it runs (worker,
          [python, torch, restart]                    script); ``restart``: how many times torchrun
                                                      restarted the ranks before (``--max-restarts``)
step      rank, step                                  the rank begins a step: ``init:<method>``, an
                                                      exercise's name, or ``wait:<exercise>`` (the
                                                      barrier after it)
result    rank, exercise, value, seconds, [calls]     an exercise returned ``value`` (JSON; tensors
                                                      as lists)
error     rank, exercise, error, where, traceback,    an exercise raised
          [calls]
fatal     rank, error, traceback                      start-up failed outside any exercise
done      rank, failures                              the rank ran every stage
progress  rank, completed, inflight, moved, quiet,    the rank's torch.distributed calls completed so
          [at]                                        far and the one it blocks in (or null), when
                                                      they changed and each second one blocks, with
                                                      the bytes its connections carried and the
                                                      seconds none moved (``lab.rank.watcher``), and
                                                      the rank's clock as it sent it
flight    rank, records, inflight, counts, dropped,   the rank's flight recorder: its last calls, those
          [steps]                                     in flight, completed calls per group and op,
                                                      a DDP program's last forwards and backward
                                                      passes (a call blocked 2 s, and at its end)
trace     rank, records, dropped                      with --trace, each second: the records that
                                                      began or ended since the last (and how many
                                                      calls the ring let go of before it was sent)
torchdump rank, dump                                  with --fr-dir, with each flight dump: torch's
                                                      own flight recorder, as it dumps itself
died      rank, call, [oom]                           the rank's relay, once the rank ended and its
                                                      streams closed, where it died in a call (the
                                                      record ``call``) or the kernel's log says it
                                                      killed it for memory (``oom``: that line)
                                                      (``lab.rank.lastcall``)
end       rank, how, code, error, where, traceback    a script's program (``lab.rank.script``) ended
                                                      other than by returning: ``how`` "raised" (an
                                                      exception it did not catch: ``code`` 1, ``error``
                                                      ``Type: message``, ``traceback`` without the
                                                      lab's frames) or "exited" (``sys.exit``, exit(),
                                                      ``os._exit``: ``code`` the status it exits with,
                                                      ``error`` the call, ``traceback`` ""); ``where``
                                                      the user's line (``file.py:LINE``) or ""; before
                                                      its last ``flight``
saved     rank, path, size                            a launch's rank saved ``path`` (``size`` bytes)
                                                      with torch.save (``--sync-back``:
                                                      ``lab.rank.saves``), at most once a second
exit      rank, code                                  a host's launcher (``lab.rank.node``) says how
                                                      one of its ranks ended, before it ends itself
bad       rank, what                                  the lab's launcher (``lab.rank.zygote``) says
                                                      one of its ranks broke the protocol: ``what``
                                                      it sent (the event is not passed on)
ports     ports                                       the port holder (``lab.rank.ports``) holds
                                                      these ports on rank 0's host for the run
facts     see ``lab.rank.probe``                      the doctor's probe: the host's facts
runtime   torch, cuda_devices, nccl, ...              the probe: what torch says on the host
links     links                                       the probe: its connections to its targets
heard     sources, lookups                            the probe: who connected to its listeners
cell      rank, n, name, ended, ranks, [error]        a notebook's rank (``lab.rank.cells``) begins
                                                      (``ended`` false) or has ended (true) cell
                                                      ``n`` (``name``), which was sent to ``ranks``;
                                                      ``error``: the exception it raised
alive     rank, cpu                                   a rank in start-up (``lab.rank.worker``), each
                                                      second until its first step: the CPU seconds
                                                      its process has used
pulse     cpu                                         a host's launcher in its preflight
                                                      (``lab.rank.preflight``), each second: the CPU
                                                      seconds it has used (importing torch)
========  ==========================================  ==============================================

The controller takes each event as an instance of its kind's class (``lab.rank.events``), checked
against the table's fields. The processes that send events write them by kind and fields
(:func:`event_line`, :func:`emit`).

An event line has at most EVENT_MAX bytes: a longer one is no event (a rank whose result is
larger reports an error instead).

Standard library only: this module runs on every host.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sys
import threading
import time
from typing import Any, Final, Literal, get_args

MARK: Final = "\x1flab:"
RANK_TAG: Final = "\x1flab-rank:"
PID_MARK: Final = b"lab-pid:"  # the first line of every started process: its group (lab.rank.reaper)
UNIT_SEPARATOR: Final = b"\x1f"  # the first byte of every mark: never in what a relay passes on
NEUTRAL: Final = "\u241f".encode()  # what a relay writes in its place: ␟
EVENT_MAX: Final = 1 << 20  # bytes an event line may have (a result is tens of KB); a longer one is no event
LINE_MAX: Final = 4096  # bytes the controller keeps of a line of output; the rest of a longer one is counted
EVENTS_MAX: Final = 64 << 20  # bytes of event lines taken from one rank (or one stream); past it they are dropped
# how those lines' JSON starts (and a launch's saves, at most one a second: lab.rank.saves)
FLIGHT_EVENTS: Final = (b'{"event": "progress"', b'{"event": "flight"', b'{"event": "saved"')
FLIGHT_RATE: Final = 4096  # bytes a second of them, for each rank, allowed past EVENTS_MAX (see EventBudget)

EventKind = Literal["hello", "step", "result", "error", "fatal", "done", "progress", "flight", "trace", "torchdump",
                    "died", "end", "exit", "bad", "ports", "facts", "runtime", "links", "heard", "closed", "wire",
                    "alive", "pulse", "saved", "cell"]
EVENT_KINDS: Final[frozenset[str]] = frozenset(get_args(EventKind))  # (who sends each: lab.rank.events)


def event_line(token: str, event: EventKind, **fields: Any) -> str:
    """One event as the line that carries it (with its newline); tensors become lists."""
    return f"{MARK}{token} {json.dumps({'event': event, **fields}, default=_jsonable)}\n"


class EventBudget:
    """How many bytes of event lines a rank (or a launch's stream, for ``ranks`` ranks) may send: the
    flight recorder's events (lab.rank.watcher: progress at most once a second, dumps within their own
    budget) go on for as long as a job runs, so they are counted apart, against EVENTS_MAX and
    FLIGHT_RATE more bytes a second for each rank: an honest job of days never passes it. The others
    against EVENTS_MAX. Past either, the rest of that kind is dropped: the sender's failure, said once."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.events = self.flight = 0
        self.first_over = False  # the last event taken was the first past the budget
        self.over = ""  # what was passed

    def take(self, body: bytes, size: int, ranks: int = 1) -> bool:
        """Whether an event line of ``size`` bytes (``body``: its JSON) is within the budget."""
        if body.startswith(FLIGHT_EVENTS):
            before, self.flight = self.flight, self.flight + size
            allowed = EVENTS_MAX + FLIGHT_RATE * max(1, ranks) * (time.monotonic() - self.started)
            what = f"sent its flight recorder's events faster than {FLIGHT_RATE} bytes a second"
        else:
            before, self.events = self.events, self.events + size
            allowed, what = EVENTS_MAX, f"sent more than {EVENTS_MAX >> 20} MiB of events"
        if before + size <= allowed:
            self.first_over = False
            return True
        self.first_over = not self.over
        self.over = self.over or f"{what} (the rest were dropped)"
        return False


class Channel:
    """A rank's private way to the controller: a descriptor on its real stdout (see the module).

    Each event is written whole, holding an flock of the stream that every writer into it (the
    rank's relay, the other ranks of its host and their relays) takes on an open file of its own,
    so that no line of theirs comes in the middle of it."""

    def __init__(self, fd: int, token: str) -> None:
        self.fd, self.token = fd, token
        self.lock = lock_for(fd)
        self._mutex = threading.Lock()  # (an flock does not keep two threads of one process apart)

    def send(self, event: EventKind, **fields: Any) -> None:
        self.write(event_line(self.token, event, **fields).encode())

    def write(self, line: bytes) -> None:
        """Write ``line`` (an event line, newline included) whole."""
        with self._mutex:
            write_all(self.fd, line, self.lock)


CHANNEL: Channel | None = None  # this process's channel, once it has one (lab.rank.worker.start_rank)


def emit(token: str, event: EventKind, **fields: Any) -> None:
    """Send one event: through this process's channel if it has one, else on its stdout, flushed."""
    if CHANNEL is not None:
        CHANNEL.send(event, **fields)
        return
    sys.stdout.write(event_line(token, event, **fields))
    sys.stdout.flush()


def is_event_line(line: bytes) -> bool:
    """Whether a raw line is an event line of any run."""
    return line.startswith(MARK.encode())


def rank_tag(rank: int, size: int | None = None) -> bytes:
    """The prefix of a line that ``rank`` wrote into streams it shares with other ranks; given
    ``size``, of the start of a line of ``size`` bytes (its end included), cut by the lab's launcher."""
    return f"{RANK_TAG}{rank}{'' if size is None else f'/{size}'} ".encode()


_TAG = re.compile(re.escape(RANK_TAG.encode()) + rb"(\d{1,9})(?:/(\d{1,15}))? ")


def untag(line: bytes) -> tuple[int | None, bytes, int | None]:
    """The rank a tagged line came from, the line as the rank wrote it (its start, if it was cut)
    and, for a cut line, its size; (None, line, None) if it is not tagged."""
    found = _TAG.match(line)
    if found is None:
        return None, line, None
    return int(found[1]), line[found.end():], int(found[2]) if found[2] else None


def lock_for(fd: int) -> int | None:
    """An open file of its own on what ``fd`` writes to, to flock (None where there is none: not
    Linux, or not a pipe)."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None


def write_all(fd: int, data: bytes, lock: int | None = None) -> None:
    """Write all of ``data`` to ``fd``, holding ``lock``'s flock (if any) so that no other writer's
    line comes in between."""
    if not data:
        return
    with contextlib.ExitStack() as held:
        if lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_EX)
                held.callback(fcntl.flock, lock, fcntl.LOCK_UN)
        while data:
            data = data[os.write(fd, data):]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


def report_exits(codes: dict[int, int]) -> None:
    """A host's launcher tells the controller how each failed rank ended, in the order they ended
    (its own exit code is one for all): ``exit`` events on its stdout, in whole lines (the ranks'
    relays write there too)."""
    sys.stdout.flush()
    channel = Channel(1, os.environ.get("LAB_TOKEN", ""))
    for rank, code in codes.items():
        channel.send("exit", rank=rank, code=code)
