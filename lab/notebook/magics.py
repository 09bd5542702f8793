"""The notebook's words: ``%lab start|stop|status`` and ``%%dist`` (see ``lab.notebook``)."""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from lab.cli.common import (
    cluster,
    cluster_options,
    env_options,
    exercises,
    launcher,
    launcher_option,
    rank_env,
    ssh_settings,
    watch_options,
)
from lab.cli.views import notebook as views
from lab.cli.views import run as run_views
from lab.core import workdir
from lab.core.plan import INIT_METHODS
from lab.errors import ExitCode, LabError, UsageError
from lab.grading import notebooks
from lab.grading.notebooks import NotebookCell
from lab.notebook.session import CellEnd, Session, notebook_plan
from lab.transport.reach import with_master_address

TRACE_WAIT = 1.2  # seconds for the ranks' last records of a cell (they send them once a second)


class LabSaid(Exception):
    """What the lab says of a cell that failed, shown as its lines alone (no traceback of the lab's):
    IPython shows what ``_render_traceback_`` returns in the traceback's place, and the cell counts
    as failed (a notebook run top to bottom stops there)."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)

    def _render_traceback_(self) -> list[str]:
        return self.lines


class _Parser(argparse.ArgumentParser):
    """A magic's arguments: a mistake is the lab's one line, not argparse's exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"%{self.prog}: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _Helped()


class _Helped(Exception):
    """--help was asked for, and printed."""


def _start_parser() -> _Parser:
    parser = _Parser(prog="lab start", description="Start the notebook's ranks (as `lab launch` starts them): "
                     "--nproc N on this machine, or the hosts of --hosts INVENTORY; each forms the process group "
                     "and keeps its variables between %%dist cells.")
    cluster_options(parser)
    launcher_option(parser)
    parser.add_argument("--init", choices=INIT_METHODS, default="env",
                        help="how the ranks form their group: env:// (default), tcp://MASTER_ADDR:MASTER_PORT, or a "
                             "file:// every rank sees (the run's folder here; with --hosts, in their shared_dir)")
    env_options(parser)
    watch_options(parser)
    return parser


def _dist_parser() -> _Parser:
    parser = _Parser(prog="%dist", description="Run the cell on every rank of the notebook's (or on --ranks).")
    parser.add_argument("--ranks", type=_ranks, metavar="R,R...", help="the ranks to run it on (default: all)")
    parser.add_argument("--setup", action="store_true", help="a cell %%lab restart replays: where any cell is "
                        "one, a restart replays these alone (else every cell that ran on every rank without error)")
    return parser


def _pull_parser() -> _Parser:
    parser = _Parser(prog="lab pull", description="Each rank's value of NAME, as a list by rank (tensors on the CPU)")
    parser.add_argument("name", metavar="NAME", help="a variable of the ranks'")
    parser.add_argument("--ranks", type=_ranks, metavar="R,R...", help="the ranks whose values to bring (default: all)")
    return parser


def _check_parser() -> _Parser:
    parser = _Parser(prog="lab check", description="Check an exercise with the functions this notebook's cells "
                     "define, as `lab run EXERCISE --solution` checks a file")
    parser.add_argument("exercise", metavar="EXERCISE", help="the exercise (see `python -m lab list`)")
    return parser


def _ranks(text: str) -> tuple[int, ...]:
    try:
        ranks = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of ranks: {text!r}") from None
    if any(r < 0 for r in ranks):
        raise argparse.ArgumentTypeError(f"not a list of ranks: {text!r}")
    return ranks


class LabMagics:
    """``%lab`` and ``%%dist`` (registered as the kernel's magics: lab.notebook), holding the kernel's one
    session of ranks."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell  # (IPython's: the number of the cell that runs)
        self.session: Session | None = None
        self.started_with: list[str] | None = None  # the words of the last %lab start (what %lab restart starts)

    def lab(self, line: str) -> object:
        """%lab start [--nproc N | --hosts INVENTORY ...] | %lab restart | %lab pull NAME | %lab check EXERCISE |
        %lab trace | %lab stop | %lab status"""
        words = shlex.split(line)
        command, rest = (words[0], words[1:]) if words else ("status", [])
        handlers: dict[str, Callable[[list[str]], object]] = {
            "start": self._start, "restart": self._restart, "pull": self._pull, "check": self._check,
            "trace": self._trace, "stop": self._stop, "status": self._status}
        if command not in handlers:
            raise LabSaid([f"lab: %lab {command}: not a command of the notebook's: {', '.join(handlers)}"])
        result = _said(lambda: handlers[command](rest))
        return result if command == "pull" else None

    def dist(self, line: str, cell: str) -> None:
        """%%dist [--ranks R,R...]: the cell, on every rank (or those)."""
        def run() -> None:
            args = _dist_parser().parse_args(shlex.split(line))
            if self.session is None:
                raise UsageError("no ranks: %lab start --nproc N (or --hosts INVENTORY) first")
            # (the body after its %%dist line: its lines numbered as the notebook shows them)
            view = views.CellView(self.shell)
            try:
                end = self.session.run("\n" + cell, args.ranks, view, f"cell [{self.shell.execution_count - 1}]",
                                       args.setup)
            finally:
                view.show()
            _ended(end)

        _said(run)

    def _start(self, words: list[str]) -> Session:
        if self.session is not None and self.session.running:
            raise UsageError(f"the notebook's {self.session.world_size} ranks are running: %lab stop first "
                             "(or %lab restart)")
        args = _start_parser().parse_args(words)
        self.started_with = words
        settings = ssh_settings(args)
        inventory = with_master_address(cluster(args), settings)
        root = Path.cwd()
        local = all(host.is_local for host in inventory.hosts)
        project = None if local else workdir.collect(root, (), workdir.DEFAULT_MAX_MB, ())
        if project is not None:
            run_views.print_skipped(project.root, project.skipped)
        plan = notebook_plan(inventory, args.hang_after, rank_env(args, root, not local), project,
                             root if local else None, args.preflight, args.init, launcher(args))
        session = self.session = Session(plan, settings)
        started = session.start(views.show_line)
        if started.outcome is not None or started.error is not None:
            self.session = None
            _ended(started)
        hosts = sorted({r.host for r in plan.ranks})
        views.show_lines([f"{plan.world_size} rank(s) on {', '.join(hosts)} formed their group ({plan.backend}, "
                          f"{args.init}://): %%dist cells run on every rank"])
        return session

    def _restart(self, words: list[str]) -> None:
        """Fresh ranks as the last %lab start started them, made whole again: the cells that ran on every
        rank without error replayed in order (those marked --setup alone, where any is)."""
        if words:
            raise UsageError(f"%lab restart takes no arguments, got {' '.join(words)} (it starts the ranks as the "
                             "last %lab start did)")
        if self.started_with is None:
            raise UsageError("no ranks to restart: %lab start --nproc N (or --hosts INVENTORY) first")
        old, self.session = self.session, None
        history = old.history if old is not None else []
        if old is not None:
            old.stop(at_once=True)
        session = self._start(self.started_with)
        setup = [cell for cell in history if cell.setup]
        replayed, failed = session.replay(setup or history)
        names = ", ".join(cell.name for cell in replayed) or "none"
        views.show_lines([f"replayed {len(replayed)} cell(s){' marked --setup' if setup else ''}: {names}"])
        if failed is not None:
            cell = (setup or history)[len(replayed)]
            views.show_lines([f"{cell.name} did not end as it had when replayed: the ranks have what the cells "
                              "before it made"], error=True)
            _ended(failed)

    def _pull(self, words: list[str]) -> list[object]:
        """Each rank's value of a variable, as a list by rank (``xs = %lab pull x``)."""
        args = _pull_parser().parse_args(words)
        if self.session is None:
            raise UsageError("no ranks: %lab start --nproc N (or --hosts INVENTORY) first")
        values, end = self.session.pull(args.name, args.ranks)
        _ended(end)
        return values

    def _check(self, words: list[str]) -> None:
        """The exercise checked by the lab's oracle with the functions this notebook's cells define (as
        `lab run EXERCISE --solution` checks a file: a run of its own, on the cluster of %lab start)."""
        args = _check_parser().parse_args(words)
        exercises([args.exercise])
        inputs = list(self.shell.history_manager.input_hist_raw)[:-1]  # (every cell run so far but this one)
        cells = [NotebookCell(f"cell [{n}]", source) for n, source in enumerate(inputs) if n and source.strip()]
        extracted = notebooks.extract(cells, "the notebook")
        views.show_lines([f"{cell}" for cell in extracted.notes], error=True)
        solution = notebooks.written(extracted, "notebook")
        command = [sys.executable, "-m", "lab", "run", args.exercise, "--solution", str(solution),
                   *(self.started_with or ())]
        plain = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}  # (the kernel's)
        done = subprocess.run(command, cwd=Path.cwd(), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              check=False, env={**plain, "NO_COLOR": "1", "TERM": "dumb"})
        # (its report; what it said on stderr, its phases too, where it did not get to one)
        views.show_text(done.stdout, done.stderr if done.returncode not in (ExitCode.OK, ExitCode.CHECK_FAILED) else "")
        if done.returncode != 0:
            raise LabSaid([f"lab: {args.exercise}: not passed with this notebook's "
                           f"{', '.join(extracted.defines) or 'definitions (it defines no function)'} "
                           f"(lab run's exit code {done.returncode})"])

    def _trace(self, words: list[str]) -> None:
        """The last %%dist cell's torch.distributed calls on each rank, as a timeline picture."""
        if words:
            raise UsageError(f"%lab trace takes no arguments, got {' '.join(words)} (it draws the last %%dist cell)")
        if self.session is None or not self.session.last_name:
            raise UsageError("no %%dist cell to draw: %lab start, then a %%dist cell, first")
        time.sleep(TRACE_WAIT)  # (each rank sends the records of its calls once a second)
        views.show_timeline(self.session.last_name, self.session.calls(self.session.last_name))

    def _stop(self, words: list[str]) -> None:
        if words:
            raise UsageError(f"%lab stop takes no arguments, got {' '.join(words)}")
        session, self.session = self.session, None
        if session is None:
            views.show_lines(["no ranks to stop"])
            return
        outcome = session.stop()
        views.show_lines([f"the notebook's {session.world_size} rank(s) ended"
                          + (f" ({outcome.status})" if outcome is not None and outcome.status != "completed" else ""),
                          *(outcome.brought_back if outcome is not None else ())])

    def _status(self, words: list[str]) -> None:
        session = self.session
        if session is None:
            views.show_lines(["no ranks: %lab start --nproc N (or --hosts INVENTORY) starts them"])
            return
        state = "running" if session.running else "ended: %lab restart starts fresh ones"
        views.show_lines([f"{session.world_size} rank(s) on {', '.join(sorted(set(session.hosts.values())))}, "
                          f"{session.cells} cell(s) run, {state}"])

    def stop_all(self) -> None:
        """The kernel is going: end the ranks (nothing is left on any host)."""
        if self.session is not None:
            self.session.stop(at_once=True)
            self.session = None


def _said(work: Callable[[], object]) -> object:
    """Run ``work`` (what it returns); a LabError is the lab's one line, the cell failed."""
    try:
        return work()
    except _Helped:
        return None
    except LabError as exc:
        raise LabSaid([f"lab: {exc}"]) from None


def _ended(end: CellEnd) -> None:
    """A cell's end, said where it is not simply "ok" on every rank (the cell then fails)."""
    if end.outcome is not None:
        raise LabSaid([views.run_end_text(end.outcome), "lab: the notebook's ranks have ended: %lab restart starts "
                       "fresh ones and replays the cells that ran"])
    if end.interrupted:
        stuck = [rank for rank in end.ranks if rank not in end.how]
        raise LabSaid([f"lab: interrupted: {views.interrupted_where(end.how)}; the ranks keep their variables"
                       + (f" (ranks {', '.join(map(str, stuck))} had not ended it)" if stuck else "")])
    if end.error is not None:
        raise LabSaid([f"lab: {end.error}", "lab: the notebook's ranks have ended"])
    if end.raised:
        raise LabSaid([f"lab: rank {rank} {how}" for rank, how in sorted(end.raised.items())])
