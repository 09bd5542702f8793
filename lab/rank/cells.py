"""``lab launch -m lab.rank.cells``: a rank that runs a notebook's cells (``lab.notebook``), one after
another, keeping its variables between them, until the notebook stops it.

It forms the process group first (``torch.distributed.init_process_group`` with the backend
:data:`BACKEND_VAR` names, by the init method :data:`INIT_VAR` names: ``env`` from the environment
the launcher set, ``tcp`` at MASTER_ADDR:MASTER_PORT, or a ``file://`` every rank sees), then
reads the cells on its stdin, which under ``--launcher lab`` every rank has (``lab.rank.stdin``:
the notebook's line to its ranks is the host's launcher's, as for rank 0's stdin under ``lab
launch``), one JSON object a line::

    {"n": 12, "name": "cell [7]", "code": "...", "ranks": [0, 2]}      # ranks: null for every rank
    {"interrupt": 12}                                                  # Ctrl-C in the notebook
    {"n": 13, "name": "pull x", "pull": "x", "ranks": null}            # %lab pull x

``n`` numbers the session's cells; ``name`` is the notebook's (its execution count). A cell is
compiled as its name (so a traceback, the flight recorder's lines and the lab's why say
``cell [7]:3``: the cell's own line) and run in the rank's namespace, which holds ``dist``,
``torch``, ``rank``, ``world_size`` and ``device`` (the rank's GPU under nccl, else the CPU) from
the start. An exception a cell raises is printed as
Python prints it, without the lab's frames, and the rank goes on to the next cell; a cell that
ends the process (``sys.exit``, ``os._exit``, a signal) ends the rank, as in a script. Cells not for
this rank are skipped.

An interrupt of the cell that runs raises KeyboardInterrupt in it (a SIGINT to the rank's main thread,
from the thread that reads the line: a sleep or a wait in Python ends at once), which the cell ends
with, as an exception it raised; outside a cell the rank takes no interrupt. A rank stuck in C++ (a
collective whose peers never come) does not see it until that call returns: the notebook stops those.

Around each cell the rank says where it is, twice:

* to the controller, a ``cell`` event (``ended`` false as it begins, true when it has ended): the
  ledger counts a rank that has ended the newest cell it was sent as waiting for the next one, not
  as a rank its peers wait on in vain (``lab.core.ledger``);
* to the notebook, for a pull, the value (``torch.save``'d, tensors moved to the CPU, at most
  :data:`PULL_MAX` bytes) in lines of its mark, ``N data BASE64``, before the marks below;
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
import queue
import re
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import Any

from lab.rank import protocol
from lab.rank.script import raised_at, without_lab
from lab.rank.worker import capped, ensure_shared_path, error_text

BACKEND_VAR = "LAB_CELLS_BACKEND"  # the process group's backend (gloo, nccl)
INIT_VAR = "LAB_CELLS_INIT"  # how it forms: env, tcp, or file://PATH
MARK_VAR = "LAB_CELLS_MARK"  # the session's mark, which begins the lines that end a cell's output
SHARED_WAIT = 15.0  # seconds for every rank to see the folder of a file:// rendezvous
READY = 0  # the number of the mark that says the group is formed
PULL_MAX = 64 << 20  # bytes of a value %lab pull brings back from one rank (it is held in the kernel)
CHUNK = 3000  # base64 characters a line of a pulled value (a line of output is kept whole up to LINE_MAX bytes)


CELL_NAME = re.compile(r"cell \[\d+\]\Z")  # a cell's code as compiled: its "file" in tracebacks and stacks


def cell_name(n: int) -> str:
    """A cell's name, as its code is compiled (the file name in tracebacks and records), where the
    notebook gives none."""
    return f"cell [{n}]"


def main() -> None:
    import torch
    import torch.distributed as dist

    mark = os.environ.pop(MARK_VAR, "")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    backend, init = os.environ.pop(BACKEND_VAR, "gloo"), os.environ.pop(INIT_VAR, "env")
    device = torch.device("cpu")
    if backend == "nccl":  # (a GPU a rank: its local rank's)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if init == "env":
        dist.init_process_group(backend)
    else:
        address = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}" if init == "tcp" else init
        if address.startswith("file://"):  # (its folder made, and seen by every rank: else FileStore waits forever)
            path = address.removeprefix("file://")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            ensure_shared_path(path, rank, world_size, SHARED_WAIT)
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=world_size)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__, "torch": torch, "dist": dist,
                                 "rank": rank, "world_size": world_size, "device": device}
    cells: queue.Queue[dict[str, Any] | None] = queue.Queue()
    signal.signal(signal.SIGINT, _interrupted)
    threading.Thread(target=_read, args=(cells,), name="lab-cells", daemon=True).start()
    said(mark, READY, "ready")
    for cell in iter(cells.get, None):
        n, ranks, name = int(cell["n"]), cell.get("ranks"), str(cell.get("name") or cell_name(cell["n"]))
        if ranks is not None and rank not in ranks:
            continue
        targets = list(range(world_size)) if ranks is None else [int(r) for r in ranks]
        _tell(rank, n, name, False, targets)
        if "pull" in cell:
            error, where = pull(mark, n, str(cell["pull"]), namespace)
        else:
            error, where = run_cell(n, name, str(cell["code"]), namespace)
        _Running.n = None  # (however the cell ended: no interrupt after it)
        _tell(rank, n, name, True, targets, error)
        said(mark, n, f"raised {error}" + (f" at {where}" if where else "") if error else "ok")


class _Running:
    """The cell the main thread runs, if any (a number), for the reader's interrupts."""

    lock = threading.Lock()
    n: int | None = None


def _read(cells: queue.Queue[dict[str, Any] | None]) -> None:
    """The notebook's line: cells to the main thread, in order; an interrupt of the cell that runs,
    at once. The line's end (the notebook stopped the ranks) ends the rank once its cell is over."""
    for line in sys.stdin:
        message = json.loads(line)
        if "interrupt" in message:
            with _Running.lock:
                if _Running.n == message["interrupt"]:
                    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
            continue
        cells.put(message)
    cells.put(None)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """SIGINT: KeyboardInterrupt in the cell that runs; none between cells."""
    if _Running.n is not None:
        raise KeyboardInterrupt


def run_cell(n: int, name: str, code: str, namespace: dict[str, Any]) -> tuple[str, str]:
    """Run cell ``n``'s ``code`` in ``namespace``, compiled as ``name``: the exception it raised ("Type:
    message", "" for none) and the user's line it came from (what it printed went to the streams)."""
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)  # (its lines in tracebacks)
    try:
        try:
            _Running.n = n
            exec(compile(code, name, "exec"), namespace)
        finally:
            with _Running.lock:
                _Running.n = None
    except SystemExit:
        raise
    except BaseException as exc:  # (KeyboardInterrupt too: the cell was interrupted, the rank goes on)
        sys.stderr.write("".join(traceback.format_exception(without_lab(exc))))
        return capped(error_text(exc).removesuffix(": ")), raised_at(exc.__traceback__)
    return "", ""


def pull(mark: str, n: int, name: str, namespace: dict[str, Any]) -> tuple[str, str]:
    """Send the rank's value of ``name`` to the notebook (see the module): the error where it cannot."""
    import base64
    import io

    import torch

    if name not in namespace:
        return f"NameError: name {name!r} is not defined", ""
    data = io.BytesIO()
    try:
        torch.save(_on_cpu(namespace[name]), data)
    except Exception as exc:
        return f"{error_text(exc)} (saving {name})", ""
    if data.tell() > PULL_MAX:
        return f"{name} is {data.tell() >> 20} MiB, more than %lab pull brings ({PULL_MAX >> 20} MiB)", ""
    text = base64.b64encode(data.getvalue()).decode()
    sys.stdout.flush()
    for start in range(0, len(text), CHUNK):
        sys.stdout.write(f"{mark} {n} data {text[start:start + CHUNK]}\n")
    sys.stdout.flush()
    return "", ""


def _on_cpu(value: Any) -> Any:
    """``value`` with its tensors (in lists, tuples and dicts too) detached and on the CPU."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    return value


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
