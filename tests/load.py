"""A busy machine, on purpose: a bounded CPU hog, as a classroom's shared lab host or a CI box is.

:func:`cpu_hog` keeps ``2 x cores`` processes spinning (at the default priority, as other work
would) while its block runs, and ends them all after. Each is bounded on its own too: it spins for
``seconds`` at most, and the kernel kills it as soon as the test's process goes (a test run killed
midway leaves no hog behind to slow what runs next).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass"
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when the thread that started it ends
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # (found here: the child between fork and exec only calls it)


def _dies_with_its_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@contextmanager
def cpu_hog(per_core: int = 2, seconds: float = 900) -> Iterator[list[int]]:
    """``per_core`` busy processes per core while the block runs (their pids), each ending by itself
    after ``seconds`` at most, or when this process ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN, f"{seconds:g}"], stdin=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=_dies_with_its_parent)
            for _ in range(per_core * (os.cpu_count() or 1))]
    try:
        yield [hog.pid for hog in hogs]
    finally:
        for hog in hogs:
            try:
                os.killpg(hog.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            hog.wait()
