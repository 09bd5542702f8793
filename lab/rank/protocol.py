"""How the processes the lab starts on a host talk to the controller.

Every such process (a rank's worker or script, a host's launcher, the doctor's probe, the port
holder) reports on its stdout in *event lines*::

    <MARK><token> <JSON object with an "event" field>

The mark starts with an ASCII unit separator, which nothing prints by chance; the token is the
run's own (``Plan.token``), so lines of another run, or a token-less imitation, are not events
of this one. Everything else a process prints is its output and is shown as such.

Before anything else, every process the lab starts says which process group to signal, in
one line of its own: ``lab-pid:<pgid>`` (``lab.rank.reaper`` writes it).

Ranks that share one process's streams (a host's torchrun or mp.spawn) have every other line
tagged with the rank that wrote it (``lab.rank.output``)::

    <RANK_TAG><rank> <the line as the rank wrote it>

The events, by who sends them (fields besides ``event``):

========  ==========================================  ==============================================
event     fields                                      meaning
========  ==========================================  ==============================================
hello     rank, pid, hostname, local_rank,            a rank is up, and where it runs (worker,
          [python, torch]                             script)
step      rank, step                                  the rank begins a step: ``init:<method>``, an
                                                      exercise's name, or ``wait:<exercise>`` (the
                                                      barrier after it)
result    rank, exercise, value, seconds              an exercise returned ``value`` (JSON; tensors
                                                      as lists)
error     rank, exercise, error, where, traceback     an exercise raised
fatal     rank, error, traceback                      start-up failed outside any exercise
done      rank, failures                              the rank ran every stage
exit      rank, code                                  a host's launcher (``lab.rank.node``) says how
                                                      one of its ranks ended, before it ends itself
ports     ports                                       the port holder (``lab.rank.ports``) holds
                                                      these ports on rank 0's host for the run
facts     see ``lab.rank.probe``                      the doctor's probe: the host's facts
runtime   torch, cuda_devices, nccl, ...              the probe: what torch says on the host
links     links                                       the probe: its connections to its targets
heard     sources, lookups                            the probe: who connected to its listeners
========  ==========================================  ==============================================

Standard library only: this module runs on every host.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Final, Literal, get_args

MARK: Final = "\x1flab:"
RANK_TAG: Final = "\x1flab-rank:"
PID_MARK: Final = b"lab-pid:"  # the first line of every started process: its group (lab.rank.reaper)

EventKind = Literal["hello", "step", "result", "error", "fatal", "done", "exit", "ports",
                    "facts", "runtime", "links", "heard"]
EVENT_KINDS: Final[frozenset[str]] = frozenset(get_args(EventKind))


class MalformedEvent(ValueError):
    """A line marked as an event of this run that is not one (bad JSON, no known ``event``)."""


def event_line(token: str, event: EventKind, **fields: Any) -> str:
    """One event as the line that carries it (with its newline); tensors become lists."""
    return f"{MARK}{token} {json.dumps({'event': event, **fields}, default=_jsonable)}\n"


def emit(token: str, event: EventKind, **fields: Any) -> None:
    """Write one event to this process's stdout, flushed at once."""
    sys.stdout.write(event_line(token, event, **fields))
    sys.stdout.flush()


def parse_event(line: str, token: str) -> dict[str, Any] | None:
    """The event a line carries, if it is an event line of the run ``token``; None for any other
    line (a program's output). Raises :class:`MalformedEvent` for a marked line that is no event."""
    prefix = f"{MARK}{token} "
    if not line.startswith(prefix):
        return None
    try:
        event = json.loads(line[len(prefix):])
    except ValueError as exc:
        raise MalformedEvent(f"not JSON: {exc}") from None
    if not isinstance(event, dict) or event.get("event") not in EVENT_KINDS:
        raise MalformedEvent("not an object with a known 'event'")
    return event


def is_event_line(line: bytes) -> bool:
    """Whether a raw line is an event line of any run (the output tagger passes those unchanged)."""
    return line.startswith(MARK.encode())


def rank_tag(rank: int) -> bytes:
    """The prefix of a line that ``rank`` wrote into streams it shares with other ranks."""
    return f"{RANK_TAG}{rank} ".encode()


def untag(line: str) -> tuple[int | None, str]:
    """The rank a tagged line came from and the line as the rank wrote it; (None, line) if untagged."""
    if line.startswith(RANK_TAG):
        number, _, text = line[len(RANK_TAG):].partition(" ")
        if number.isdigit():
            return int(number), text
    return None, line


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)
