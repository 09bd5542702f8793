"""``python -m lab.rank.node srun SRUN_OPTIONS -- KIND ARGS``: the job of ``--launcher srun`` and
``srun-torchrun``, started on the Slurm cluster's login host.

It runs ``srun --label --kill-on-bad-exit=1 SRUN_OPTIONS python -m lab.rank.node KIND ARGS``: one
job whose tasks are the ranks (KIND ``task``: each a zygote of one rank, ``lab.rank.node.task``)
or one torchrun per node (KIND ``torchrun``: the tutorials' ``srun torchrun``). srun passes this
process's environment and standard input (which it passes on: the controller's line) on to every
task, and SIGUSR1 (the lab asking for
stacks) too; when one task fails it ends the others, and this process ends as srun does.

Every task's stream is whole lines of the lab's (a zygote's, or a torchrun agent's whose ranks tag
their own lines, as under ``--launcher lab`` and ``torchrun``), but srun merges the tasks' streams
into its own two and cuts a line longer than SRUN_PIECE bytes into pieces that other tasks' lines
may come between. With ``--label`` each piece says whose it is, and a piece of a longer line is
exactly SRUN_PIECE bytes long (srun passes the rest of the line on in the next pieces), so
:class:`Unlabel` puts each task's lines back together and passes them on whole.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import IO

from lab.rank.output import HOLD
from lab.rank.protocol import write_all

NO_SRUN = "lab.rank.node: cannot run srun on this host"  # (the controller makes it a refusal: lab.core.slurm)
SRUN_PIECE = 1024  # bytes of a line srun passes on at a time (Slurm's MAX_MSG_LEN): a longer one comes in pieces
_LABEL = re.compile(rb"^ *(\d{1,9}): ")


@dataclass
class Unlabel:
    """One of srun's labelled streams, put back into each task's whole lines (see the module): fed
    srun's lines, it gives back what to pass on. It holds at most HOLD bytes of a task's line: a
    longer one (no event is) goes on in lines of that size."""

    held: dict[int, bytes] = field(default_factory=dict)  # task -> the start of its line, not passed on yet

    def feed(self, line: bytes) -> bytes:
        """A line of srun's (with its newline): a labelled piece of a task's line, or srun's own."""
        found = _LABEL.match(line)
        if found is None:
            return line
        task, piece = int(found[1]), line[found.end():]
        body = piece[:-1] if piece.endswith(b"\n") else piece
        held = self.held.pop(task, b"")
        if len(body) >= SRUN_PIECE:  # a piece of a longer line: srun ended it, the task did not
            held += body
            if len(held) <= HOLD:
                self.held[task] = held
                return b""
            return held + b"\n"
        return held + body + b"\n"

    def close(self) -> bytes:
        """The starts of lines that never ended."""
        held, self.held = self.held, {}
        return b"".join(start + b"\n" for start in held.values())


def main(args: list[str]) -> int:
    if "--" not in args:
        print("usage: python -m lab.rank.node srun SRUN_OPTIONS -- KIND ARGS", file=sys.stderr)
        return 2
    at = args.index("--")
    # inside an allocation (the lab's own steps run there too: lab.transport.slurm) the job is a step of it
    within = ["--overlap"] if os.environ.get("SLURM_JOB_ID") else []
    argv = ["srun", "--label", "--kill-on-bad-exit=1", *within, *args[:at], sys.executable, "-m", "lab.rank.node",
            *args[at + 1:]]
    signal.signal(signal.SIGUSR1, lambda *_: None)  # (srun, in this group, passes it on to the tasks)
    try:
        job = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        print(f"{NO_SRUN} ({exc.strerror}): is it a Slurm cluster's login host?", file=sys.stderr)
        return 127
    assert job.stdin is not None and job.stdout is not None and job.stderr is not None
    threading.Thread(target=_pass_stdin, args=(job.stdin,), name="lab-srun-stdin", daemon=True).start()
    errors = threading.Thread(target=_pass_on, args=(job.stderr, 2), daemon=True)
    errors.start()
    _pass_on(job.stdout, 1)
    code = job.wait()
    errors.join()
    return code


def _pass_on(stream: IO[bytes], fd: int) -> None:
    """Pass one of srun's streams on to ``fd``, each task's lines whole."""
    unlabel = Unlabel()
    for line in iter(lambda: stream.readline(SRUN_PIECE + 64), b""):
        write_all(fd, unlabel.feed(line))
    write_all(fd, unlabel.close())


def _pass_stdin(srun: IO[bytes]) -> None:
    """This process's stdin, the controller's line, on to srun's, which passes it to every task (each
    task's launcher takes what is its ranks': lab.rank.stdin); once the line closes (the controller is
    gone) this process group ends, srun with it, as lab.rank.worker.stop_when_orphaned would."""
    passing = True
    try:
        while data := os.read(0, 1 << 16):
            if passing:
                try:
                    srun.write(data)
                    srun.flush()
                except OSError:  # srun has ended: what comes is no task's now
                    passing = False
    except OSError:
        pass
    os.killpg(os.getpgrp(), signal.SIGKILL)
