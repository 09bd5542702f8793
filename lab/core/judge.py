"""Check: turn a run's raw outcome into one judged line per exercise, and an exit code."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lab.core.runner import ExerciseRun, RankState, RunOutcome
from lab.errors import ExitCode
from lab.suite.check import Mismatch, Verdict, World
from lab.suite.registry import EXERCISES

ExerciseStatus = Literal["pass", "fail", "timeout", "not run"]


@dataclass(frozen=True)
class ExerciseReport:
    name: str
    status: ExerciseStatus
    seconds: float | None
    reason: str = ""
    ranks: tuple[int, ...] = ()  # the ranks the failure is about
    mismatches: tuple[Mismatch, ...] = ()
    notes: tuple[str, ...] = ()
    details: dict[int, str] = field(default_factory=dict)  # rank -> traceback, where useful

    @property
    def passed(self) -> bool:
        return self.status == "pass"


def world_of(outcome: RunOutcome) -> World:
    """The run as it happened: each rank's host is where it ran (torchrun places ranks itself)."""
    plan = outcome.plan
    return World(plan.world_size, plan.backend, tuple(s.spec.host for s in outcome.ranks),
                 tuple(s.spec.local_rank for s in outcome.ranks), plan.launcher)


def judge(outcome: RunOutcome) -> list[ExerciseReport]:
    world = world_of(outcome)
    return [_judge_one(outcome.exercises[name], outcome, world) for name in outcome.plan.exercise_names]


def _judge_one(run: ExerciseRun, outcome: RunOutcome, world: World) -> ExerciseReport:
    seconds = max(run.seconds.values()) if run.seconds else None
    died = sorted((s for s in outcome.ranks if s.step == run.name and s.died), key=lambda s: s.ended_at or 0.0)
    if died or run.errors:  # the first rank to die first: its peers' errors are only the echo of it
        causes = [f"rank {s.spec.rank} ({s.spec.host}) exited with code {s.exit_code} during {run.name}"
                  for s in died]
        causes += [f"rank {rank} raised {err['error']}" + (f" at {err['where']}" if err.get("where") else "")
                   for rank, err in sorted(run.errors.items())]
        more = f" (and {len(causes) - 1} more)" if len(causes) > 1 else ""
        ranks = tuple(sorted({s.spec.rank for s in died} | set(run.errors)))
        return ExerciseReport(run.name, "fail", seconds, causes[0] + more, ranks,
                              details={r: e.get("traceback", "") for r, e in run.errors.items()})
    if len(run.results) == world.world_size:
        verdict: Verdict = EXERCISES[run.name].check(run.results, world)
        return ExerciseReport(run.name, "pass" if verdict.passed else "fail", seconds, verdict.reason,
                              verdict.failed_ranks, verdict.mismatches, verdict.notes)
    return _unfinished(run, outcome, seconds)


def _unfinished(run: ExerciseRun, outcome: RunOutcome, seconds: float | None) -> ExerciseReport:
    """Some ranks never reported: say which, and why (hung, or never got there)."""
    here = [s for s in outcome.ranks if s.step == run.name and s.spec.rank not in run.results]
    between = [s for s in outcome.ranks if s.spec.rank in outcome.hung and s.step not in outcome.exercises]
    if outcome.status == "timeout" and (here or (between and run.name == _first_unreported(outcome))):
        stuck = [s for s in here if s.spec.rank in outcome.hung] or here or between
        reason = "; ".join(_stuck(s, outcome.plan.timeout) for s in stuck)
        return ExerciseReport(run.name, "timeout", seconds, reason, tuple(s.spec.rank for s in stuck))
    fatal = [s for s in outcome.ranks if s.fatal]
    if fatal:
        s = fatal[0]
        return ExerciseReport(run.name, "not run", seconds, f"rank {s.spec.rank} ({s.spec.host}) could "
                              f"not start: {s.fatal}", (s.spec.rank,))
    died = sorted((s for s in outcome.ranks if s.died), key=lambda s: s.ended_at or 0.0)
    if died:
        s = died[0]  # the first to go; the others followed it
        return ExerciseReport(run.name, "not run", seconds, f"not run: rank {s.spec.rank} ({s.spec.host}) "
                              f"died with exit code {s.exit_code} during {s.step}", (s.spec.rank,))
    return ExerciseReport(run.name, "not run", seconds, f"not run: the run ended ({outcome.status}) before it")


def _first_unreported(outcome: RunOutcome) -> str | None:
    """The first exercise some rank never reported on: where a hang outside any exercise
    (start-up, a rendezvous, the barrier after one) held the run up."""
    size = outcome.plan.world_size
    return next((n for n in outcome.plan.exercise_names if len(outcome.exercises[n].results) < size), None)


def describe_step(step: str) -> str:
    """A worker's step as a person reads it."""
    kind, _, detail = step.partition(":")
    if kind == "init":
        return f"the rendezvous (init_method {detail}://)"
    if kind == "wait":
        return f"the barrier after {detail}"
    if step == "startup":
        return "start-up (importing torch)"
    return step


def _stuck(state: RankState, timeout: float) -> str:
    where = f" at {state.stopped_at}" if state.stopped_at else ""
    return (f"rank {state.spec.rank} ({state.spec.host}) stopped after {timeout:g}s in "
            f"{describe_step(state.step)}{where}")


def hung_at_start(outcome: RunOutcome) -> bool:
    """The run timed out in a rendezvous or in the first exercise of its shared group: where
    the network, not the program, is the usual cause (the doctor can tell)."""
    if outcome.status != "timeout":
        return False
    first_shared = next((s.exercises[0]["name"] for s in outcome.plan.stages if s.rendezvous == "shared"), None)
    return any(s.step.startswith("init:") or s.step == first_shared
               for s in outcome.ranks if s.spec.rank in outcome.hung)


def exit_code(outcome: RunOutcome, reports: list[ExerciseReport]) -> ExitCode:
    if outcome.status == "interrupted":
        return ExitCode.INTERRUPTED
    if outcome.status == "timeout":
        return ExitCode.TIMEOUT
    if any(r.status == "fail" for r in reports):
        return ExitCode.CHECK_FAILED
    if outcome.status == "crashed" or any(not r.passed for r in reports):
        return ExitCode.RUN_ERROR
    return ExitCode.OK
