"""Run a plan: start its launches through each host's transport, stream, collect, stop.

The runner never prints: each output line goes to an ``on_line`` callback and the
outcome comes back as data. It guarantees that when :func:`run_plan` returns or
raises (a failure, a timeout, Ctrl-C), no rank process is left on any host.

Before the ranks start, every host gets the run's directory and files (``Transport.prepare``)
and rank 0's host a port holder (``lab.rank.ports``) that chooses the run's rendezvous ports
there and holds them until the run ends; each launch then starts with the plan's macros
(``${run_dir}``, ``${portN}``) filled in for its host.

A launch is one process: a rank, or a host's launcher that carries several (torchrun,
mp.spawn). Their ranks tag their lines (lab.rank.output) and every event names its rank,
so each line reaches the right rank; torchrun numbers the ranks itself, so a rank's host
is the one whose launch its hello event came through.

A watchdog gives every step a rank takes (start-up, rendezvous, one exercise) at most
``plan.timeout`` seconds. A rank past it is hung: the runner asks every live rank for
its Python stacks (SIGUSR1, see lab.rank.worker), notes where each one stopped, and kills
them all.
"""
from __future__ import annotations

import logging
import queue
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Literal

from lab.core.plan import Launch, Plan, RankSpec, bind_macros
from lab.errors import HostsUnreachable, HostUnreachable, LabError, RunError
from lab.rank.protocol import MalformedEvent, parse_event, untag
from lab.transport import (
    PACKAGE_DIR,
    RankProcess,
    Transport,
    code_uploads,
    for_each_host,
    release,
    transport_for,
)
from lab.transport.ssh import SSHSettings

log = logging.getLogger(__name__)

TAIL_LINES = 200
DUMP_WAIT = 1.5  # seconds to wait for stack dumps after SIGUSR1
CRASH_GRACE = 5.0  # seconds peers get to report after a rank died
STREAM_GRACE = 1.0  # seconds to wait for the last lines of a process that ended
PORTS_WAIT = 30.0  # seconds for rank 0's host to report the ports it holds


@dataclass
class LaunchState:
    """One started process: a rank, or a host's launcher and the ranks it started."""

    launch: Launch
    launcher: str
    process: RankProcess | None = None
    exit_code: int | None = None
    exited_at: float | None = None
    settled: bool = False  # its ranks were told it ended (once its last lines were read)
    open_streams: int = 2

    @property
    def label(self) -> str:
        return f"{self.launch.host} {self.launcher}"

    @property
    def color(self) -> int:
        return self.launch.ranks[0] if self.launch.ranks else 0

    @property
    def carries_one_rank(self) -> bool:
        return self.launcher == "lab"

    @property
    def finished(self) -> bool:
        return self.open_streams == 0 and self.exit_code is not None


@dataclass
class RankState:
    """What the controller knows about one rank while and after it runs."""

    spec: RankSpec
    launch: LaunchState
    step: str = "startup"
    step_started: float = field(default_factory=time.monotonic)
    done: bool = False  # the worker said it finished
    exit_code: int | None = None  # its launch's, once that ended
    fatal: str | None = None  # start-up or rendezvous failed outside any exercise
    info: dict[str, Any] = field(default_factory=dict)  # hostname, pid, torch version
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    dump: list[str] = field(default_factory=list)  # stack dump after SIGUSR1
    stopped_at: str | None = None  # where a hung rank was stopped
    ended_at: float | None = None  # when it was seen to end by itself (not killed by the lab)

    @property
    def label(self) -> str:
        return f"{self.spec.host} r{self.spec.rank}"

    @property
    def color(self) -> int:
        return self.spec.rank

    @property
    def died(self) -> bool:
        """It ended by itself before saying it was done: a crash, or its host went away."""
        return self.ended_at is not None and not self.done and self.exit_code != 0


@dataclass
class ExerciseRun:
    """Every rank's report for one exercise."""

    name: str
    results: dict[int, Any] = field(default_factory=dict)
    errors: dict[int, dict[str, str]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)


@dataclass
class RunOutcome:
    plan: Plan
    ranks: list[RankState]
    exercises: dict[str, ExerciseRun]
    status: RunStatus
    seconds: float
    hung: list[int] = field(default_factory=list)  # ranks found past the timeout
    ports: tuple[int, ...] = ()  # the ports held on rank 0's host (``${port0}``...)

    @property
    def master_port(self) -> int | None:
        """The port rank 0's store (or torchrun's rendezvous) listened on."""
        return int(bind_macros(self.plan.master_port, "", self.ports)) if self.plan.master_port and self.ports else None


RunStatus = Literal["completed", "timeout", "interrupted", "crashed"]
OnLine = Callable[["RankState | LaunchState", str, str], None]  # (whose line, "out" | "err", line)
Events = queue.Queue[tuple[int, str, "str | None"]]  # (launch index, stream, line or None at its end)


def run_plan(plan: Plan, on_line: OnLine = lambda *_: None, keep: bool = False,
             ssh: SSHSettings | None = None) -> RunOutcome:
    """Run ``plan`` to the end, a timeout or an interrupt; leave nothing running."""
    transports: dict[str, Transport] = {h.name: transport_for(h, ssh) for h in plan.hosts}
    launches = [LaunchState(launch, plan.launcher) for launch in plan.launches()]
    states = [RankState(spec, next(launch for launch in launches if spec.rank in launch.launch.ranks))
              for spec in plan.ranks]
    runs = {name: ExerciseRun(name) for name in plan.exercise_names}
    events: Events = queue.Queue()
    started = time.monotonic()
    status: RunStatus = "completed"
    hung: list[int] = []
    holder: RankProcess | None = None
    ports: tuple[int, ...] = ()
    try:
        run_dirs = _prepare_all(plan, transports)
        if plan.port_count:
            holder, ports = _hold_ports(plan, transports[plan.hosts[0].name])

        def start(launch: LaunchState) -> None:  # recorded at once, so `finally` stops it
            host = launch.launch.host
            launch.process = _start(plan, launch.launch.bound(run_dirs[host], ports), transports[host])

        with ThreadPoolExecutor(max_workers=min(32, len(launches))) as pool:
            for future in [pool.submit(start, launch) for launch in launches]:
                future.result()
        now = time.monotonic()
        for i, launch in enumerate(launches):
            assert launch.process is not None
            for stream_name, stream in (("out", launch.process.stdout), ("err", launch.process.stderr)):
                threading.Thread(target=_pump, args=(stream, i, stream_name, events),
                                 name=f"lab-read-{i}-{stream_name}", daemon=True).start()
        for state in states:
            state.step_started = now
        status, hung = _watch(plan, launches, states, runs, events, on_line)
    except KeyboardInterrupt:
        status = "interrupted"
    finally:
        if holder is not None:
            holder.kill()
        _stop_all(launches, states)
        also = [plan.shared_run_dir] if plan.shared_run_dir else []
        for_each_host(transports, lambda t: release(t, keep, also))
    return RunOutcome(plan, states, runs, status, time.monotonic() - started, hung, ports)


def _prepare_all(plan: Plan, transports: dict[str, Transport]) -> dict[str, str]:
    """Reach every host at once and carry the run's files there; each host's run directory. A
    group never stops at the first failure: every host is tried, and every one that failed is named."""
    uploads = {**code_uploads(), **{rel: Path(local) for rel, local in plan.uploads.items()}}
    outcomes = for_each_host(transports, lambda t: t.prepare(plan.run_name, uploads))
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


def _hold_ports(plan: Plan, transport: Transport) -> tuple[RankProcess, tuple[int, ...]]:
    """Start the port holder on rank 0's host: the process (kill it to free the ports) and the
    ports it holds for the run."""
    assert transport.run_dir is not None
    env = {"PYTHONPATH": f"{transport.run_dir}/code", "LAB_TOKEN": plan.token, "PYTHONUNBUFFERED": "1"}
    try:
        holder = transport.start([*transport.module_argv("lab.rank.ports"), str(plan.port_count)], env,
                                 transport.run_dir)
    except OSError as exc:
        raise RunError(f"host {transport.host.name}: cannot start the port holder: {exc}") from exc
    try:
        ports = _ports_in(_first_event(holder, plan.token, PORTS_WAIT))
    except BaseException:
        holder.kill()
        raise
    if len(ports) != plan.port_count:
        ended = holder.poll() is not None
        error = holder.stderr.read().decode("utf-8", "replace").strip().splitlines() if ended else []
        holder.kill()
        raise RunError(f"host {transport.host.name}: could not hold {plan.port_count} free port(s) for the "
                       f"rendezvous: {error[-1] if error else f'no answer within {PORTS_WAIT:g}s'}")
    return holder, ports


def _ports_in(event: dict[str, Any] | None) -> tuple[int, ...]:
    """The ports a ``ports`` event names; none when it is not one, or not a list of ports."""
    ports = event.get("ports") if event and event.get("event") == "ports" else None
    if not isinstance(ports, list) or not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
        return ()
    return tuple(ports)


def _first_event(process: RankProcess, token: str, timeout: float) -> dict[str, Any] | None:
    """The first event on ``process``'s stdout within ``timeout`` seconds (None: none came)."""
    found: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        try:
            for raw in iter(process.stdout.readline, b""):
                event = parse_event(raw.decode("utf-8", "replace").rstrip("\r\n"), token)
                if event is not None:
                    found.put(event)
                    return
        except (OSError, ValueError):
            pass
        found.put(None)

    threading.Thread(target=read, name="lab-read-ports", daemon=True).start()
    try:
        return found.get(timeout=timeout)
    except queue.Empty:
        return None


def _start(plan: Plan, launch: Launch, transport: Transport) -> RankProcess:
    try:
        assert transport.run_dir is not None
        return transport.start([transport.python, *launch.args], launch.env, transport.run_dir)
    except OSError as exc:
        what = f"rank {launch.ranks[0]}" if plan.launcher == "lab" else plan.launcher
        raise RunError(f"host {launch.host}: cannot start {what}: {exc}") from exc


def _pump(stream: IO[bytes], index: int, name: str, events: Events) -> None:
    """Forward a stream's lines to the event queue; ``None`` marks its end."""
    try:
        for raw in iter(stream.readline, b""):
            events.put((index, name, raw.decode("utf-8", "replace").rstrip("\r\n")))
    except (OSError, ValueError):
        pass
    finally:
        events.put((index, name, None))


def _watch(plan: Plan, launches: list[LaunchState], states: list[RankState], runs: dict[str, ExerciseRun],
           events: Events, on_line: OnLine) -> tuple[RunStatus, list[int]]:
    """Consume events until every launch has finished, a rank hangs, or one dies."""
    crashed_at: float | None = None
    while not all(launch.finished for launch in launches):
        try:
            index, stream, line = events.get(timeout=0.2)
        except queue.Empty:
            pass
        else:
            launch = launches[index]
            if line is None:
                launch.open_streams -= 1
            elif stream == "out" and (event := _event(launch, line, plan.token)) is not None:
                _handle_event(launch, states, runs, event)
            else:
                whose, text = _whose_line(launch, states, line)
                if isinstance(whose, RankState):  # a launcher's own lines (torchrun's) only stream
                    whose.tail.append(text)
                on_line(whose, stream, text)
        now = time.monotonic()
        for launch in launches:
            if launch.exit_code is None and launch.process is not None:
                launch.exit_code = launch.process.poll()
                launch.exited_at = now if launch.exit_code is not None else None
            # Its ranks end with it once its last lines are read: they may say how each one ended.
            if launch.exited_at is not None and not launch.settled and (
                    launch.open_streams == 0 or now - launch.exited_at > STREAM_GRACE):
                launch.settled = True
                crashed_at = _ended(plan, launch, states, now) or crashed_at
        if crashed_at is not None and now - crashed_at > CRASH_GRACE:
            return "crashed", []
        late = [s.spec.rank for s in states if s.exit_code is None and now - s.step_started > plan.timeout]
        if late:
            _locate_hangs(plan, launches, states, events)
            return "timeout", late
    return ("completed" if all(s.done for s in states) else "crashed"), []


def _ended(plan: Plan, launch: LaunchState, states: list[RankState], now: float) -> float | None:
    """Its ranks ended with it; ``now`` if one of them had not finished (a crash)."""
    mine = [state for state in states if state.launch is launch]
    for state in mine:
        if state.exit_code is None:  # (a host's launcher may have said already how a rank ended)
            state.exit_code, state.step_started, state.ended_at = launch.exit_code, now, now
        state.done |= bool(plan.script) and launch.exit_code == 0  # a script says nothing
    return now if any(not state.done for state in mine) else None


def _whose_line(launch: LaunchState, states: list[RankState], line: str) -> tuple[RankState | LaunchState, str]:
    """The rank a line is from (its tag, or the launch's only rank), else the launch's own."""
    if launch.carries_one_rank:
        return states[launch.launch.ranks[0]], line
    rank, text = untag(line)
    return (states[rank], text) if rank is not None and 0 <= rank < len(states) else (launch, line)


def _event(launch: LaunchState, line: str, token: str) -> dict[str, Any] | None:
    """The event a line of ``launch``'s stdout carries, if any (a malformed one is logged, not shown)."""
    try:
        return parse_event(line, token)
    except MalformedEvent as exc:
        log.debug("%s: unreadable event %r: %s", launch.label, line, exc)
        return {}


def _handle_event(launch: LaunchState, states: list[RankState], runs: dict[str, ExerciseRun],
                  event: dict[str, Any]) -> None:
    try:
        rank = int(event.get("rank", launch.launch.ranks[0]))
    except (TypeError, ValueError):
        log.debug("%s: unreadable event %r", launch.label, event)
        return
    if not 0 <= rank < len(states):
        rank = launch.launch.ranks[0]
    state, kind = states[rank], event.get("event")
    if kind == "step":
        state.step, state.step_started = event["step"], time.monotonic()
    elif kind == "hello":
        state.info = event
        if state.launch is not launch or state.spec.local_rank != event.get("local_rank", state.spec.local_rank):
            # torchrun placed it elsewhere than planned: it runs where its hello came from
            state.launch = launch
            state.spec = replace(state.spec, host=launch.launch.host,
                                 local_rank=int(event.get("local_rank", state.spec.local_rank)))
    elif kind == "result":
        run = runs[event["exercise"]]
        run.results[rank] = event.get("value")
        run.seconds[rank] = float(event.get("seconds", 0.0))
    elif kind == "error":
        runs[event["exercise"]].errors[rank] = {k: str(event.get(k, "")) for k in ("error", "where", "traceback")}
    elif kind == "fatal":
        state.fatal = event.get("error", "")
    elif kind == "exit":  # a host's launcher says how this rank ended, before it ends itself
        state.exit_code, state.ended_at = int(event.get("code", 1)), time.monotonic()
    elif kind == "done":
        state.done = True


def _locate_hangs(plan: Plan, launches: list[LaunchState], states: list[RankState], events: Events) -> None:
    """Ask every live rank for its stacks and note where each one stopped."""
    alive = [launch for launch in launches if launch.exit_code is None and launch.process is not None]
    for launch in alive:
        launch.process.signal(signal.SIGUSR1)  # type: ignore[union-attr]
    deadline = time.monotonic() + DUMP_WAIT
    while time.monotonic() < deadline:
        try:
            index, stream, line = events.get(timeout=0.1)
        except queue.Empty:
            continue
        if line is not None and stream == "err":
            whose, text = _whose_line(launches[index], states, line)
            if isinstance(whose, RankState):
                whose.dump.append(text)
    programs = _program_files(plan)
    for s in states:
        if s.exit_code is None:
            s.stopped_at = where_stopped(s.dump, programs)


_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def where_stopped(dump: list[str], programs: dict[str, Path]) -> str | None:
    """Where a faulthandler dump shows the rank: the innermost frame inside an exercise
    program, as ``file.py:LINE in FUNC: source``; else the innermost frame of the thread
    that runs the exercises (the one with lab/rank/worker.py frames), e.g. inside torch."""
    threads: list[list[re.Match[str]]] = [[]]
    for text in dump:
        if text.startswith(("Thread 0x", "Current thread 0x")):
            threads.append([])
        elif m := _FRAME.match(text):
            threads[-1].append(m)
    frames = [f for t in threads for f in t]
    mine = [m for m in frames if Path(m["path"]).name in programs]
    main = next((t for t in threads if any(f["path"].endswith("lab/rank/worker.py") and f["func"] != "watch"
                                           for f in t)), None)
    candidates = mine or main or frames
    if not candidates:
        return None
    frame = candidates[0]
    name, line = Path(frame["path"]).name, int(frame["line"])
    source = ""
    local = programs.get(name)
    if local is not None and local.exists():
        lines = local.read_text(encoding="utf-8", errors="replace").splitlines()
        source = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f"{name}:{line} in {frame['func']}" + (f": {source}" if source else "")


def _program_files(plan: Plan) -> dict[str, Path]:
    """File name -> local path of every program the plan runs."""
    files = {Path(local).name: Path(local) for local in plan.uploads.values()}
    for stage in plan.stages:
        for exercise in stage.exercises:
            program = exercise["program"]
            if not program.endswith(".py"):
                path = PACKAGE_DIR.joinpath(*program.split(".")[1:]).with_suffix(".py")
                files[path.name] = path
    return files


def _stop_all(launches: list[LaunchState], states: list[RankState]) -> None:
    """Kill every launch's process group, on all hosts at once."""
    started = [launch for launch in launches if launch.process is not None]
    for_each_host({f"{launch.label} {i}": launch for i, launch in enumerate(started)},
                  lambda launch: launch.process.kill())  # type: ignore[union-attr]
    for launch in started:
        if launch.exit_code is None:
            launch.exit_code = launch.process.poll()  # type: ignore[union-attr]
    for state in states:
        if state.exit_code is None:
            state.exit_code = state.launch.exit_code
