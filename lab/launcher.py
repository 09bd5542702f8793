"""``python -m lab.launcher SCRIPT [ARGS...]``: a user's script as one rank of ``lab launch``.

Like ``python SCRIPT ARGS`` (the script runs as ``__main__``, with its own directory on
``sys.path``), plus the worker's two safety nets: the rank's whole process group stops
when the controller goes away (stdin closes), and SIGUSR1 dumps every thread's stack, so
the lab can say where a hung rank stopped. The rendezvous settings are in the environment.
"""
from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys

from .worker import stop_when_orphaned


def main() -> None:
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    stop_when_orphaned()
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
