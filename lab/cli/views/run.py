"""What a person sees of a run, a launch and a job: each rank's lines as they come, the report
(a line per exercise, the failures with their ranks' last lines, the summary), the known causes.

Whatever a rank printed or raised is untrusted: it is shown through
:func:`lab.rank.text.printable` (escapes made visible) and as ``Text`` (no rich markup)."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from lab.core.judge import ExerciseReport
from lab.core.outcome import Cause, LaunchState, RankState, RunOutcome, ended
from lab.core.report import TAIL_SHOWN, dropped_output, status, summary
from lab.core.runner import OnPhase
from lab.core.stacks import is_labs_frame, users_lines, users_traceback
from lab.rank.text import printable
from lab.suite import registry
from lab.suite.check import distinct

if TYPE_CHECKING:  # (the scenarios' module brings the Docker SDK, which a run needs not)
    from lab.doctor.scenario import ScenarioResult

RANK_STYLES = ("cyan", "magenta", "green", "yellow", "blue", "bright_cyan", "bright_magenta", "bright_green")
STATUS_STYLES = {"pass": "bold green", "fail": "bold red", "timeout": "bold red", "not run": "yellow"}
MISMATCHES_SHOWN = 5


def print_exercises() -> None:
    """``lab list``: one line each."""
    width = max(map(len, registry.EXERCISES))
    for exercise in registry.EXERCISES.values():
        print(f"{exercise.name:{width}}  {exercise.summary}")


def print_plan(plan: dict[str, Any]) -> None:
    """``run --dry-run``: the plan as YAML."""
    print(yaml.safe_dump(plan, sort_keys=False), end="")


def print_left_out(exercises: Iterable[registry.Exercise]) -> None:
    for e in exercises:
        print(f"lab: {e.name} is left out of `run all`: its file:// rendezvous needs a directory every host "
              f"mounts, and these hosts share none (shared_dir); `run {e.name}` runs it anyway", file=sys.stderr)


@contextlib.contextmanager
def phases(console: Console) -> Iterator[OnPhase]:
    """While a run runs, what it is doing: on a terminal a live line (the phase, the time so far),
    gone when the run ends; else a plain line on stderr each time the phase changes."""
    if console.is_terminal:
        columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("lab: starting")
            yield lambda _phase, text: progress.update(task, description=f"lab: {printable(text)}")
        return
    said = [""]

    def plain(phase: str, text: str) -> None:
        if phase != said[0]:
            said[0] = phase
            print(f"lab: {text}", file=sys.stderr, flush=True)

    yield plain


def print_skipped(root: Path, skipped: Sequence[str]) -> None:
    if skipped:
        shown = ", ".join(skipped[:5]) + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        print(f"lab: left out of the workdir {root}: {shown} (links out of it or to nothing, or files you cannot "
              "read)", file=sys.stderr)


def print_ignored_data(ignored: Sequence[tuple[str, int]]) -> None:
    """One line naming what the workdir's ignore rules left out that the program may read (its data),
    and how to carry it."""
    if ignored:
        shown = ", ".join(f"{path} ({size / 2**20:.1f} MiB)" for path, size in ignored[:4])
        more = f" and {len(ignored) - 4} more" if len(ignored) > 4 else ""
        example = next((f"*{Path(p).suffix}" for p, _ in ignored if Path(p).suffix), ignored[0][0])
        print(printable(f"lab: left out by the workdir's ignore rules (.gitignore), and a program may read them: "
                        f"{shown}{more}; carry them with --include PATTERN (e.g. --include '{example}')"),
              file=sys.stderr)


def print_in_place(project: Path, options: Sequence[str], shared: bool = False) -> None:
    """``options`` (what a project's copy carries) change nothing where the ranks start in the project
    (on this machine, or in the folder the hosts share)."""
    where = "in the folder the hosts share" if shared else "on this machine"
    print(printable(f"lab: {' and '.join(options)} changed nothing: {where} the ranks run in the project "
                    f"itself ({project}), as under torchrun; nothing is carried, and what they write is there"),
          file=sys.stderr)


def print_note(line: str) -> None:
    """A line the run says as it goes (what --sync-back brought back), on stderr with the lab's mark."""
    print(printable(f"lab: {line}"), file=sys.stderr, flush=True)


def print_notebook_notes(name: str, notes: Iterable[str]) -> None:
    """What of a notebook taken as a solution was skipped (lab.grading.notebooks)."""
    for note in notes:
        print(f"lab: {name}: {printable(note)}", file=sys.stderr)


def print_reserved(names: Iterable[str]) -> None:
    names = list(names)
    if names:
        print(f"lab: {', '.join(names)} {'is' if len(names) == 1 else 'are'} the run's own setting"
              f"{'' if len(names) == 1 else 's'} (its rendezvous, the lab's): the value{'' if len(names) == 1 else 's'}"
              " given left out", file=sys.stderr)


def print_outside_project(name: str, entries: list[str]) -> None:
    if entries:
        print(f"lab: {name}: {', '.join(entries)} left out (not in the project the launch carries: the hosts "
              "have not got it)", file=sys.stderr)


class LineStreamer:
    """Prints each rank's output as it comes, prefixed with host and rank (or, for a host's
    launcher's own lines, host and launcher); of the stacks a rank prints as it dies (faulthandler),
    the user's frames, not the lab's."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def __call__(self, state: RankState | LaunchState, stream: str, line: str) -> None:
        if stream == "err" and is_labs_frame(line):
            return
        style = RANK_STYLES[state.color % len(RANK_STYLES)]
        text = Text(f"[{state.label}] ", style=style)
        text.append(printable(line), style={"err": "red", "lab": "yellow"}.get(stream, ""))
        self.console.print(text, soft_wrap=True, highlight=False)


def print_cause(console: Console, cause: Cause, evidence: bool = True, interrupted: bool = False) -> None:
    """Why the run hung or failed, across its ranks: the headline, a line of evidence per rank, the fix.
    ``interrupted``: the run was stopped (Ctrl-C) before it could say; only where each rank was."""
    headline = "interrupted; where each rank was:" if interrupted else cause.headline
    console.print(Text(f"lab: {printable(headline)}", style="bold red"), soft_wrap=True, highlight=False)
    for line in cause.evidence if evidence else ():
        console.print(Text(f"  {printable(line.line())}"), soft_wrap=True, highlight=False)
    if interrupted:
        return
    if cause.fix:
        console.print(Text(f"  fix: {printable(cause.fix)}", style="yellow"), soft_wrap=True, highlight=False)
    for note in cause.notes:
        console.print(Text(f"  note: {printable(note)}", style="dim"), soft_wrap=True, highlight=False)


def print_report(console: Console, outcome: RunOutcome, reports: list[ExerciseReport]) -> None:
    console.print()
    if outcome.cause is not None:
        print_cause(console, outcome.cause, interrupted=outcome.status == "interrupted")
        console.print()
    width = max(len(r.name) for r in reports) if reports else 0
    for r in reports:
        line = Text(f"{r.status.upper():8}", style=STATUS_STYLES[r.status])
        line.append(f"{r.name:{width}}  {_seconds(r.seconds):>8}")
        if r.parts and not r.passed:  # partial credit
            said = ", ".join(f"{p.name} {'pass' if p.passed else 'fail'}" for p in r.parts)
            line.append(f"  score {r.score:g} ({said})")
        if not r.passed and r.reason:
            line.append(f"  {printable(r.reason)}", style="dim" if r.status == "not run" else "")
        console.print(line, soft_wrap=True, highlight=False)
        for note in r.notes:
            console.print(Text(f"{'':8}note: {printable(note)}", style="yellow"), soft_wrap=True, highlight=False)
    for note in dropped_output(outcome):
        console.print(Text(f"note: {note}", style="yellow"), soft_wrap=True, highlight=False)
    for r in reports:
        if r.status in ("fail", "timeout"):
            _print_failure(console, outcome, r)
    console.print(Text(summary(outcome, reports), style="bold"), highlight=False)


def _print_failure(console: Console, outcome: RunOutcome, r: ExerciseReport) -> None:
    console.print()
    console.print(Text(f"{r.status.upper()} {r.name}: {printable(r.reason)}", style=STATUS_STYLES[r.status]),
                  soft_wrap=True, highlight=False)
    if outcome.plan.seed:
        console.print(Text(f"  its inputs were drawn from seed {outcome.plan.seed}: `--seed {outcome.plan.seed}` "
                           "draws them again", style="dim"), soft_wrap=True, highlight=False)
    if len(r.mismatches) > 1:
        errors = distinct(r.mismatches)
        for line in errors[:MISMATCHES_SHOWN]:
            console.print(Text(f"  {printable(line)}"), soft_wrap=True, highlight=False)
        if len(errors) > MISMATCHES_SHOWN:
            console.print(f"  ... {len(errors) - MISMATCHES_SHOWN} more distinct error(s)", markup=False)
    for rank in r.ranks[:2]:
        state = outcome.ranks[rank]
        lines = users_lines(list(state.tail))[-TAIL_SHOWN:]
        if rank in r.details and r.details[rank]:
            lines = users_traceback(r.details[rank]).rstrip().splitlines()[-TAIL_SHOWN:]
        if lines:
            console.print(Text(f"  last lines of rank {rank} ({state.spec.host}):", style="dim"))
            for line in lines:
                console.print(Text(f"  | {printable(line)}"), soft_wrap=True, highlight=False)


def print_causes(console: Console, title: str, causes: list[str]) -> None:
    if causes:
        console.print(Text(title, style="bold yellow"))
        for line in causes:
            console.print(Text(f"  {printable(line)}"), soft_wrap=True)


def print_scenario(console: Console, result: ScenarioResult) -> None:
    """The cross-VPC lesson's steps, each passed or failed, and its verdict."""
    console.print()
    for step in result.steps:
        status = "pass" if step.passed else "fail"
        line = Text(f"{status.upper():8}", style=STATUS_STYLES[status])
        line.append(printable(f"{step.what}: {step.detail}"))
        console.print(line, soft_wrap=True)
    console.print(Text(f"cross-vpc {'passed' if result.passed else 'failed'}", style="bold"))


def print_launch(console: Console, script: str, outcome: RunOutcome, failed: list[RankState]) -> None:
    """``lab launch``'s end: torchrun's restarts, each rank that failed, and why; how many succeeded."""
    plan = outcome.plan
    console.print()
    for restart in outcome.restarts:
        console.print(Text(printable(restart.line(plan.options.max_restarts)), style="yellow"), soft_wrap=True)
    if outcome.cause is not None:  # (a timeout's ranks say where they were stopped, below)
        print_cause(console, outcome.cause, evidence=outcome.status != "timeout",
                    interrupted=outcome.status == "interrupted")
    if outcome.cause is None or outcome.status == "timeout":
        for s in failed:
            why = (f"stopped after {plan.timeout:g}s" + (f" at {s.stopped_at}" if s.stopped_at else "")
                   if s.spec.rank in outcome.hung else ended(s.exit_code))
            console.print(Text(f"rank {s.spec.rank} ({s.spec.host}) {why}", style="red"), soft_wrap=True)
    for line in outcome.brought_back:
        console.print(Text(printable(line), style="cyan" if line.startswith("brought back") else "yellow"),
                      soft_wrap=True)
    early = outcome.ended_early()
    for s in early:
        how = f"called {s.end.error.removeprefix('SystemExit: ')}" + (f" at {s.end.where}" if s.end.where else "") \
            if s.end is not None else "its script returned"
        console.print(Text(printable(f"rank {s.spec.rank} ({s.spec.host}) ended early: {how} (status 0) while the "
                                     f"job went on without it"), style="yellow"), soft_wrap=True)
    attempts = f" over {len(outcome.restarts) + 1} attempts" if outcome.restarts else ""
    apart = f", {len(early)} ended early" if early else ""
    console.print(Text(f"{script}: {plan.world_size - len(failed) - len(early)} of {plan.world_size} ranks succeeded"
                       f"{apart} in {outcome.seconds:.1f}s{attempts} ({status(outcome)})", style="bold"),
                  highlight=False)


def print_job_output(output: str) -> None:
    """``submit --wait``: what the job printed, as it printed it (its own report)."""
    print(output, end="")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"
