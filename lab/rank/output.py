"""Whose line is it: the output of ranks that share one process's streams.

Under ``--launcher torchrun`` or ``spawn`` the lab starts one process per host, and all of that
host's ranks write into its stdout and stderr. So each such rank sends its file descriptors 1
and 2 through :func:`tag_output`: a small process of its own prefixes every line with
its rank's tag (``lab.rank.protocol.rank_tag``) and writes it on. Everything the rank writes is
tagged: Python's prints, C
libraries' messages, faulthandler's stack dumps, the output of processes it starts. The tagger
is a separate process so that a rank that crashes loses none of its last lines.

The lab's own event lines (``lab.rank.protocol``) carry their rank already and pass unchanged.

The taggers of a host's ranks write into the same pipes, and a write of more than PIPE_BUF bytes
to a pipe may be interleaved with other writers'. So each tagger writes whole lines only, under
an flock of the pipe that it takes on an open file of its own (``/proc/self/fd/N``; the inherited
descriptor is one open file shared by all, which an flock cannot tell apart). A line longer than
HOLD is written as it comes, in pieces, so that whatever a rank prints the tagger's memory stays
bounded.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import subprocess
import sys

from lab.rank.protocol import is_event_line, rank_tag

CODE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds lab/


def tag_output(rank: int) -> None:
    """From now on, this process's fds 1 and 2 (and its children's) reach the original
    streams through a tagger that prefixes each line with ``rank``."""
    sys.stdout.flush()
    sys.stderr.flush()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    subprocess.Popen([sys.executable, "-S", "-m", "lab.rank.output", str(rank), str(out_r), str(err_r)],
                     pass_fds=(out_r, err_r), stdin=subprocess.DEVNULL,
                     env={**os.environ, "PYTHONPATH": CODE_DIR})
    for fd, target in ((out_w, 1), (err_w, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.close(out_r)
    os.close(err_r)


HOLD = 1 << 20  # bytes of a line held until its end (= the controller's EVENT_MAX); a longer one streams on


def copy_tagged(rank: int, targets: dict[int, int]) -> None:
    """Copy each source fd to its target fd, a tag before every line, until all are closed."""
    tag = rank_tag(rank)
    locks = {target: _lock_for(target) for target in targets.values()}
    pending = {fd: b"" for fd in targets}  # the start of a line, not written yet
    inside = dict.fromkeys(targets, False)  # in a long line, its start (and tag) written already
    while pending:
        ready, _, _ = select.select(list(pending), [], [])
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                out, pending[fd], inside[fd] = tagged(tag, data, pending[fd], inside[fd])
            else:  # closed: what is left is a last line without its newline
                rest, was_inside = pending.pop(fd), inside.pop(fd)
                out = tagged(tag, b"\n", rest, was_inside)[0] if rest or was_inside else b""
            _write_all(targets[fd], out, locks[targets[fd]])


def tagged(tag: bytes, data: bytes, start: bytes, inside: bool) -> tuple[bytes, bytes, bool]:
    """``data`` with ``tag`` before each line (an event line passes as it is), given ``start``, the
    line begun before it and held, or ``inside``, that line already written: what to write, the
    line now begun and held, and whether it is (a line longer than HOLD is written as it comes,
    so that the tagger's memory stays bounded whatever a rank prints)."""
    out = []
    if inside:
        end = data.find(b"\n") + 1
        if not end:
            return data, b"", True
        out.append(data[:end])
        data = data[end:]
    *lines, start = (start + data).split(b"\n")
    out += [line + b"\n" if is_event_line(line) else tag + line + b"\n" for line in lines]
    if len(start) <= HOLD:
        return b"".join(out), start, False
    out.append(start if is_event_line(start) else tag + start)
    return b"".join(out), b"", True


def _lock_for(fd: int) -> int | None:
    """An open file of its own on what ``fd`` writes to, to flock (None where there is none: not
    Linux, or not a pipe)."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None


def _write_all(fd: int, data: bytes, lock: int | None = None) -> None:
    """Write all of ``data`` to ``fd``, holding ``lock``'s flock (if any) so that no other tagger's
    write comes in between."""
    if not data:
        return
    with contextlib.ExitStack() as held:
        if lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(lock, fcntl.LOCK_EX)
                held.callback(fcntl.flock, lock, fcntl.LOCK_UN)
        while data:
            data = data[os.write(fd, data):]


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # meant for the rank (a stack dump), sent to its group
    rank, out_fd, err_fd = map(int, sys.argv[1:4])
    try:
        copy_tagged(rank, {out_fd: 1, err_fd: 2})
    except (OSError, KeyboardInterrupt):
        pass
