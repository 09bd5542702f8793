"""Whose line is it: the output of ranks that share one process's streams.

Under ``--launcher torchrun`` or ``spawn`` the lab starts one process per host, and all of that
host's ranks write into its stdout and stderr. So each such rank sends its file descriptors 1
and 2 through :func:`tag_output`: a small process of its own prefixes every line with
its rank's tag (``lab.rank.protocol.rank_tag``) and writes it on. Everything the rank writes is
tagged: Python's prints, C
libraries' messages, faulthandler's stack dumps, the output of processes it starts. The tagger
is a separate process so that a rank that crashes loses none of its last lines.

The lab's own event lines (``lab.rank.protocol``) carry their rank already and pass unchanged.
"""
from __future__ import annotations

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


def copy_tagged(rank: int, targets: dict[int, int]) -> None:
    """Copy each source fd to its target fd, a tag before every line, until all are closed."""
    tag = rank_tag(rank)
    pending = {fd: b"" for fd in targets}
    while pending:
        ready, _, _ = select.select(list(pending), [], [])
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                *lines, pending[fd] = (pending[fd] + data).split(b"\n")
            else:  # closed: what is left is a last line without its newline
                rest = pending.pop(fd)
                lines = [rest] if rest else []
            _write_all(targets[fd], b"".join(line + b"\n" if is_event_line(line) else tag + line + b"\n"
                                             for line in lines))


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # meant for the rank (a stack dump), sent to its group
    rank, out_fd, err_fd = map(int, sys.argv[1:4])
    try:
        copy_tagged(rank, {out_fd: 1, err_fd: 2})
    except (OSError, KeyboardInterrupt):
        pass
