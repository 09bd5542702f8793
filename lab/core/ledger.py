"""The run's ledger: what every rank and exercise of a run is, from the events they sent, and the
rules that say when a run is late or hung. Pure: it reads no stream, starts and stops nothing
and keeps no clock of its own (each call is told ``now``), so it is tested with made-up event
sequences; the runner (lab.core.runner) feeds it and acts on what it says.

Events come only through each rank's private channel (lab.rank.protocol): nothing a rank prints
is one. Every event is validated and typed (``lab.rank.events.parse_event``: a class a kind) and
checked against the run (an exercise of the plan, a step it has, an attempt of torchrun's). One
that fails is not applied: it is the failure of the rank that sent it, in the exercise that rank is
in (``ExerciseRun.violations``), never the controller's; the run goes on. Under ``--launcher lab``
the zygote has checked each event against the rank whose pipe it came through (``lab.rank.zygote``):
one in another rank's name comes as a ``bad`` event of its sender's; under torchrun and mp.spawn an
event's ``rank`` field says whose it is.

The rules. Every step a rank takes (start-up, rendezvous, one exercise) has at most
``plan.timeout`` seconds, and every exercise a deadline as long, from when the rank began it, that
no later event moves (a step it is in already, or steps past as many as the plan has, do not
restart its clock either): a rank past either is late (:meth:`Ledger.late`). The lab's own steps
of a ``run`` count only time in which nothing of the run moved. The ranks hang (:meth:`Ledger.hung`)
once every live rank blocks in a torch.distributed call and says nothing moved on its connections
for ``Options.hang_after`` seconds; a rank computing outside torch.distributed is no hang, whatever
the others wait for, and neither is a slow collective, whose bytes move.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from lab.core import launchers
from lab.core.outcome import SYS_EXIT, ExerciseRun, LaunchState, RankState, Restart, between_cells
from lab.core.plan import Plan
from lab.core.preflight import EVENTS as PREFLIGHT_EVENTS
from lab.core.preflight import Preflight
from lab.core.rankview import LOST, TIMED_OUT
from lab.core.stacks import is_stack_line, where_stopped
from lab.core.streams import claimed_rank
from lab.rank import steps
from lab.rank.events import (
    Alive,
    Bad,
    Cell,
    Died,
    Done,
    End,
    Error,
    Event,
    Exit,
    Fatal,
    Flight,
    Hello,
    MalformedEvent,
    Probe,
    Progress,
    Pulse,
    RankEvent,
    Result,
    Saved,
    Step,
    TorchDump,
    Trace,
    WireMeasure,
    parse_event,
)
from lab.rank.flightrecords import Calls
from lab.rank.quiet import quiet_enough
from lab.rank.steps import STARTUP, RankStep
from lab.suite.check import Carried

log = logging.getLogger(__name__)

VIOLATIONS_KEPT = 10  # of one rank's
DUMP_MAX = 10_000  # lines of one rank's stack dump kept
STREAM_GRACE = 1.0  # seconds to wait for the last lines of a process that ended
TIMEOUT_SETTLE = 1.0  # seconds after the last rank that timed out, for the others in its call to time out too
HeardSince = Callable[[str, float], bool]  # (host, since when): whether its transport heard from it since


class Ledger:
    """The states of a run's launches, ranks and exercises, and its rules (``started``: when the
    run began)."""

    def __init__(self, plan: Plan, started: float) -> None:
        self.plan = plan
        self.launcher = launchers.find(plan.launcher)
        self.launches = [LaunchState(launch, plan.launcher) for launch in plan.launches]
        self.states = [RankState(spec, next(launch for launch in self.launches if spec.rank in launch.launch.ranks))
                       for spec in plan.ranks]
        self.runs = {name: ExerciseRun(name) for name in plan.exercise_names}
        self.preflight: Preflight | None = None  # the hosts' check of the network, while it is not decided
        self.saved: list[tuple[str, str, int]] = []  # (host, path, size) each file a rank said it saved, not yet taken
        # The last time something of the run moved (an event that is news, a start-up's CPU seconds
        # grown), and each start-up's CPU seconds so far (rank, or -1 - launch for its launcher's):
        # what the deadline of the lab's own steps counts from (_step_late).
        self.moved_at = started
        self.cpu_seen: dict[int, float] = {}
        self.restarts: list[Restart] = []  # torchrun's restarts of the ranks (--max-restarts), in order
        self.attempt_began = started  # when the attempt the ranks are in began (the run, or its last restart)

    def begin(self, now: float) -> None:
        """The launches started: every rank's first step (its start-up) begins now."""
        for state in self.states:
            state.step_started = now

    # -- events -----------------------------------------------------------------------------

    def apply(self, launch: LaunchState, line: str, now: float) -> None:
        """Check an event line of ``launch``'s stdout and apply it. One that breaks the protocol is not
        applied: it is the failure of the rank that sent it, the one it names (under ``--launcher lab``
        the zygote has made sure of that: ``lab.rank.zygote``)."""
        states, runs = self.states, self.runs
        try:
            event = parse_event(line, self.plan.token)
        except MalformedEvent as exc:
            self.violation(claimed_rank(line[:200], states) or self.first_rank(launch),
                           f"sent a malformed event: {exc}")
            return
        if event is None:
            return
        if isinstance(event, Pulse):  # (a host's launcher, in its preflight: its start-up's CPU seconds)
            self._cpu_seen(-1 - self.launches.index(launch), event.cpu, now)
            return
        if isinstance(event, Probe) and event.kind in PREFLIGHT_EVENTS and self.preflight is not None and \
                not self.preflight.decided:
            self.preflight.take(launch.launch.host, event)
            return
        if isinstance(event, WireMeasure) and self.plan.wire is not None:  # (only a launcher out of the ranks' reach)
            if launch.carried is not None:  # its launcher says it once, as it ends: this one is a forgery
                self.violation(self.first_rank(launch), f"wrote a second word of {launch.launch.host}'s launcher "
                               "on what its connections carried (the launcher says it once)")
                return
            launch.carried = Carried(event.carried, event.lost, event.error, event.failed, event.space)
            return
        if event.SENDER not in ("rank", "launcher") or not isinstance(event, RankEvent):
            self.violation(self.first_rank(launch), f"sent a {event.kind!r} event, which no rank sends")
            return
        rank = event.rank
        if not 0 <= rank < len(states):
            self.violation(self.first_rank(launch), f"sent an event as rank {rank}, which the run does not have")
            return
        state = states[rank]
        if isinstance(event, (Result, Error)):
            if event.exercise not in runs:
                self.violation(state, f"reported on {event.exercise!r}, which is not an exercise of the run")
                return
            if runs[event.exercise].reported(rank):
                self.violation(state, f"reported on {event.exercise} twice")
                return
        if isinstance(event, Step):
            step = steps.parse(event.step, runs)
            if step is None:
                self.violation(state, f"began a step the run does not have: {event.step[:100]!r}")
                return
            self.moved_at = now
            self._took_step(state, step, now)
            return
        self._handle(launch, state, event, now)

    def first_rank(self, launch: LaunchState) -> RankState:
        """The rank a broken event of ``launch``'s is the failure of when it names none that the run has."""
        return self.states[launch.launch.ranks[0]]

    def _cpu_seen(self, whose: int, cpu: float, now: float) -> None:
        """A start-up's CPU seconds (a rank's, or ``-1 - i`` for launch i's launcher): grown, the run moved."""
        if cpu > self.cpu_seen.get(whose, -1.0):
            self.cpu_seen[whose] = cpu
            self.moved_at = now

    def _handle(self, launch: LaunchState, state: RankState, event: Event, now: float) -> None:
        """Apply a valid event of ``state``'s rank."""
        rank = state.spec.rank
        if not isinstance(event, (Progress, Flight, Trace, TorchDump, Alive)) or isinstance(event, Progress) and \
                state.progress is not None and event.quiet < state.progress.quiet:  # (news, not "still waiting")
            self.moved_at = now
        match event:
            case Alive(cpu=cpu):
                state.startup_cpu = cpu
                self._cpu_seen(rank, cpu, now)
            case Hello():
                self._said_hello(launch, state, event, now)
            case Result(exercise=name, value=value, seconds=seconds, calls=calls):
                run = self.runs[name]
                run.results[rank], run.seconds[rank], run.calls[rank] = value, seconds, calls
            case Error(exercise=name):
                self.runs[name].errors[rank] = event
            case Fatal(error=error, traceback=traceback):
                state.fatal, state.traceback = error, traceback
            case Exit(code=code):  # a host's launcher says how this rank ended, before it ends itself
                if state.exit_code is not None:  # (it says so once: a second word is not the launcher's)
                    self.violation(state, "was said to have ended a second time (only its launcher says how a "
                                   "rank ended, once)")
                    return
                state.exit_code, state.ended_at = code, now
                state.done |= self.plan.is_launch and code == 0  # a script says nothing
            case Bad(what=what):  # the lab's launcher says the rank broke the protocol
                self.violation(state, what)
            case Done():
                state.done = True
            case Progress():  # whether it blocks, and how long nothing moved, is what tells a hang
                state.progress, state.progress_at = event, now
                if math.isfinite(event.at) and event.at > 0:  # (a rank's word: a NaN would spoil the trace)
                    state.clock = min(now - event.at, state.clock if state.clock is not None else math.inf)
            case Trace(records=records, dropped=dropped):
                _traced(state, records, dropped)
            case TorchDump(dump=dump):
                state.torch_dump = dump
            case Died():
                state.last_call = event
            case Flight():
                state.flight, state.flight_at = event, now
            case End():
                state.end, state.end_at = event, now
            case Cell():  # (a notebook's rank: whether it waits for the next cell, for the hang rule)
                state.cell = event
                if not event.ended:  # (each cell's output is shown within bounds of its own)
                    state.output.new_window()
            case Saved(path=path, size=size):  # (--sync-back: the runner brings it back while the job goes on)
                self.saved.append((launch.launch.host, path, size))

    def _took_step(self, state: RankState, step: RankStep, now: float) -> None:
        """The rank began ``step``. A step it is in already keeps its clock; so do steps past the
        plan's count of them, and an exercise's deadline runs from when the rank first began it
        (``_past_deadline``)."""
        state.steps += 1
        if step != state.step and state.steps <= self._step_budget():
            state.step, state.step_started = step, now
            if step.kind == "exercise":
                state.entered.setdefault(step.name, now)

    def _said_hello(self, launch: LaunchState, state: RankState, hello: Hello, now: float) -> None:
        """The rank started: note what it says of itself, and where it runs. A rank says hello once
        an attempt: a second is torchrun's agent restarting the ranks (``--max-restarts``), which
        begins the rank anew."""
        limit = self.plan.options.max_restarts
        if hello.restart > limit:
            self.violation(state, f"said hello as torchrun's restart {hello.restart}, past --max-restarts {limit}")
            return
        if state.info is not None and hello.restart <= state.info.restart:
            self.violation(state, "said hello a second time in one attempt")
            return
        if hello.restart > len(self.restarts):  # the first rank of a new attempt: what ended the one before
            self.restarts.append(Restart(hello.restart, self._attempt_ended(), now - self.attempt_began))
            self.attempt_began = now
        if state.info is not None:
            _begin_anew(state, now)
        state.info = hello
        host = self.launcher.host_of(self.plan, launch.launch.host, hello.hostname)
        if state.launch is not launch or state.spec.host != host or state.spec.local_rank != hello.local_rank:
            # torchrun or Slurm placed it elsewhere than planned: it runs where it says it does
            state.launch = launch
            state.spec = replace(state.spec, host=host, local_rank=hello.local_rank)

    def _attempt_ended(self) -> tuple[str, ...]:
        """How the ranks of the attempt torchrun is restarting ended, as far as they said: those whose
        program raised or exited with a failing status (its end event), first those that failed of their
        own, not by losing a peer (each host's stream brings its ranks' ends in no order across hosts),
        each in the order they said it."""
        ended = [(s, s.end) for s in self.states if s.end is not None and (s.end.how == "raised" or s.end.code != 0)]
        ended.sort(key=lambda said: (LOST.search(said[1].error) is not None, said[0].end_at or 0.0))
        return tuple(f"rank {s.spec.rank} ({s.spec.host}) {_ended_how(end)}" for s, end in ended)

    def _step_budget(self) -> int:
        """The most step events a worker sends: a rendezvous per stage, an exercise and the barrier after it."""
        return 2 * len(self.plan.stages) + 2 * len(self.plan.exercise_names) + 2

    def violation(self, state: RankState, what: str) -> None:
        """The rank broke the protocol (``what``: "sent a malformed event: ..."): the exercise it is in
        fails for it (before any, its next one; after the last, the last one)."""
        log.debug("rank %d: %s", state.spec.rank, what)
        if len(state.violations) < VIOLATIONS_KEPT:
            state.violations.append(what)
        runs = self.runs
        if not runs:
            state.fatal = state.fatal or what
            return
        step = state.step.exercise
        name = step if step is not None else next((n for n, run in runs.items() if not run.reported(state.spec.rank)),
                                              list(runs)[-1])
        runs[name].violations.setdefault(state.spec.rank, what)

    # -- ends and rules ---------------------------------------------------------------------

    def exited(self, launch: LaunchState, code: int | None, now: float) -> None:
        """``launch``'s process ended with status ``code`` (None: it runs still), as the runner saw it."""
        if launch.exit_code is None and code is not None:
            launch.exit_code, launch.exited_at = code, now

    def stream_ended(self, launch: LaunchState) -> None:
        """One of ``launch``'s streams was read to its end."""
        launch.open_streams -= 1

    def settle(self, now: float) -> float | None:
        """Tell the ranks of the launches that ended, once their last lines are read (they may say how
        each one ended; readers still busy with a flood it printed get STREAM_GRACE from their last
        line); ``now`` when the first of them left a rank unfinished (a crash), else None."""
        crashed_at: float | None = None
        for launch in self.launches:
            if launch.exited_at is not None and not launch.settled and (
                    launch.open_streams == 0 or now - max(launch.exited_at, launch.read.active_at) > STREAM_GRACE):
                launch.settled = True
                crashed_at = crashed_at or self.ended(launch, now)
        return crashed_at

    def killed(self, launch: LaunchState, code: int | None) -> None:
        """The runner ended ``launch`` (the run is over): its status, and its ranks' that had none."""
        if launch.exit_code is None:
            launch.exit_code = code
        for state in self.states:
            if state.launch is launch and state.exit_code is None:
                state.exit_code = launch.exit_code

    def dumped(self, state: RankState, line: str) -> bool:
        """A line of stderr from a rank asked for its stacks: kept, and True, where it is one of a
        stack's (a rank that floods stderr floods no dump: DUMP_MAX lines)."""
        if len(state.dump) >= DUMP_MAX or not is_stack_line(line):
            return False
        state.dump.append(line)
        return True

    def located(self, programs: dict[str, Path]) -> None:
        """Where each live rank stopped, from its stacks (``programs``: the run's, lab.core.stacks.program_files)."""
        for state in self.states:
            if state.exit_code is None:
                state.stopped_at = where_stopped(state.dump, programs)

    def ended(self, launch: LaunchState, now: float) -> float | None:
        """``launch``'s ranks ended with it; ``now`` if one of them had not finished (a crash)."""
        mine = [state for state in self.states if state.launch is launch]
        # when it ended: its streams' end, as its readers met it (so the first of several ranks
        # to die is told apart from those that followed it within the same look), else now
        closed_at = launch.read.closed_at
        ended = closed_at if launch.open_streams == 0 and closed_at is not None else now
        for state in mine:
            if state.exit_code is None:  # (a host's launcher may have said already how a rank ended)
                state.exit_code, state.step_started, state.ended_at = launch.exit_code, now, ended
            state.done |= self.plan.is_launch and launch.exit_code == 0  # a script says nothing
        return now if any(not state.done for state in mine) else None

    def late(self, now: float) -> list[int]:
        """The live ranks past a step's timeout or an exercise's deadline."""
        return [s.spec.rank for s in self.states if s.exit_code is None and (
            self._step_late(s, now) or self._past_deadline(s, now))]

    def _step_late(self, state: RankState, now: float) -> bool:
        """Whether the rank is past its step's timeout. A step of the program's (an exercise, a script)
        has ``plan.timeout`` seconds of the wall clock: the user's bound. The lab's own steps of a
        ``run`` (start-up and the rendezvous) take as long as a busy machine makes them: their
        timeout counts only time in which nothing of the run moved (no event that is news, no
        start-up's CPU seconds grown: a rank starting slowly holds the others' rendezvous up, not
        back), and a start-up that used more CPU seconds than the timeout is late too."""
        timeout = self.plan.timeout
        if self.plan.is_launch:  # (a job's bound, when it has one: 0 is none)
            return bool(timeout) and now - state.step_started > timeout
        if not state.step.before_program:
            return now - state.step_started > timeout
        return now - max(state.step_started, self.moved_at) > timeout or state.startup_cpu > timeout

    def _past_deadline(self, state: RankState, now: float) -> bool:
        """Whether the rank is past an exercise's deadline: ``plan.timeout`` seconds from when it
        began the exercise, whatever steps it took since, until it reports on it."""
        return any(now - began > self.plan.timeout and not self.runs[name].reported(state.spec.rank)
                   for name, began in state.entered.items())

    def crash_told(self, now: float) -> bool:
        """After a crash, whether what the ranks still running could say of it is in already, so that the
        runner need not wait out its grace for them: the first rank that died ended its program with a
        timeout (it waited its group's timeout for ranks that never came: those will not come now
        either), and no rank has died for TIMEOUT_SETTLE seconds (the others waiting in that call, which
        began their wait a moment apart, have timed out by then too, and those waiting on the ones that
        died have lost them). Where the rest are is for their stacks to tell."""
        died = sorted((s for s in self.states if s.died), key=lambda s: s.ended_at or 0.0)
        live = [s for s in self.states if s.exit_code is None and s.ended_at is None]
        return bool(died) and bool(live) and died[0].end is not None and \
            TIMED_OUT.search(died[0].end.error) is not None and now - (died[-1].ended_at or now) >= TIMEOUT_SETTLE

    def hung(self, now: float, heard_since: HeardSince) -> list[int]:
        """The live ranks, when they hang: every one waits in a torch.distributed call and says that
        nothing moved on its connections, nor did it complete a call, for ``Options.hang_after`` seconds
        (its progress events: two looks of the kernel's counters, on the rank's own clock, not this
        one's, which a busy machine can stall), and every host of theirs has answered since (its
        transport's keepalives: ``heard_since``). A rank computing outside torch.distributed is no
        hang: the others wait on it (a straggler); neither is a slow collective, whose bytes move. A
        notebook's rank that has ended its cell and waits for the next is not live: its peers wait on
        it in vain (lab.core.outcome.between_cells)."""
        waiting = between_cells(self.states)
        live = [s for s in self.states if s.exit_code is None and s.spec.rank not in waiting]
        said = [(s.progress, s.progress_at or now) for s in live]
        if not live or any(p is None or p.inflight is None or not quiet_enough(p.quiet, self.plan.options.hang_after)
                           for p, _ in said):
            return []
        # A host that has not answered since then may have gone silent, not its ranks: that is for
        # its transport to tell (a lost host), not a hang.
        still_since = max(at - p.quiet for p, at in said if p is not None)
        hosts = {s.launch.launch.host for s in live}
        return [s.spec.rank for s in live] if all(heard_since(h, still_since) for h in hosts) else []

    def phase(self) -> tuple[str, str]:
        """What the run is at, from what its hosts and ranks said so far: (the phase, a line)."""
        if self.preflight is not None and not self.preflight.decided:
            return "preflight", f"checking the network from {len(self.plan.hosts)} host(s) (preflight)"
        started = sum(1 for s in self.states if s.info and (self.plan.is_launch or s.step != STARTUP))
        if started < len(self.states):
            return "starting", f"starting {len(self.states)} rank(s): {started} started"
        steps = [s.step for s in self.states if not s.done and s.ended_at is None]
        if not steps:
            return "finishing", "finishing: every rank has ended"
        joining = sum(1 for step in steps if step.kind == "rendezvous")
        if joining:
            return "rendezvous", f"rendezvous: {len(self.states) - joining} of {len(self.states)} rank(s) joined"
        working = [step.exercise for step in steps if step.exercise is not None]  # (the barrier after one too)
        current = max(set(working), key=working.count) if working and not self.plan.is_launch else ""
        return "running", (f"running {current}: {len(steps)} rank(s)" if current
                           else f"running: {len(steps)} of {len(self.states)} rank(s) at work")


TRACE_MAX = 100_000  # records of a rank kept for --trace; the rest are counted as left out


def _traced(state: RankState, records: Calls, dropped: int) -> None:
    """A rank's trace records (as read: lab.rank.flightrecords), the newest of each call."""
    for record in records.records:
        key = (record.group, record.op, record.t0)  # (a call's number may move: torch's calls found later)
        if key in state.trace or len(state.trace) < TRACE_MAX:
            state.trace[key] = record
        else:
            state.trace_overflow += 1
    state.trace_said_dropped = max(state.trace_said_dropped, dropped)


def _ended_how(end: End) -> str:
    where = f" at {end.where}" if end.where else ""
    if end.how == "raised":
        return f"raised {end.error}{where}"
    return f"called {end.error.removeprefix(SYS_EXIT)}{where} (status {end.code})"


def _begin_anew(state: RankState, now: float) -> None:
    """A rank torchrun restarted: nothing its last attempt said holds for this one (its output stays)."""
    state.step, state.step_started, state.steps, state.entered, state.startup_cpu = STARTUP, now, 0, {}, 0.0
    state.progress = state.progress_at = state.flight = state.flight_at = state.end = state.end_at = None
    state.fatal = state.traceback = None
