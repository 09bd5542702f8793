"""A busy machine, on purpose: a bounded CPU hog, as a classroom's shared lab host or a CI box is.

:func:`cpu_hog` keeps ``2 x cores`` processes spinning (at the default priority, as other work
would) while its block runs, each bounded by ``timeout`` on its own (a test killed midway leaves
none for long), and ends them all after.
"""
from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

SPIN = "while True: pass"


@contextmanager
def cpu_hog(per_core: int = 2, seconds: float = 900) -> Iterator[list[int]]:
    """``per_core`` busy processes per core while the block runs (their pids), each ending by itself
    after ``seconds`` at most."""
    hogs = [subprocess.Popen(["timeout", f"{seconds:g}", "python3", "-c", SPIN], stdin=subprocess.DEVNULL,
                             start_new_session=True) for _ in range(per_core * (os.cpu_count() or 1))]
    try:
        yield [hog.pid for hog in hogs]
    finally:
        for hog in hogs:
            try:
                os.killpg(hog.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            hog.wait()
