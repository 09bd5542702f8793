"""``python -m lab.rank.script SCRIPT [ARGS...]``: a user's script as one rank of ``lab launch``.

Like ``python SCRIPT ARGS`` (the script runs as ``__main__``, with its own directory on
``sys.path``), plus the worker's safety nets (``lab.rank.worker.start_rank``): the rank's whole
process group stops when the controller goes away (stdin closes), SIGUSR1 dumps every
thread's stack, so the lab can say where a hung rank stopped, and under a per-host launcher
its lines are tagged with its rank; what it prints can never read as an event of the lab's
(``lab.rank.output``). It says hello (its rank, pid, host) to the controller first. Its
torch.distributed calls go to the flight recorder (``lab.rank.flight``), installed as soon as
torch is imported: at once if it is (the lab's launcher loaded it before it forked the rank),
else when the script imports it, before the script's next line, so that its ``from
torch.distributed import ...`` binds the recorded functions (a script that never imports torch
pays nothing for it). The rendezvous settings are in the environment, set by the launcher.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import socket
import sys
from collections.abc import Callable
from types import ModuleType

from lab.rank import protocol
from lab.rank.worker import start_rank


def main() -> None:
    start_rank()
    rank = int(os.environ.get("RANK", "-1"))
    if protocol.CHANNEL is not None:  # (the lab gave it a token)
        protocol.CHANNEL.send("hello", rank=rank, pid=os.getpid(), hostname=socket.gethostname(),
                              local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    after_torch(lambda: record_calls(rank))
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def record_calls(rank: int) -> None:
    """Wrap torch.distributed (``lab.rank.calls``) and start the flight recorder's reports."""
    from lab.rank.calls import install
    from lab.rank.flight import FLIGHT

    try:
        install()
    except ImportError:  # a torch built without torch.distributed: nothing to record
        return
    if rank >= 0:
        FLIGHT.watch(rank)


def after_torch(then: Callable[[], None]) -> None:
    """Call ``then`` now if torch is imported, else once it is (its module has run)."""
    if "torch" in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterTorch(then))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds torch as the import system would, with a loader that calls ``then`` once it ran."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # (once; and the search below is the import system's own)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Then(spec.loader, self.then)
        return spec


class _Then(importlib.abc.Loader):
    """A module's own loader, then ``then``; the module keeps its own loader."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then()


if __name__ == "__main__":
    main()
