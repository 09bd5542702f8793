"""Check: turn a run's raw outcome into one judged line per exercise, and an exit code."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lab.core import launchers
from lab.core.outcome import SYS_EXIT, ExerciseRun, RankState, RunOutcome, ended
from lab.core.random_inputs import values
from lab.errors import ExitCode
from lab.rank import steps
from lab.rank.events import Error
from lab.rank.text import exception_line
from lab.suite.check import Mismatch, PartVerdict, Verdict, World, ranks_named
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
    parts: tuple[PartVerdict, ...] = ()  # each function the student writes, judged on its own

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def score(self) -> float:
        """The fraction of its parts passed (partial credit); without parts, 1 for a pass, else 0."""
        if self.passed or not self.parts:
            return 1.0 if self.passed else 0.0
        return sum(p.passed for p in self.parts) / len(self.parts)


def world_of(outcome: RunOutcome) -> World:
    """The run as it happened: each rank's host is where it ran (torchrun places ranks itself), and what
    its hosts' connections carried where the run measured them (one exercise: the measure spans the run)."""
    plan = outcome.plan
    measured = plan.wire is not None and len(plan.exercise_names) == 1  # (the measure spans the whole run)
    return World(plan.world_size, plan.backend, tuple(s.spec.host for s in outcome.ranks),
                 tuple(s.spec.local_rank for s in outcome.ranks), launchers.find(plan.launcher).launched,
                 {rank: values(data) for rank, data in plan.inputs.items()},
                 {s.spec.host: s.launch.carried for s in outcome.ranks if s.launch.carried} if measured else None)


def judge(outcome: RunOutcome) -> list[ExerciseReport]:
    world = world_of(outcome)
    return [_judge_one(outcome.exercises[name], outcome, world) for name in outcome.plan.exercise_names]


def _judge_one(run: ExerciseRun, outcome: RunOutcome, world: World) -> ExerciseReport:
    seconds = max(run.seconds.values()) if run.seconds else None
    died = _died_in(run, outcome)
    if run.violations:  # a rank broke the protocol (lab.rank.protocol): whatever else it reported
        broke = [f"{_named(outcome.ranks[rank])} {what}" for rank, what in sorted(run.violations.items())]
        more = f" (and {len(broke) - 1} more)" if len(broke) > 1 else ""
        return ExerciseReport(run.name, "fail", seconds, broke[0] + more, tuple(sorted(run.violations)),
                              notes=tuple(broke[1:]))
    if died or run.errors:  # the first rank to die first: its peers' errors are only the echo of it
        exits = {s.spec.rank: run.errors[s.spec.rank] for s in died
                 if s.spec.rank in run.errors and run.errors[s.spec.rank].error.startswith(SYS_EXIT)}
        causes = [_death(s, run, exits.get(s.spec.rank)) for s in died]
        raised: dict[str, list[int]] = {}  # the same error on several ranks is one cause
        for rank, err in sorted(run.errors.items()):
            if rank not in exits:
                raised.setdefault(_raised(err), []).append(rank)
        causes += [f"{ranks_named(ranks)} {text}" for text, ranks in raised.items()]
        more = f" (and {len(causes) - 1} more)" if len(causes) > 1 else ""
        ranks = tuple(sorted({s.spec.rank for s in died} | set(run.errors)))
        return ExerciseReport(run.name, "fail", seconds, causes[0] + more, ranks,
                              details={r: e.traceback for r, e in run.errors.items()})
    if len(run.results) == world.world_size:
        return checked(run, world, outcome.plan.options.part, seconds)
    return _unfinished(run, outcome, seconds)


def checked(run: ExerciseRun, world: World, part: str | None, seconds: float | None = None) -> ExerciseReport:
    """Every rank's results and calls for ``run`` checked (the exercise's own checks, lab.suite). What
    the ranks reported is theirs, whatever it holds: one that a check cannot compute with (a shape
    that overflows, a value of no type it knows) fails the exercise, said in one line, and never the
    grader."""
    try:
        verdict: Verdict = EXERCISES[run.name].judge(run.results, run.calls, world, part)
    except Exception as exc:
        return ExerciseReport(run.name, "fail", seconds, f"its results could not be checked: {exception_line(exc)}")
    return ExerciseReport(run.name, "pass" if verdict.passed else "fail", seconds, verdict.reason,
                          verdict.failed_ranks, verdict.mismatches, verdict.notes, parts=verdict.parts)


def _unfinished(run: ExerciseRun, outcome: RunOutcome, seconds: float | None) -> ExerciseReport:
    """Some ranks never reported: say which, and why (hung, or never got there)."""
    here = [s for s in outcome.ranks if s.step == steps.exercise(run.name) and s.spec.rank not in run.results]
    between = [s for s in outcome.ranks if s.spec.rank in outcome.hung and s.step.kind != "exercise"]
    if outcome.stopped and (here or (between and run.name == _first_unreported(outcome))):
        stuck = [s for s in here if s.spec.rank in outcome.hung] or here or between
        where: dict[str, list[RankState]] = {}  # ranks stuck at the same place are one phrase
        for s in stuck:
            where.setdefault(_stuck_at(s, outcome), []).append(s)
        reason = "; ".join(f"{_who(states)} {at}" for at, states in where.items())
        return ExerciseReport(run.name, "timeout", seconds, reason, tuple(s.spec.rank for s in stuck))
    # the first rank to go is the cause (its peers fail after it, at a rendezvous or a barrier)
    died = sorted((s for s in outcome.ranks if s.died), key=lambda s: s.ended_at or 0.0)
    first = next(iter(died), None) or next((s for s in outcome.ranks if s.fatal), None)
    if outcome.status == "preflight":
        return ExerciseReport(run.name, "not run", seconds, "not run: the preflight found the network unfit for "
                              "the job, and no rank started")
    if first is None:
        return ExerciseReport(run.name, "not run", seconds, f"not run: the run ended ({outcome.status}) before it")
    who = f"rank {first.spec.rank} ({first.spec.host})"
    if first.fatal and first.step.before_program:
        reason = f"{who} could not start: {first.fatal}"
    elif first.fatal:
        reason = f"not run: {who} failed in {first.step}: {first.fatal}"
    else:
        reason = f"not run: {who} {ended(first.exit_code)} during {first.step}"
    return ExerciseReport(run.name, "not run", seconds, reason, (first.spec.rank,))



def _named(state: RankState) -> str:
    return f"rank {state.spec.rank} ({state.spec.host})"


def _died_in(run: ExerciseRun, outcome: RunOutcome) -> list[RankState]:
    """The ranks that died in ``run``, the first first: those seen in it, and, where it went on on
    the others (a rank died in it or raised), those last heard outside it that said nothing of it (a
    rank that takes its launcher down with it, ``kill(-1)``, takes the word that it began the exercise
    too)."""
    here = steps.exercise(run.name)
    seen_in = [s for s in outcome.ranks if s.died and s.step == here]
    unheard = [s for s in outcome.ranks if s.died and s.step.kind != "exercise" and not run.reported(s.spec.rank)]
    return sorted(seen_in + unheard if seen_in or run.errors else [], key=lambda s: s.ended_at or 0.0)


def _death(state: RankState, run: ExerciseRun, exit_error: Error | None) -> str:
    """How a rank that died during ``run`` ended: by its own sys.exit (the worker said where), or not."""
    who = f"rank {state.spec.rank} ({state.spec.host})"
    if exit_error is not None:
        where = f" at {exit_error.where}" if exit_error.where else ""
        return (f"{who} called {exit_error.error.removeprefix(SYS_EXIT)}{where} during {run.name} "
                f"and {ended(state.exit_code)}")
    if state.step != steps.exercise(run.name):
        return f"{who} {ended(state.exit_code)} while the others ran {run.name}, last heard in {state.step}"
    when = "after" if state.spec.rank in run.results else "before"
    return f"{who} {ended(state.exit_code)} during {run.name}, {when} reporting its result"


def _raised(error: Error) -> str:
    where = f" at {error.where}" if error.where else ""
    if error.error.startswith(SYS_EXIT):
        return f"called {error.error.removeprefix(SYS_EXIT)}{where}"
    return f"raised {error.error}{where}"


def _first_unreported(outcome: RunOutcome) -> str | None:
    """The first exercise some rank never reported on: where a hang outside any exercise
    (start-up, a rendezvous, the barrier after one) held the run up."""
    size = outcome.plan.world_size
    return next((n for n in outcome.plan.exercise_names if len(outcome.exercises[n].results) < size), None)


def _stuck_at(state: RankState, outcome: RunOutcome) -> str:
    where = f" at {state.stopped_at}" if state.stopped_at else ""
    if outcome.status == "hung":
        return f"hung in {state.step}{where}"
    after = (f"at the run's limit of {outcome.wall:g}s" if outcome.wall is not None
             else f"after {outcome.plan.timeout:g}s")
    return f"stopped {after} in {state.step}{where}"


def _who(states: list[RankState]) -> str:
    """``rank 2 (node3)``, ``ranks 0, 1 (node1)``, ``ranks 0 (node1), 1 (node2)``."""
    hosts = {s.spec.host for s in states}
    if len(hosts) == 1:
        return f"{ranks_named([s.spec.rank for s in states])} ({hosts.pop()})"
    return "ranks " + ", ".join(f"{s.spec.rank} ({s.spec.host})" for s in sorted(states, key=lambda s: s.spec.rank))


# What the analysis of a run (lab.core.why) says when it cannot tell the program's fault: the network may be why
NETWORK_MAY_BE_WHY = ("rendezvous", "network", "unknown")


def the_network_may_be_why(outcome: RunOutcome) -> bool:
    """The run hung or timed out in a rendezvous or in the first exercise of its shared group, where the
    network, not the program, is the usual cause (the doctor can tell), and the run's own analysis named
    no cause of the program's (a cycle of receives, a collective some rank did not make...); not where a
    rank's exercise raised (its program failed, and the others wait on it)."""
    if not outcome.stopped or any(run.errors for run in outcome.exercises.values()):
        return False
    if outcome.cause is not None and outcome.cause.kind not in NETWORK_MAY_BE_WHY:
        return False
    first_shared = next((s.exercises[0]["name"] for s in outcome.plan.stages if s.rendezvous == "shared"), None)
    return any(s.step.kind == "rendezvous" or first_shared is not None and s.step == steps.exercise(first_shared)
               for s in outcome.ranks if s.spec.rank in outcome.hung)


def stopped_exit(outcome: RunOutcome) -> ExitCode | None:
    """The exit code of a run that did not run to its end (interrupted, stopped by the preflight, hung or
    timed out); None for one that did, whose verdicts say the rest."""
    if outcome.status == "interrupted":
        return ExitCode.INTERRUPTED
    if outcome.status == "preflight":
        return ExitCode.NETWORK
    if outcome.stopped:
        return ExitCode.TIMEOUT
    return None


def exit_code(outcome: RunOutcome, reports: list[ExerciseReport]) -> ExitCode:
    stopped = stopped_exit(outcome)
    if stopped is not None:
        return stopped
    if any(r.status == "fail" for r in reports):
        return ExitCode.CHECK_FAILED
    if outcome.status == "crashed" or any(not r.passed for r in reports):
        return ExitCode.RUN_ERROR
    return ExitCode.OK
