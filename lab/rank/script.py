"""``python -m lab.rank.script SCRIPT [ARGS...]``: a user's script as one rank of ``lab launch``.

Like ``python SCRIPT ARGS`` (the script runs as ``__main__``, with its own directory on
``sys.path``), plus the worker's safety nets (``lab.rank.worker.start_rank``): the rank's whole
process group stops when the controller goes away (stdin closes), SIGUSR1 dumps every
thread's stack, so the lab can say where a hung rank stopped, and under a per-host launcher
its lines are tagged with its rank; what it prints can never read as an event of the lab's
(``lab.rank.output``). It says hello (its rank, pid, host) to the controller
first. The rendezvous settings are in the environment, set by the launcher.
"""
from __future__ import annotations

import os
import runpy
import socket
import sys

from lab.rank import protocol
from lab.rank.worker import start_rank


def main() -> None:
    start_rank()
    if protocol.CHANNEL is not None:  # (the lab gave it a token)
        protocol.CHANNEL.send("hello", rank=int(os.environ.get("RANK", "-1")), pid=os.getpid(),
                              hostname=socket.gethostname(), local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
