"""A notebook's ranks: a run of ``lab.rank.cells`` on every rank, kept going between cells.

The run is an ordinary ``lab launch`` (``lab.core.runner``, in a thread of the kernel's): the same
hosts, transports, launchers, rendezvous and hang rule. What the notebook adds is its line to the
ranks: the run's stdin, which under ``--launcher lab`` reaches every rank (``Options.cells_mark``:
the host's launcher passes it to each of its ranks, as it passes rank 0 its stdin under ``lab
launch``), carries each cell as one JSON line; nothing else listens anywhere.

A cell is numbered and sent only when every rank has ended the one before (or, after an
interrupt, when the ranks were stopped): what a cell left unfinished can never pair with the next
one's collectives. A cell is over on a rank once both of the rank's streams said so (its mark, the
session's own, ``lab.rank.cells``); what came before the marks is the cell's output. A cell that
hangs, or a rank that dies, ends the run: the outcome holds the lab's why, as a run's does, and the
session is over (:attr:`Session.outcome`); ``%lab restart`` starts a new one.

No printing here: lines go to the caller's ``on_line`` as they come, and what a cell came to is
data (:class:`CellEnd`).
"""
from __future__ import annotations

import base64
import io
import json
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lab.core import launchers
from lab.core.outcome import LaunchState, RankState, RunOutcome
from lab.core.plan import (
    DEFAULT_HANG_AFTER,
    RUN_DIR,
    Plan,
    default_backend,
    new_token,
    run_name,
    shared_run_dir,
)
from lab.core.planner import build_launch_plan
from lab.core.workdir import Workdir
from lab.errors import LabError, RunError, UsageError
from lab.inventory.model import Inventory
from lab.rank.cells import BACKEND_VAR, INIT_VAR, MARK_VAR, READY
from lab.rank.record import Record
from lab.rank.text import exception_line
from lab.transport.ssh.settings import SSHSettings

START_WAIT = 300.0  # seconds for every rank to form the group and say it is ready
STOP_WAIT = 15.0  # seconds for the ranks to end once their stdin closed, before they are stopped
SETTLE = 0.05  # seconds between two looks at a cell that may have ended
INTERRUPT_WAIT = 3.0  # seconds an interrupted cell has to end on every rank before the ranks are stopped

Whose = RankState | LaunchState
OnLine = Callable[[Whose, str, str], None]  # (whose line, "out" | "err" | "lab", the line)


@dataclass
class CellEnd:
    """What a cell came to: how it ended on each rank it ran on ("ok", or "raised Type: message at
    cell [7]:3"), and, where the run ended in it (a hang, a rank that died), the run's outcome."""

    n: int
    ranks: tuple[int, ...]
    how: dict[int, str] = field(default_factory=dict)
    data: dict[int, list[str]] = field(default_factory=dict)  # a pull's: each rank's value, in base64 lines
    outcome: RunOutcome | None = None
    error: LabError | None = None  # the run failed as no rank's fault (a host lost...)
    interrupted: bool = False

    @property
    def raised(self) -> dict[int, str]:
        return {rank: how for rank, how in self.how.items() if how != "ok"}

    @property
    def ok(self) -> bool:
        """It ended on every rank it ran on, raising nothing."""
        return not self.interrupted and self.outcome is None and self.error is None and not self.raised and \
            set(self.how) == set(self.ranks)


@dataclass(frozen=True)
class SentCell:
    """A cell as the notebook sent it (what a restart replays)."""

    code: str
    ranks: tuple[int, ...] | None
    name: str
    setup: bool = False  # %%dist --setup: a restart replays these alone, where there are any


class Session:
    """One run of a notebook's ranks, from ``start`` to ``stop`` (or to a cell that ends it)."""

    def __init__(self, plan: Plan, ssh: SSHSettings | None = None) -> None:
        self.plan, self.ssh = plan, ssh
        self.mark = plan.options.cells_mark
        self._read, self._write = os.pipe()
        self._lines: queue.Queue[tuple[Whose, str, str] | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-notebook-run", daemon=True)
        self.outcome: RunOutcome | None = None  # once the run is over
        self.error: LabError | None = None  # the run could not start, or failed as no rank's fault
        self.cells = 0  # cells sent
        self.history: list[SentCell] = []  # the cells that ended on every rank they ran on, raising nothing
        self.states: dict[int, RankState] = {}  # each rank's, as the run keeps it (its trace: %lab trace)
        self.last_name = ""  # the name of the last cell sent
        self.hosts: dict[int, str] = {r.rank: r.host for r in plan.ranks}
        self._ended = threading.Event()

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def running(self) -> bool:
        return not self._ended.is_set()

    # -- the run, in its thread ---------------------------------------------------------

    def _run(self) -> None:
        from lab.core.runner import run_plan  # (the runner's transports: once a session starts)

        try:
            self.outcome = run_plan(self.plan, on_line=self._line, ssh=self.ssh, stop=self._stop, stdin=self._read)
        except LabError as exc:
            self.error = exc
        except Exception as exc:  # (the lab's own failure: said as such, and the notebook goes on without ranks)
            self.error = RunError(f"the notebook's ranks failed: internal error ({exception_line(exc)})")
        finally:
            os.close(self._read)
            self._ended.set()
            self._lines.put(None)

    def _line(self, whose: Whose, stream: str, line: str) -> None:
        self._lines.put((whose, stream, line))

    # -- the notebook's side ------------------------------------------------------------

    def start(self, on_line: OnLine, wait: float = START_WAIT) -> CellEnd:
        """Start the ranks; return once every one has formed the group (``how``: "ready" each), or
        the run ended (its outcome, or error)."""
        self._thread.start()
        return self._collect(READY, tuple(range(self.world_size)), on_line, time.monotonic() + wait)

    def run(self, code: str, ranks: Sequence[int] | None, on_line: OnLine, name: str = "",
            setup: bool = False) -> CellEnd:
        """Run ``code`` as the next cell on ``ranks`` (None: every rank), compiled as ``name`` (the
        notebook's "cell [7]"); its output goes to ``on_line`` as it comes. Ctrl-C (KeyboardInterrupt)
        interrupts it on every rank (:meth:`_collect`). ``setup``: a cell a restart replays."""
        end = self._send({"code": code}, ranks, name, on_line)
        if end.ok:
            self.history.append(SentCell(code, None if ranks is None else end.ranks, name, setup))
        return end

    def pull(self, name: str, ranks: Sequence[int] | None = None) -> tuple[list[Any], CellEnd]:
        """Each rank's value of ``name`` (of ``ranks``, else all), in rank order: tensors, numbers,
        strings and lists, tuples and dicts of them, as ``torch.load(weights_only=True)`` takes them
        (nothing a rank sends runs code here); and how the pull ended (a rank that has no such value)."""
        if not name.isidentifier():
            raise UsageError(f"%lab pull {name[:80]!r}: not a variable's name")
        end = self._send({"pull": name}, ranks, f"pull {name}", lambda *_: None)
        values = []
        for rank in end.ranks:
            if rank in end.data and end.how.get(rank) == "ok":
                try:
                    values.append(_loaded(end.data[rank]))
                except Exception as exc:
                    end.how[rank] = f"raised {type(exc).__name__} reading its value: {str(exc)[:200]}"
        return values, end

    def calls(self, name: str) -> dict[int, tuple[str, list[tuple[float, float | None, Record]]]]:
        """The torch.distributed calls cell ``name`` made on each rank (its trace, as the ranks sent it
        each second), by rank: the rank's host and each call's start and end on this machine's clock
        (time.monotonic(); None: not ended)."""
        made = {}
        for rank, state in sorted(self.states.items()):
            clock = state.clock or 0.0
            calls = [(r.t0 + clock, None if r.t1 is None else r.t1 + clock, r) for r in list(state.trace.values())
                     if (r.where or "").startswith(f"{name}:") or (r.caller or "").startswith(f"{name}:")]
            made[rank] = (state.spec.host, sorted(calls, key=lambda call: call[0]))
        return made

    def replay(self, cells: Sequence[SentCell]) -> tuple[list[SentCell], CellEnd | None]:
        """Run ``cells`` again, in order, their output dropped (another session's: a restart); those that
        ended as before, and the end of the first that did not (the rest are not run)."""
        done: list[SentCell] = []
        for cell in cells:
            end = self.run(cell.code, cell.ranks, lambda *_: None, cell.name, cell.setup)
            if not end.ok:
                return done, end
            done.append(cell)
        return done, None

    def _send(self, what: dict[str, str], ranks: Sequence[int] | None, name: str, on_line: OnLine) -> CellEnd:
        """Send the next cell (``what`` it is: its code, or a pull) to ``ranks`` and collect its end."""
        if not self.running:
            raise UsageError("the notebook's ranks have ended: %lab restart starts fresh ones")
        targets = tuple(range(self.world_size)) if ranks is None else tuple(sorted(set(ranks)))
        bad = [r for r in targets if not 0 <= r < self.world_size]
        if bad:
            raise UsageError(f"--ranks {','.join(map(str, bad))}: the ranks are 0 to {self.world_size - 1}")
        self.cells += 1
        self.last_name = name if "code" in what else self.last_name
        message = {"n": self.cells, "name": name, **what, "ranks": None if ranks is None else list(targets)}
        _write_all(self._write, json.dumps(message).encode() + b"\n")
        return self._collect(self.cells, targets, on_line, None)

    def _collect(self, n: int, ranks: tuple[int, ...], on_line: OnLine, deadline: float | None) -> CellEnd:
        """The lines of cell ``n`` until both marks of each of ``ranks`` came, or the run ended (past
        ``deadline``, it is stopped). Ctrl-C interrupts the cell on every rank; a rank that has not
        ended it INTERRUPT_WAIT seconds later (stuck in C++), or a second Ctrl-C, stops the run."""
        end = CellEnd(n, ranks)
        pending = {(rank, stream) for rank in ranks for stream in ("out", "err")}
        while pending:
            try:
                if deadline is not None and time.monotonic() > deadline:
                    self._stop.set()
                if not self._take(n, end, pending, on_line):
                    break
            except KeyboardInterrupt:
                if end.interrupted or n == READY or self._write < 0:
                    self._stop.set()
                    continue
                end.interrupted = True
                _write_all(self._write, json.dumps({"interrupt": n}).encode() + b"\n")
                deadline = time.monotonic() + INTERRUPT_WAIT
        if not self.running:
            self._thread.join()
            end.outcome, end.error = self.outcome, self.error
        return end

    def _take(self, n: int, end: CellEnd, pending: set[tuple[int, str]], on_line: OnLine) -> bool:
        """Take the next line (if one comes soon) for cell ``n``: a mark, or output for ``on_line``;
        False once the run is over."""
        try:
            item = self._lines.get(timeout=SETTLE * 10)
        except queue.Empty:
            return True
        if item is None:
            return False
        whose, stream, line = item
        if isinstance(whose, RankState):
            self.states.setdefault(whose.spec.rank, whose)
        if isinstance(whose, RankState) and line.startswith(f"{self.mark} "):
            said, _, how = line[len(self.mark) + 1:].partition(" ")
            if said == str(n) and how.startswith("data ") and stream == "out":
                end.data.setdefault(whose.spec.rank, []).append(how[len("data "):])
            elif said == str(n):
                pending.discard((whose.spec.rank, stream))
                if stream == "out":
                    end.how[whose.spec.rank] = how
            return True
        on_line(whose, stream, line)
        return True

    def stop(self, at_once: bool = False) -> RunOutcome | None:
        """End the ranks: their stdin closes and each ends as a script that returned (or, ``at_once``
        or past STOP_WAIT, the run is stopped: nothing is left on any host); the run's outcome."""
        if self._write >= 0:
            os.close(self._write)
            self._write = -1
        if not self._thread.is_alive() and not self._ended.is_set():
            return None  # (never started)
        if at_once or not self._ended.wait(STOP_WAIT):
            self._stop.set()
        self._thread.join()
        return self.outcome


def _loaded(lines: list[str]) -> Any:
    """A value a rank pulled (base64 lines of what torch.save wrote), loaded with weights_only: only
    tensors and plain data, never an object whose loading runs code."""
    import torch

    return torch.load(io.BytesIO(base64.b64decode("".join(lines))), weights_only=True)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def notebook_plan(inventory: Inventory, hang_after: float = DEFAULT_HANG_AFTER, rank_env: dict[str, str] | None = None,
                  workdir: Workdir | None = None, in_place: Path | None = None, preflight: bool = True,
                  init: str = "env", launcher: str = launchers.DEFAULT) -> Plan:
    """The plan of a notebook's ranks on ``inventory``'s hosts, started by ``launcher`` (one whose
    hosts' processes pass the notebook's line to every rank), in the notebook's folder (``in_place``)
    or a copy of it (``workdir``), their group formed by ``init`` (env, tcp, file)."""
    if not launchers.find(launcher).passes_stdin:
        passing = [name for name, kind in launchers.LAUNCHERS.items() if kind.passes_stdin]
        raise UsageError(f"--launcher {launcher} cannot pass the notebook's cells to its ranks; use "
                         f"{', '.join(passing[:-1])} or {passing[-1]}")
    mark, token, shared = f"lab-cell-{secrets.token_hex(8)}", new_token(), None
    if init == "file":  # (a file every rank sees: the run's directory here, else the run's in the folder all share)
        shared = shared_run_dir(inventory.hosts, run_name(token))
        if shared is None and not all(host.is_local for host in inventory.hosts):
            raise UsageError("--init file: the hosts share no folder (the inventory's shared_dir) where every rank "
                             "would find the rendezvous file; use --init env or tcp")
        init = f"file://{shared or RUN_DIR}/rendezvous"
    env = {**(rank_env or {}), MARK_VAR: mark, BACKEND_VAR: default_backend(inventory.hosts), INIT_VAR: init}
    plan = build_launch_plan(inventory, "lab.rank.cells", (), 0, launcher, token=token, hang_after=hang_after,
                             preflight=preflight, rank_env=env, workdir=workdir, module=True, in_place=in_place,
                             cells_mark=mark, trace=True)  # (each call's record as it ends: %lab trace draws a cell's)
    return replace(plan, shared_run_dir=shared) if shared else plan  # (the runner removes that folder at the end)
