"""``lab launch -m lab.rank.cells``: a rank that runs a notebook's cells (``lab.notebook``), one after
another, keeping its variables between them, until the notebook stops it.

It forms the process group first (``torch.distributed.init_process_group`` from the environment the
launcher set, the backend :data:`BACKEND_VAR` names), then reads the cells on its stdin, which
under ``--launcher lab`` every rank has (``lab.rank.stdin``: the notebook's line to its ranks is
the host's launcher's, as for rank 0's stdin under ``lab launch``), one JSON object a line::

    {"n": 12, "name": "cell [7]", "code": "...", "ranks": [0, 2]}      # ranks: null for every rank

``n`` numbers the session's cells; ``name`` is the notebook's (its execution count). A cell is
compiled as its name (so a traceback, the flight recorder's lines and the lab's why say
``cell [7]:3``: the cell's own line) and run in the rank's namespace, which holds ``dist``,
``torch``, ``rank`` and ``world_size`` from the start. An exception a cell raises is printed as
Python prints it, without the lab's frames, and the rank goes on to the next cell; a cell that
ends the process (``sys.exit``, ``os._exit``, a signal) ends the rank, as in a script. Cells not for
this rank are skipped.

Around each cell the rank says where it is, twice:

* to the controller, a ``cell`` event (``ended`` false as it begins, true when it has ended): the
  ledger counts a rank that has ended the newest cell it was sent as waiting for the next one, not
  as a rank its peers wait on in vain (``lab.core.ledger``);
* to the notebook, a line on each of its streams once the cell's output is all written there:
  the session's mark (:data:`MARK_VAR`), the cell's number and, on stdout, how it ended
  (``ok`` or ``raised Type: message at cell [7]:3``); ``0 ready`` once the group is formed. The
  notebook shows what came before it as the cell's output and takes the cell as over on a rank
  once both marks came (``lab.notebook.session``).
"""
from __future__ import annotations

import json
import linecache
import os
import sys
import traceback
from typing import Any

from lab.rank import protocol
from lab.rank.script import raised_at, without_lab
from lab.rank.worker import capped, error_text

BACKEND_VAR = "LAB_CELLS_BACKEND"  # the process group's backend (gloo, nccl)
MARK_VAR = "LAB_CELLS_MARK"  # the session's mark, which begins the lines that end a cell's output
READY = 0  # the number of the mark that says the group is formed


def cell_name(n: int) -> str:
    """A cell's name, as its code is compiled (the file name in tracebacks and records), where the
    notebook gives none."""
    return f"cell [{n}]"


def main() -> None:
    import torch
    import torch.distributed as dist

    mark = os.environ.pop(MARK_VAR, "")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(os.environ.pop(BACKEND_VAR, "gloo"))
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__, "torch": torch, "dist": dist,
                                 "rank": rank, "world_size": world_size}
    said(mark, READY, "ready")
    for line in sys.stdin:
        cell = json.loads(line)
        n, ranks, name = int(cell["n"]), cell.get("ranks"), str(cell.get("name") or cell_name(cell["n"]))
        if ranks is not None and rank not in ranks:
            continue
        targets = list(range(world_size)) if ranks is None else [int(r) for r in ranks]
        _tell(rank, n, name, False, targets)
        error, where = run_cell(name, str(cell["code"]), namespace)
        _tell(rank, n, name, True, targets, error)
        said(mark, n, f"raised {error}" + (f" at {where}" if where else "") if error else "ok")


def run_cell(name: str, code: str, namespace: dict[str, Any]) -> tuple[str, str]:
    """Run a cell's ``code`` in ``namespace``, compiled as ``name``: the exception it raised ("Type:
    message", "" for none) and the user's line it came from (what it printed went to the streams)."""
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)  # (its lines in tracebacks)
    try:
        exec(compile(code, name, "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as exc:  # (KeyboardInterrupt too: the cell was interrupted, the rank goes on)
        sys.stderr.write("".join(traceback.format_exception(without_lab(exc))))
        return capped(error_text(exc)), raised_at(exc.__traceback__)
    return "", ""


def said(mark: str, n: int, how: str) -> None:
    """The lines that end cell ``n``'s output on both streams (all it printed is written before them)."""
    for stream, text in ((sys.stdout, f"{mark} {n} {how}"), (sys.stderr, f"{mark} {n}")):
        stream.flush()
        stream.write(text.replace("\n", " ") + "\n")
        stream.flush()


def _tell(rank: int, n: int, name: str, ended: bool, ranks: list[int], error: str = "") -> None:
    if protocol.CHANNEL is not None:
        protocol.CHANNEL.send("cell", rank=rank, n=n, name=name, ended=ended, ranks=ranks, error=error)


if __name__ == "__main__":
    main()
