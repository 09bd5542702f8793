"""Run a plan: start its launches through each host's transport, stream, collect, stop.

The runner never prints: each output line goes to an ``on_line`` callback and the
outcome comes back as data. It guarantees that when :func:`run_plan` returns or
raises (a failure, a timeout, Ctrl-C), no rank process is left on any host.

Before the ranks start, every host gets the run's directory and files (``Transport.prepare``)
and rank 0's host a port holder (``lab.rank.ports``) that chooses the run's rendezvous ports
there and holds them until the run ends; each launch then starts with the plan's macros
(``${run_dir}``, ``${portN}``) filled in for its host.

A launch is one process per host, the host's launcher, which starts the host's ranks (the lab's
zygote forks them, torchrun and mp.spawn start them). Before it does, it checks the network the
job will use with the others (the preflight, lab.core.preflight, whose lines the runner carries):
a network that fails it stops the run, status ``preflight``, before any rank started. Every line
of a rank's is tagged with it
(by the zygote, else by the rank's relay: lab.rank.output) and every event names its rank, so
each line reaches the right rank; torchrun numbers the ranks itself, so a rank's host is the one
whose launch its hello event came through.

Events come only through each rank's private channel (lab.rank.protocol): nothing a rank prints
is one. Every event is validated (``parse_event``) and checked against the run (an exercise of
the plan, a step it has). One that fails is not applied: it is the failure of the rank that sent
it, in the exercise that rank is in (``ExerciseRun.violations``), never the controller's; the run
goes on. Under ``--launcher lab`` the zygote has checked each event against the rank whose pipe it
came through (``lab.rank.zygote``): one in another rank's name comes as a ``bad`` event of its
sender's; under torchrun and mp.spawn an event's ``rank`` field says whose it is.

A watchdog gives every step a rank takes (start-up, rendezvous, one exercise) at most
``plan.timeout`` seconds, and every exercise a deadline as long, from when the rank began it,
that no later event moves (a step it is in already, or steps past as many as the plan has, do
not restart its clock either). A rank past either is hung: the runner asks every live rank for
its Python stacks (SIGUSR1, see lab.rank.worker), notes where each one stopped (lab.core.stacks),
and kills them all.

A hang is found long before that. Every rank's flight recorder (lab.rank.flight) says, once a second
when it changed or while a call blocks, how many torch.distributed calls it completed, which one it
blocks in, and for how long nothing moved on its connections (``progress``: the kernel's counters,
looked at on the rank's own clock), and sends its records when a call has blocked 2 s (``flight``).
Once every live rank blocks in a call and says nothing moved for ``plan.hang_after`` seconds, the
ranks hang (a slow collective, whose bytes move, never does): the runner waits briefly for their
records, locates them as above and stops them. A rank computing outside torch.distributed is no
hang, whatever the others wait for. Whatever way the run ends short of every rank done, the outcome
carries its cause across the ranks (lab.core.why), named from their records and how each ended.

One run is a ``Run``, which holds everything the run is (its plan, transports, launches, ranks'
states, exercises' reports, queue of lines and events) and whose methods start, watch and stop
it. Output is bounded, whatever a rank prints: lab.core.streams reads each stream of each launch
(one reader thread per stream) into the queue, and lab.core.outcome holds what the run is and
was as data.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from lab.core import draw, launchers, workcache
from lab.core.outcome import ExerciseRun, LaunchState, OnLine, RankState, RunOutcome, RunStatus
from lab.core.plan import Launch, Plan
from lab.core.portholder import hold_ports
from lab.core.preflight import EVENTS as PREFLIGHT_EVENTS
from lab.core.preflight import Preflight
from lab.core.stacks import is_stack_line, program_files, where_stopped
from lab.core.streams import QUEUE_MAX, Events, Item, StreamReader, claimed_rank
from lab.core.why import explain_run
from lab.errors import HostsUnreachable, HostUnreachable, LabError, RunError
from lab.rank.inputs import file_of
from lab.rank.protocol import LAUNCHER_EVENTS, RANK_EVENTS, WIRE_EVENT, MalformedEvent, parse_event
from lab.suite.check import Carried
from lab.transport import RankProcess, Transport, code_uploads, for_each_host, release, transport_for
from lab.transport.ssh import SSHSettings

log = logging.getLogger(__name__)

BATCH = 256  # queued items handled between two looks at the processes and the clock
DUMP_MAX = 10_000  # lines of one rank's stack dump kept
DUMP_WAIT = 1.5  # seconds to wait for stack dumps after SIGUSR1, at most
DUMP_SETTLE = 0.3  # seconds with no line of a dump after every live rank's came: the dumps are whole
FLIGHT_WAIT = 3.0  # seconds to wait for hung ranks' flight dumps (each sends one with its quiet progress)
CRASH_GRACE = 5.0  # seconds peers get to report after a rank died
STREAM_GRACE = 1.0  # seconds to wait for the last lines of a process that ended
VIOLATIONS_KEPT = 10  # of one rank's


OnPhase = Callable[[str, str], None]  # (the phase, what it is at: "starting", "starting 4 rank(s): 3 started")


def run_plan(plan: Plan, on_line: OnLine = lambda *_: None, keep: bool = False,
             ssh: SSHSettings | None = None, wall: float | None = None,
             stop: threading.Event | None = None, on_phase: OnPhase = lambda *_: None) -> RunOutcome:
    """Run ``plan`` to the end, a timeout or an interrupt; leave nothing running.

    ``wall``: the longest the whole run may take (a timeout, like a step's). ``stop``: another
    thread's way to interrupt the run (as Ctrl-C does in this one). ``on_phase``: told what the run
    is doing whenever that changes (reaching the hosts, the ports, the preflight, starting the
    ranks, running), so that no command is silent while it works."""
    run = Run(plan, {h.name: transport_for(h, ssh) for h in plan.hosts}, on_line, wall, stop or threading.Event(),
              on_phase)
    status: RunStatus = "completed"
    hung: list[int] = []
    try:
        run.start()
        status, hung = run.watch()
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        run.clean_up(status, keep)
    run.raise_refusal()
    return run.outcome(status, hung)


class Run:
    """One run of a plan, from its start to its outcome: :func:`run_plan` starts it, watches it
    and cleans up after it, whatever happens in between."""

    def __init__(self, plan: Plan, transports: dict[str, Transport], on_line: OnLine, wall: float | None,
                 stop: threading.Event, on_phase: OnPhase = lambda *_: None) -> None:
        self.plan = plan
        self.transports = transports
        self.on_line = on_line
        self.on_phase = on_phase
        self.phase = ("", "")  # the last told
        self.launcher = launchers.find(plan.launcher)
        self.launches = [LaunchState(launch, plan.launcher) for launch in plan.launches]
        self.states = [RankState(spec, next(launch for launch in self.launches if spec.rank in launch.launch.ranks))
                       for spec in plan.ranks]
        self.runs = {name: ExerciseRun(name) for name in plan.exercise_names}
        self.events: Events = queue.Queue(QUEUE_MAX)
        self.dumping = threading.Event()  # set while hung ranks dump their stacks: their stderr goes through whole
        self.stopped = threading.Event()  # set when the run is over: readers stop waiting for room in the queue
        self.stop = stop  # set by another thread to interrupt the run
        self.holder: RankProcess | None = None  # the port holder on rank 0's host
        self.preflight: Preflight | None = None  # the hosts' check of the network, before the ranks start
        self.ports: tuple[int, ...] = ()
        self.started = time.monotonic()
        self.wall = wall
        self.deadline = self.started + wall if wall else None  # when the whole run's time is up
        # The last time something of the run moved (an event that is news, a start-up's CPU seconds
        # grown), and each start-up's CPU seconds so far (rank, or -1 - launch for its launcher's):
        # what the deadline of the lab's own steps counts from (_step_late).
        self.moved_at = self.started
        self.cpu_seen: dict[int, float] = {}

    # -- starting ---------------------------------------------------------------------------

    def start(self) -> None:
        """Carry the run's files to every host, hold its ports, start every launch and read its streams."""
        hosts = len(self.plan.hosts)
        self._tell("reaching", f"reaching {hosts} host(s) and carrying the run's files"
                               + (f" and the project ({len(self.plan.work)} file(s))" if self.plan.work else ""))
        run_dirs = self._prepare_all()
        self.launcher.check_run_dirs(self.plan, run_dirs)
        if self.plan.port_count:
            self._tell("ports", f"holding the rendezvous port(s) on {self.plan.hosts[0].name}")
            self.holder, self.ports = hold_ports(self.transports[self.plan.hosts[0].name], self.plan)
            log.debug("holding port(s) %s on %s", ", ".join(map(str, self.ports)), self.plan.hosts[0].name)
        if self.plan.checks_network:
            self.preflight = Preflight(self.plan, self.ports)
        self._tell("starting", f"starting {len(self.launches)} launcher(s) for {self.plan.world_size} rank(s)")
        self._start_launches(run_dirs)
        self._start_readers()

    def _tell(self, phase: str, text: str) -> None:
        if (phase, text) != self.phase:
            self.phase = (phase, text)
            log.debug("%s", text)
            self.on_phase(phase, text)

    def _tell_progress(self) -> None:
        """What the run is at, from what its hosts and ranks said so far."""
        if self.preflight is not None and not self.preflight.decided:
            self._tell("preflight", f"checking the network from {len(self.plan.hosts)} host(s) (preflight)")
            return
        started = sum(1 for s in self.states if s.info and (self.plan.is_launch or s.step != "startup"))
        if started < len(self.states):
            self._tell("starting", f"starting {len(self.states)} rank(s): {started} started")
            return
        steps = [s.step for s in self.states if not s.done and s.ended_at is None]
        if not steps:
            self._tell("finishing", "finishing: every rank has ended")
            return
        joining = sum(1 for step in steps if step.startswith("init:"))
        if joining:
            self._tell("rendezvous", f"rendezvous: {len(self.states) - joining} of {len(self.states)} rank(s) joined")
            return
        working = [step.removeprefix("wait:") for step in steps]  # (wait:NAME: the lab's barrier after NAME)
        current = max(set(working), key=working.count) if not self.plan.is_launch else ""
        self._tell("running", f"running {current}: {len(steps)} rank(s)" if current and current != "startup"
                   else f"running: {len(steps)} of {len(self.states)} rank(s) at work")

    def _prepare_all(self) -> dict[str, str]:
        """Reach every host at once and carry the run's files there; each host's run directory. A
        group never stops at the first failure: every host is tried, and every one that failed is named."""
        uploads = {**code_uploads(), **{rel: Path(local) for rel, local in self.plan.uploads.items()}}
        work = {relative: Path(local) for relative, local in self.plan.work.items()}

        def prepare(transport: Transport) -> str:
            began = time.monotonic()
            own = {**uploads, **{file_of(rank): inputs[rank]
                                 for rank in self.launcher.inputs_for(self.plan, transport.host.name)}}
            if not work:
                run_dir = transport.prepare(self.plan.run_name, own)
            else:
                run_dir, carried = workcache.carry(transport, self.plan.run_name, own, work, self.plan.work_key)
                log.debug("host %s: the project (%d file(s)) %s", transport.host.name, len(work),
                          "carried there" if carried else "as the host kept it, unchanged")
            log.debug("host %s: %d file(s) carried to %s in %.2fs", transport.host.name, len(own), run_dir,
                      time.monotonic() - began)
            return run_dir

        with draw.staged(self.plan.inputs) as inputs:
            outcomes = for_each_host(self.transports, prepare)
        unreachable = [e for e in outcomes.values() if isinstance(e, HostUnreachable)]
        failed = [(name, e) for name, e in outcomes.items()
                  if isinstance(e, Exception) and not isinstance(e, HostUnreachable)]
        if failed:
            name, error = failed[0]
            if isinstance(error, LabError):
                raise error
            raise RunError(f"host {name}: cannot prepare the run: {error}") from error
        if unreachable:
            raise HostsUnreachable.of(unreachable)
        return {name: str(run_dir) for name, run_dir in outcomes.items()}

    def _start_launches(self, run_dirs: dict[str, str]) -> None:
        """Start every launch at once, each with its host's run directory and the run's ports."""
        def start(launch: LaunchState) -> None:  # recorded at once, so `clean_up` stops it
            host = launch.launch.host
            launch.process = self._start_launch(launch.launch.bound(run_dirs[host], self.ports), self.transports[host])

        with ThreadPoolExecutor(max_workers=min(32, len(self.launches))) as pool:
            for future in [pool.submit(start, launch) for launch in self.launches]:
                future.result()

    def _start_launch(self, launch: Launch, transport: Transport) -> RankProcess:
        try:
            assert transport.run_dir is not None
            return transport.start([transport.python, *launch.args], launch.env, transport.run_dir)
        except OSError as exc:
            raise RunError(f"host {launch.host}: cannot start its ranks ({self.plan.launcher}): {exc}") from exc

    def _start_readers(self) -> None:
        """A reader thread for each stream of each launch; every rank's first step starts now."""
        now = time.monotonic()
        for i, launch in enumerate(self.launches):
            assert launch.process is not None
            for stream_name, stream in (("out", launch.process.stdout), ("err", launch.process.stderr)):
                reader = StreamReader(i, stream_name, launch, self.states, self.events, self.plan.token,
                                      self.dumping, self.stopped)
                threading.Thread(target=reader.pump, args=(stream,), name=f"lab-read-{i}-{stream_name}",
                                 daemon=True).start()
        for state in self.states:
            state.step_started = now

    # -- watching ---------------------------------------------------------------------------

    def watch(self) -> tuple[RunStatus, list[int]]:
        """Consume events until every launch has finished, a rank hangs, one dies, the run's wall
        time is up or it is asked to stop; the status, and the ranks found hung."""
        crashed_at: float | None = None
        while not all(launch.finished for launch in self.launches):
            if self.stop.is_set():
                return "interrupted", []
            for item in self._take(0.2):
                self._handle_item(item)
            self._tell_progress()
            if self.preflight is not None and not self.preflight.decided and self._preflight_failed():
                return "preflight", []
            now = time.monotonic()
            ended = self._settle_ended(now)
            crashed_at = crashed_at or ended
            if crashed_at is None and any(s.died for s in self.states):  # (a host's launcher said one ended)
                crashed_at = now
            if crashed_at is not None and now - crashed_at > CRASH_GRACE:
                return "crashed", []
            late = self._late(now)
            if late:
                self._locate_hangs()
                return "timeout", late
            hung = self._hung(now)
            if hung:
                self._await_flight(hung)
                self._locate_hangs()
                return "hung", hung
        return ("completed" if all(s.done for s in self.states) else "crashed"), []

    def _take(self, wait: float) -> list[Item]:
        """The queued items, up to BATCH of them, waiting up to ``wait`` seconds for the first."""
        try:
            items = [self.events.get(timeout=wait)]
        except queue.Empty:
            return []
        while len(items) < BATCH:
            try:
                items.append(self.events.get_nowait())
            except queue.Empty:
                break
        return items

    def _handle_item(self, item: Item) -> None:
        """Apply one queued item: the end of a stream, an event, a broken one, or a line for ``on_line``."""
        index, kind, whose, line = item
        launch = self.launches[index]
        if kind == "end":
            launch.open_streams -= 1
        elif kind == "event":
            self._on_event(launch, line)
        elif kind == "bad":
            self._violation(whose if isinstance(whose, RankState) else self._first_rank(launch), line)
        elif whose is not None:
            self.on_line(whose, kind, line)

    def _settle_ended(self, now: float) -> float | None:
        """Note the launches that ended, and tell their ranks once their last lines are read; when
        the first of them left a rank unfinished (a crash), if one did."""
        crashed_at: float | None = None
        for launch in self.launches:
            if launch.exit_code is None and launch.process is not None:
                launch.exit_code = launch.process.poll()
                launch.exited_at = now if launch.exit_code is not None else None
            # Its ranks end with it once its last lines are read: they may say how each one ended.
            # (Its readers may be still busy with a flood it printed: the grace runs from their last line.)
            if launch.exited_at is not None and not launch.settled and (
                    launch.open_streams == 0 or now - max(launch.exited_at, launch.active_at) > STREAM_GRACE):
                launch.settled = True
                ended = self._ended(launch, now)
                crashed_at = crashed_at or ended
        return crashed_at

    def _ended(self, launch: LaunchState, now: float) -> float | None:
        """Its ranks ended with it; ``now`` if one of them had not finished (a crash)."""
        mine = [state for state in self.states if state.launch is launch]
        # when it ended: its streams' end, as its readers met it (so the first of several ranks
        # to die is told apart from those that followed it within the same look), else now
        ended = launch.closed_at if launch.open_streams == 0 and launch.closed_at is not None else now
        for state in mine:
            if state.exit_code is None:  # (a host's launcher may have said already how a rank ended)
                state.exit_code, state.step_started, state.ended_at = launch.exit_code, now, ended
            state.done |= self.plan.is_launch and launch.exit_code == 0  # a script says nothing
        return now if any(not state.done for state in mine) else None

    def _late(self, now: float) -> list[int]:
        """The live ranks past a step's timeout or an exercise's deadline; all of them once the
        run's wall time is up."""
        if self.deadline is not None and now > self.deadline:
            return [s.spec.rank for s in self.states if s.exit_code is None]
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
        if self.plan.is_launch or not (state.step == "startup" or state.step.startswith("init:")):
            return now - state.step_started > timeout
        return now - max(state.step_started, self.moved_at) > timeout or state.startup_cpu > timeout

    def _past_deadline(self, state: RankState, now: float) -> bool:
        """Whether the rank is past an exercise's deadline: ``plan.timeout`` seconds from when it
        began the exercise, whatever steps it took since, until it reports on it."""
        return any(now - began > self.plan.timeout and not self.runs[name].reported(state.spec.rank)
                   for name, began in state.entered.items())

    def _hung(self, now: float) -> list[int]:
        """The live ranks, when they hang: every one waits in a torch.distributed call and says that
        nothing moved on its connections, nor did it complete a call, for ``plan.hang_after`` seconds
        (its progress events: two looks of the kernel's counters, on the rank's own clock, not this
        one's, which a busy machine can stall), and every host of theirs has answered since (its
        transport's keepalives). A rank computing outside torch.distributed is no hang: the others wait
        on it (a straggler); neither is a slow collective, whose bytes move."""
        live = [s for s in self.states if s.exit_code is None]
        said = [(s.progress, s.progress_at or now) for s in live]
        if not self.plan.hang_after or not live or any(
                p is None or p["inflight"] is None or p["quiet"] < self.plan.hang_after for p, _ in said):
            return []
        # A host that has not answered since then may have gone silent, not its ranks: that is for
        # its transport to tell (a lost host), not a hang.
        still_since = max(at - float(p["quiet"]) for p, at in said if p is not None)
        hosts = {s.launch.launch.host for s in live}
        return [s.spec.rank for s in live] if all(self.transports[h].heard_since(still_since) for h in hosts) else []

    def _await_flight(self, ranks: list[int]) -> None:
        """Wait (FLIGHT_WAIT at most) until each of ``ranks`` sent a flight dump since its last
        progress event: its records of the call it hangs in."""
        deadline = time.monotonic() + FLIGHT_WAIT
        while time.monotonic() < deadline and any(
                (s := self.states[r]).flight_at is None or (s.progress_at or 0.0) > s.flight_at for r in ranks):
            for item in self._take(0.1):
                self._handle_item(item)

    def _preflight_failed(self) -> bool:
        """Carry the preflight's lines to the hosts' launchers (lab.core.preflight); True when the
        network failed it (the run stops: no rank started)."""
        assert self.preflight is not None
        lines = self.preflight.lines()
        for launch in self.launches:
            if launch.launch.host in lines and launch.process is not None:
                with contextlib.suppress(OSError, EOFError):  # (a launcher that is gone is seen as such)
                    launch.process.send(lines[launch.launch.host])
        return self.preflight.cause is not None

    # -- events -----------------------------------------------------------------------------

    def _on_event(self, launch: LaunchState, line: str) -> None:
        """Check an event line of ``launch``'s stdout and apply it. One that breaks the protocol is not
        applied: it is the failure of the rank that sent it, the one it names (under ``--launcher lab``
        the zygote has made sure of that: ``lab.rank.zygote``)."""
        states, runs = self.states, self.runs
        try:
            event = parse_event(line, self.plan.token)
        except MalformedEvent as exc:
            self._violation(claimed_rank(line[:200], states) or self._first_rank(launch),
                            f"sent a malformed event: {exc}")
            return
        if event is None:
            return
        kind = event["event"]
        if kind == "pulse":  # (a host's launcher, in its preflight: its start-up's CPU seconds)
            self._cpu_seen(-1 - self.launches.index(launch), float(event["cpu"]))
            return
        if kind in PREFLIGHT_EVENTS and self.preflight is not None and not self.preflight.decided:
            self.preflight.take(launch.launch.host, event)
            return
        if kind == WIRE_EVENT and self.plan.wire is not None:  # (only a launcher out of the ranks' reach measures)
            if launch.carried is not None:  # its launcher says it once, as it ends: this one is a forgery
                self._violation(self._first_rank(launch), f"wrote a second word of {launch.launch.host}'s launcher "
                                "on what its connections carried (the launcher says it once)")
                return
            launch.carried = Carried(event["carried"], event["lost"], event.get("error", ""), event.get("failed", ""))
            return
        if kind not in RANK_EVENTS | LAUNCHER_EVENTS:
            self._violation(self._first_rank(launch), f"sent a {kind!r} event, which no rank sends")
            return
        rank: int = event["rank"]
        if not 0 <= rank < len(states):
            self._violation(self._first_rank(launch), f"sent an event as rank {rank}, which the run does not have")
            return
        state = states[rank]
        if kind in ("result", "error"):
            name = event["exercise"]
            if name not in runs:
                self._violation(state, f"reported on {name!r}, which is not an exercise of the run")
                return
            if runs[name].reported(rank):
                self._violation(state, f"reported on {name} twice")
                return
        if kind == "step" and not self._known_step(event["step"]):
            self._violation(state, f"began a step the run does not have: {event['step'][:100]!r}")
            return
        self._handle_event(launch, state, event)

    def _first_rank(self, launch: LaunchState) -> RankState:
        """The rank a broken event of ``launch``'s is the failure of when it names none that the run has."""
        return self.states[launch.launch.ranks[0]]

    def _known_step(self, step: str) -> bool:
        """A worker's step: ``init:<method>``, an exercise's name, or ``wait:<exercise>``."""
        runs = self.runs
        return step in runs or step.removeprefix("wait:") in runs or (step.startswith("init:") and len(step) < 100)

    def _cpu_seen(self, whose: int, cpu: float) -> None:
        """A start-up's CPU seconds (a rank's, or ``-1 - i`` for launch i's launcher): grown, the run moved."""
        if cpu > self.cpu_seen.get(whose, -1.0):
            self.cpu_seen[whose] = cpu
            self.moved_at = time.monotonic()

    def _handle_event(self, launch: LaunchState, state: RankState, event: dict[str, Any]) -> None:
        """Apply a valid event (``lab.rank.protocol.check_event``) of ``state``'s rank."""
        rank, kind = state.spec.rank, event["event"]
        if kind not in ("progress", "flight", "alive") or kind == "progress" and state.progress is not None and \
                event["quiet"] < state.progress["quiet"]:  # (news: not a rank saying it still waits)
            self.moved_at = time.monotonic()
        if kind == "alive":
            state.startup_cpu = float(event["cpu"])
            self._cpu_seen(rank, state.startup_cpu)
        elif kind == "step":
            self._took_step(state, event["step"])
        elif kind == "hello":
            self._said_hello(launch, state, event)
        elif kind == "result":
            run = self.runs[event["exercise"]]
            run.results[rank] = event["value"]
            run.seconds[rank] = float(event["seconds"])
            run.calls[rank] = event.get("calls")
        elif kind == "error":
            self.runs[event["exercise"]].errors[rank] = {k: event[k] for k in ("error", "where", "traceback")}
        elif kind == "fatal":
            state.fatal, state.traceback = event["error"], event["traceback"]
        elif kind == "exit":  # a host's launcher says how this rank ended, before it ends itself
            if state.exit_code is not None:  # (it says so once: a second word is not the launcher's)
                self._violation(state, "was said to have ended a second time (only its launcher says how a rank "
                                "ended, once)")
                return
            state.exit_code, state.ended_at = event["code"], time.monotonic()
            state.done |= self.plan.is_launch and event["code"] == 0  # a script says nothing
        elif kind == "bad":  # the lab's launcher says the rank broke the protocol
            self._violation(state, event["what"])
        elif kind == "done":
            state.done = True
        elif kind == "progress":
            self._progressed(state, event)
        elif kind == "flight":
            state.flight, state.flight_at = event, time.monotonic()
        elif kind == "end":
            state.end = event

    @staticmethod
    def _progressed(state: RankState, event: dict[str, Any]) -> None:
        """A rank's progress event: whether it blocks, and how long nothing moved, is what tells a hang."""
        state.progress, state.progress_at = event, time.monotonic()

    def _took_step(self, state: RankState, step: str) -> None:
        """The rank began ``step``. A step it is in already keeps its clock; so do steps past the
        plan's count of them, and an exercise's deadline runs from when the rank first began it
        (``_past_deadline``)."""
        state.steps += 1
        if step != state.step and state.steps <= self._step_budget():
            state.step, state.step_started = step, time.monotonic()
            if state.step in self.runs:
                state.entered.setdefault(state.step, state.step_started)

    def _said_hello(self, launch: LaunchState, state: RankState, event: dict[str, Any]) -> None:
        """The rank started: note what it says of itself, and where it runs."""
        state.info = event
        host = self.launcher.host_of(self.plan, launch.launch.host, event["hostname"])
        if state.launch is not launch or state.spec.host != host or state.spec.local_rank != event["local_rank"]:
            # torchrun or Slurm placed it elsewhere than planned: it runs where it says it does
            state.launch = launch
            state.spec = replace(state.spec, host=host, local_rank=event["local_rank"])

    def _step_budget(self) -> int:
        """The most step events a worker sends: a rendezvous per stage, an exercise and the barrier after it."""
        return 2 * len(self.plan.stages) + 2 * len(self.plan.exercise_names) + 2

    def _violation(self, state: RankState, what: str) -> None:
        """The rank broke the protocol (``what``: "sent a malformed event: ..."): the exercise it is in
        fails for it (before any, its next one; after the last, the last one)."""
        log.debug("rank %d: %s", state.spec.rank, what)
        if len(state.violations) < VIOLATIONS_KEPT:
            state.violations.append(what)
        runs = self.runs
        if not runs:
            state.fatal = state.fatal or what
            return
        step = state.step.removeprefix("wait:")
        name = step if step in runs else next((n for n, run in runs.items() if not run.reported(state.spec.rank)),
                                              list(runs)[-1])
        runs[name].violations.setdefault(state.spec.rank, what)

    # -- stopping ---------------------------------------------------------------------------

    def _locate_hangs(self) -> None:
        """Ask every live rank for its stacks and note where each one stopped."""
        self.dumping.set()  # from now on the readers pass on every line of stderr, shown or not
        alive = [launch for launch in self.launches if launch.exit_code is None and launch.process is not None]
        for launch in alive:
            launch.process.signal(signal.SIGUSR1)  # type: ignore[union-attr]
        live = [s for s in self.states if s.exit_code is None]
        deadline = time.monotonic() + DUMP_WAIT
        last = time.monotonic()  # when the last line of a dump came
        # Until every live rank's dump came and none went on for DUMP_SETTLE s, or DUMP_WAIT at most
        while time.monotonic() < deadline and not (
                all(s.dump for s in live) and time.monotonic() - last > DUMP_SETTLE):
            for _, kind, whose, line in self._take(0.05):
                if kind == "err" and isinstance(whose, RankState) and len(whose.dump) < DUMP_MAX and is_stack_line(
                        line):  # a rank that floods stderr floods no dump
                    whose.dump.append(line)
                    last = time.monotonic()
        programs = program_files(self.plan)
        for s in self.states:
            if s.exit_code is None:
                s.stopped_at = where_stopped(s.dump, programs)

    def clean_up(self, status: RunStatus, keep: bool) -> None:
        """Leave nothing running: stop the readers waiting, free the ports, kill every launch, cancel
        a Slurm job that did not complete, and release every host's run directory (``keep``: its files)."""
        plan = self.plan
        self.stopped.set()
        if self.holder is not None:
            self.holder.kill()
        self._stop_all()
        if self.launches[0].process is not None:
            self.launcher.clean_up(plan, self.transports[plan.hosts[0].name], status == "completed")
        also = [plan.shared_run_dir] if plan.shared_run_dir else []
        for_each_host(self.transports, lambda t: release(t, keep, also))

    def _stop_all(self) -> None:
        """Kill every launch's process group, on all hosts at once: one command per host for all its
        groups (``Transport.kill_all``: a session per rank would pass sshd's MaxSessions)."""
        started = [launch for launch in self.launches if launch.process is not None]
        by_host: dict[str, tuple[Transport, list[RankProcess]]] = {}
        for launch in started:
            assert launch.process is not None
            by_host.setdefault(launch.launch.host, (self.transports[launch.launch.host], []))[1].append(launch.process)
        for_each_host(by_host, lambda host: host[0].kill_all(host[1]))
        for launch in started:
            if launch.exit_code is None:
                launch.exit_code = launch.process.poll()  # type: ignore[union-attr]
        for state in self.states:
            if state.exit_code is None:
                state.exit_code = state.launch.exit_code

    # -- after ------------------------------------------------------------------------------

    def raise_refusal(self) -> None:
        """When no rank ever started: raise the refusal the first launch printed (``srun``'s), if it printed one."""
        if not any(s.info for s in self.states):
            refused = self.launcher.refusal(self.plan, self.launches[0].output.tail())
            if refused is not None:
                raise refused

    def outcome(self, status: RunStatus, hung: list[int]) -> RunOutcome:
        """What came of the run, which ended with ``status`` (``hung``: the ranks found hung)."""
        wall = self.wall
        walled = wall if status == "timeout" and wall and time.monotonic() - self.started >= wall else None
        outcome = RunOutcome(self.plan, self.states, self.runs, status, time.monotonic() - self.started, hung,
                             self.ports, walled)
        outcome.cause = self.preflight.cause if status == "preflight" and self.preflight else explain_run(outcome)
        return outcome
