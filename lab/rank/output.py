"""A rank's output, relayed: what the rank and its children write reaches the rank's streams through
a process of its own, which makes sure none of it reads as an event (``lab.rank.protocol``).

Every rank process (``lab.rank.worker.start_rank``) sends its file descriptors 1 and 2 through
:func:`divert_output` before it imports torch or any exercise program: it keeps its real stdout as
its private channel for events, and forks a small relay that copies what it and its children
write to fds 1 and 2 on to its real streams, line by line, with every unit separator (the first
byte of every mark) replaced by ``␟``. Everything goes through it: Python's prints,
``sys.__stdout__``, C libraries' messages, faulthandler's stack dumps, the output of processes the
rank starts. The relay is a process of its own (it needs only the standard library) so that a rank
that ends itself (``os._exit``, a signal) loses none of its last lines; outliving the rank, it also
says what the rank was in if it died in a call (``lab.rank.lastcall``).

Under ``--launcher torchrun`` or ``spawn`` the lab starts one process per host, and all of that
host's ranks write into its stdout and stderr: there the relay also prefixes every line with its
rank's tag (``lab.rank.protocol.rank_tag``).

The relays (and channels) of a host's ranks write into the same pipes, and a write of more than
PIPE_BUF bytes to a pipe may be interleaved with other writers'. So each relay writes whole lines
only, under an flock of the pipe that it takes on an open file of its own (``/proc/self/fd/N``;
the inherited descriptor is one open file shared by all, which an flock cannot tell apart). A line
longer than HOLD is written as it comes, in pieces, so that whatever a rank prints the relay's
memory stays bounded.
"""
from __future__ import annotations

import os
import select
import signal
import sys

from lab.rank.lastcall import Page
from lab.rank.protocol import EVENT_MAX, NEUTRAL, UNIT_SEPARATOR, lock_for, rank_tag, write_all

HOLD = EVENT_MAX  # bytes of a line held until its end (= the controller's EVENT_MAX); a longer one streams on


def divert_output(rank: int | None = None, page: Page | None = None) -> tuple[int, int]:
    """From now on, this process's fds 1 and 2 (and its children's) reach the original streams
    through a relay process that neutralizes marks and, given ``rank``, tags each line with it;
    given the rank's ``page``, the relay says what the rank was in if it died in a call, once its
    streams closed (lab.rank.lastcall). Returns a private descriptor on the original stdout
    (close-on-exec), for events, and the relay's pid. Call it while this process has one thread
    (it forks)."""
    sys.stdout.flush()
    sys.stderr.flush()
    events = os.dup(1)  # not inheritable: no exec'd program gets it
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    relay = os.fork()
    if relay == 0:  # the relay: only the standard library, never back into the caller's code
        code = 0
        try:
            for fd in (out_w, err_w) if page is not None else (out_w, err_w, events):
                os.close(fd)
            if page is not None:
                page.open_log()
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)  # (the rank watches stdin; the relay has no business with it)
            os.close(devnull)
            for ignored in (signal.SIGUSR1, signal.SIGINT):  # a stack dump is for the rank
                signal.signal(ignored, signal.SIG_IGN)
            copy_tagged(rank_tag(rank) if rank is not None else b"", {out_r: 1, err_r: 2})
            if page is not None:
                page.tell(events)
        except BaseException:  # (the rank's streams are gone: nothing to tell)
            code = 1
        finally:
            os._exit(code)
    for fd, target in ((out_w, 1), (err_w, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.close(out_r)
    os.close(err_r)
    return events, relay


def copy_tagged(tag: bytes, targets: dict[int, int]) -> None:
    """Copy each source fd to its target fd, marks neutralized and ``tag`` before every line, until
    all are closed. A target that can no longer be written to (the controller is gone) is drained."""
    locks = {target: lock_for(target) for target in targets.values()}
    pending = {fd: b"" for fd in targets}  # the start of a line, not written yet
    inside = dict.fromkeys(targets, False)  # in a long line, its start (and tag) written already
    broken: set[int] = set()
    while pending:
        ready, _, _ = select.select(list(pending), [], [])
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                out, pending[fd], inside[fd] = tagged(tag, data, pending[fd], inside[fd])
            else:  # closed: what is left is a last line without its newline
                rest, was_inside = pending.pop(fd), inside.pop(fd)
                out = tagged(tag, b"\n", rest, was_inside)[0] if rest or was_inside else b""
            if targets[fd] not in broken:
                try:
                    write_all(targets[fd], out, locks[targets[fd]])
                except OSError:
                    broken.add(targets[fd])


def tagged(tag: bytes, data: bytes, start: bytes, inside: bool) -> tuple[bytes, bytes, bool]:
    """``data`` with its marks neutralized and ``tag`` before each line, given ``start``, the line
    begun before it and held, or ``inside``, that line already written: what to write, the line
    now begun and held, and whether it is (a line longer than HOLD is written as it comes, so that
    the relay's memory stays bounded whatever a rank prints)."""
    data = data.replace(UNIT_SEPARATOR, NEUTRAL)
    out = []
    if inside:
        end = data.find(b"\n") + 1
        if not end:
            return data, b"", True
        out.append(data[:end])
        data = data[end:]
    whole = start + data
    cut = whole.rfind(b"\n") + 1
    lines, start = whole[:cut], whole[cut:]
    if lines:
        out.append(tag + lines[:-1].replace(b"\n", b"\n" + tag) + b"\n" if tag else lines)
    if len(start) <= HOLD:
        return b"".join(out), start, False
    out.append(tag + start)
    return b"".join(out), b"", True
