"""The files a rank's program saves with ``torch.save`` and looks for in vain with ``torch.load``, kept
for the analysis: a rank that loads a checkpoint another rank saves, with nothing between them that
makes it wait (a barrier after the save), fails with FileNotFoundError, true but not why; the other
rank's save of that path, and its line, say why (``lab.core.why``).

Each is kept as ``[kind, path, where, at]`` (``kind`` ``saved`` or ``missing``, ``path`` absolute on
the rank's host, ``where`` the program's line, ``at`` the rank's clock, ``time.time()``), the last
FILES_KEPT of each kind (a path saved again moves to the end), and goes with the rank's ``flight``
dumps (``lab.rank.watcher``; read as ``lab.rank.flightrecords.read_files``). Like every record of the
rank's, it is the rank's word: the analysis reads it as untrusted.
"""
from __future__ import annotations

import functools
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

from lab.rank.flight import FLIGHT, Flight

FILES_KEPT = 16  # files kept of each kind: the last saved, the last looked for in vain
PATH_MAX = 4096  # characters of a path kept (a longer one is not)
Kind = Literal["saved", "missing"]


class Files:
    """The files kept (see the module)."""

    def __init__(self, flight: Flight) -> None:
        self.flight = flight  # (it finds the program's frame in a call: its user_frame)
        self.kept: dict[Kind, OrderedDict[str, tuple[str, float]]] = {  # path -> (where, at)
            "saved": OrderedDict(), "missing": OrderedDict()}

    def install(self) -> None:
        """Wrap torch.save and torch.load (torch is imported), once."""
        import torch

        if getattr(torch.save, "__lab_files__", False):
            return
        torch.save, torch.load = self._wrap(torch.save, "saved"), self._wrap(torch.load, "missing")

    def _wrap(self, fn: Callable[..., Any], kind: Kind) -> Callable[..., Any]:
        """``fn`` (torch.save, torch.load: the file is its first or second argument) keeping the path of
        each save that returns, or of each load that found no file."""
        slot = 1 if kind == "saved" else 0

        @functools.wraps(fn)
        def keeping(*args: Any, **kwargs: Any) -> Any:
            f = args[slot] if len(args) > slot else kwargs.get("f")
            try:
                result = fn(*args, **kwargs)
            except FileNotFoundError:
                if kind == "missing":
                    self._keep(kind, f)
                raise
            if kind == "saved":
                self._keep(kind, f)
            return result

        keeping.__lab_files__ = True  # type: ignore[attr-defined]
        return keeping

    def _keep(self, kind: Kind, f: object) -> None:
        if not isinstance(f, (str, os.PathLike)):
            return  # (a buffer or an open file: no path to tell)
        try:
            path = os.path.abspath(os.fspath(f))
        except (TypeError, ValueError, OSError):
            return
        if not isinstance(path, str) or len(path) > PATH_MAX:
            return
        kept = self.kept[kind]
        kept.pop(path, None)
        kept[path] = (self.flight.user_line(sys._getframe(2)), time.time())
        while len(kept) > FILES_KEPT:
            kept.popitem(last=False)

    def to_json(self) -> list[list[Any]]:
        """The files kept, as a ``flight`` dump carries them."""
        return [[kind, path, where, at] for kind, kept in self.kept.items() for path, (where, at) in list(kept.items())]


FILES = Files(FLIGHT)
