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

What the run is, from the events its ranks send, and the rules that say it is late or hung are
the ledger's (lab.core.ledger), which the runner feeds and acts on. A rank past its step's timeout
or an exercise's deadline is hung: the runner asks every live rank for its Python stacks (SIGUSR1,
see lab.rank.worker), notes where each one stopped (lab.core.stacks), and kills them all.

A hang is found long before that. Every rank's flight recorder (lab.rank.flight) says, once a second
when it changed or while a call blocks, how many torch.distributed calls it completed, which one it
blocks in, and for how long nothing moved on its connections (``progress``: the kernel's counters,
looked at on the rank's own clock), and sends its records when a call has blocked 2 s (``flight``).
Once every live rank blocks in a call and says nothing moved for ``Options.hang_after`` seconds, the
ranks hang (a slow collective, whose bytes move, never does): the runner waits briefly for their
records, locates them as above and stops them. A rank computing outside torch.distributed is no
hang, whatever the others wait for. Whatever way the run ends short of every rank done, the outcome
carries its cause across the ranks (lab.core.why), named from their records and how each ended.

One run is a ``Run``, which holds its plan, transports, ledger and queue of lines and events,
and whose methods prepare, start, read and stop it. Output is bounded, whatever a rank prints:
lab.core.streams reads each stream of each launch (one reader thread per stream) into the queue,
and lab.core.outcome holds what the run is and was as data.
"""
from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab.core import bringback, hostenv, workcache
from lab.core.bringback import BroughtBack
from lab.core.ledger import Ledger
from lab.core.outcome import LaunchState, OnLine, RankState, RunOutcome, RunStatus
from lab.core.plan import Launch, Plan
from lab.core.portholder import hold_ports
from lab.core.preflight import Preflight
from lab.core.stacks import program_files
from lab.core.streams import QUEUE_MAX, Events, Item, StreamReader
from lab.core.why import explain_run
from lab.errors import HostsUnreachable, HostUnreachable, LabError, RunError
from lab.rank.inputs import file_of
from lab.rank.stdin import STDIN_VAR, frame
from lab.rank.text import exception_line
from lab.transport.base import RankProcess, Transport, Upload, code_uploads, for_each_host, release
from lab.transport.reach import transport_for
from lab.transport.ssh.settings import SSHSettings

log = logging.getLogger(__name__)

BATCH = 256  # queued items handled between two looks at the processes and the clock
DUMP_WAIT = 5.0  # seconds to wait for stack dumps after SIGUSR1, at most (it ends when every live rank's came)
DUMP_SETTLE = 0.3  # seconds with no line of a dump after every live rank's came: the dumps are whole
FLIGHT_WAIT = 3.0  # seconds to wait for hung ranks' flight dumps (each sends one with its quiet progress)
CRASH_GRACE = 5.0  # seconds peers get to report after a rank died
VIOLATIONS_KEPT = 10  # of one rank's


OnPhase = Callable[[str, str], None]  # (the phase, what it is at: "starting", "starting 4 rank(s): 3 started")


def run_plan(plan: Plan, on_line: OnLine = lambda *_: None, keep: bool = False,
             ssh: SSHSettings | None = None, wall: float | None = None,
             stop: threading.Event | None = None, on_phase: OnPhase = lambda *_: None,
             stdin: int | None = None, on_note: Callable[[str], None] = lambda _: None) -> RunOutcome:
    """Run ``plan`` to the end, a timeout or an interrupt; leave nothing running.

    ``wall``: the longest the whole run may take (a timeout, like a step's). ``stop``: another
    thread's way to interrupt the run (as Ctrl-C does in this one). ``on_phase``: told what the run
    is doing whenever that changes (reaching the hosts, the ports, the preflight, starting the
    ranks, running), so that no command is silent while it works. ``stdin``: a descriptor whose
    bytes go to rank 0's stdin (every rank's, where the plan says so), where the launcher passes
    it one (lab.rank.stdin). ``on_note``: told
    each line the run says as it goes (a checkpoint brought back as it was saved: --sync-back)."""
    run = Run(plan, {h.name: transport_for(h, ssh) for h in plan.hosts}, on_line, wall, stop or threading.Event(),
              on_phase)
    run.stdin, run.on_note = stdin, on_note
    status: RunStatus = "completed"
    hung: list[int] = []
    try:
        run.start()
        status, hung = run.watch()
    except KeyboardInterrupt:
        status = "interrupted"
        with contextlib.suppress(KeyboardInterrupt):  # (where each rank was; a second Ctrl-C cuts it short)
            run.locate_ranks()
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
        self.started = time.monotonic()
        self.began_at = time.time()  # (a file of the project changed after this is the user's: never overwritten)
        self.brought: BroughtBack | None = None  # what the ranks wrote that came back into the project
        self.hang_found: float | None = None  # when the hang finder found the ranks hung
        self.ledger = Ledger(plan, self.started)  # what the run's launches, ranks and exercises are, and its rules
        self.launcher, self.launches = self.ledger.launcher, self.ledger.launches
        self.processes: list[RankProcess | None] = [None] * len(self.launches)  # each launch's, once started
        self.states, self.runs = self.ledger.states, self.ledger.runs
        self.events: Events = queue.Queue(QUEUE_MAX)
        self.dumping = threading.Event()  # set while hung ranks dump their stacks: their stderr goes through whole
        self.stopped = threading.Event()  # set when the run is over: readers stop waiting for room in the queue
        self.stop = stop  # set by another thread to interrupt the run
        self.holder: RankProcess | None = None  # the port holder on rank 0's host
        self.ports: tuple[int, ...] = ()
        self.wall = wall
        self.deadline = self.started + wall if wall else None  # when the whole run's time is up
        self.stdin: int | None = None  # what goes to rank 0's stdin (or every rank's), where their launches take it
        self.on_note: Callable[[str], None] = lambda _: None
        self.synced: bringback.Synced = {}  # what --sync-back put in the project while the job ran
        self.syncing: threading.Thread | None = None  # the one sync at work, if any

    # -- starting ---------------------------------------------------------------------------

    def start(self) -> None:
        """Carry the run's files to every host, hold its ports, start every launch and read its streams."""
        hosts = len(self.plan.hosts)
        self._tell("reaching", f"reaching {hosts} host(s) and carrying the run's files"
                               + (f" and the project ({len(self.plan.work)} file(s))" if self.plan.work else "")
                               + (", with the environment of its requirements" if self.plan.requirements else ""))
        installed: list[str] = []  # the hosts that had no environment of their requirements: installed now
        run_dirs = self._prepare_all(installed)
        if installed:
            self._tell("installed", f"installed the requirements on {', '.join(sorted(installed))}: kept there for "
                                    "the next launches")
        self.launcher.check_run_dirs(self.plan, run_dirs)
        if self.plan.port_count:
            self._tell("ports", f"holding the rendezvous port(s) on {self.plan.hosts[0].name}")
            self.holder, self.ports = hold_ports(self.transports[self.plan.hosts[0].name], self.plan)
            log.debug("holding port(s) %s on %s", ", ".join(map(str, self.ports)), self.plan.hosts[0].name)
        if self.plan.checks_network:
            self.ledger.preflight = Preflight(self.plan, self.ports)
        self._tell("starting", f"starting {len(self.launches)} launcher(s) for {self.plan.world_size} rank(s)")
        self._start_launches(run_dirs)
        self._start_readers()
        if not any(STDIN_VAR in launch.launch.env for launch in self.launches):  # (no launch passes it on)
            self.stdin = None

    def _stdin_once_ranks_run(self) -> None:
        """Once a rank of each launch that passes it on said hello (its launcher's start-up, which reads
        the same stdin for the preflight, has ended), what comes on ``stdin`` goes to those launches."""
        taking = [(launch, p) for launch, p in zip(self.launches, self.processes) if STDIN_VAR in launch.launch.env]
        if self.stdin is not None and all(p is not None and any(self.states[r].info is not None
                                                                 for r in launch.launch.ranks)
                                          for launch, p in taking):
            threading.Thread(target=self._pass_stdin, args=(self.stdin, [p for _, p in taking if p is not None]),
                             name="lab-stdin", daemon=True).start()
            self.stdin = None

    def _pass_stdin(self, fd: int, processes: list[RankProcess]) -> None:
        """What comes on ``fd`` to the launches that take it, in frames (lab.rank.stdin), until it ends
        (the end said) or the run does. A terminal is read only while this process is in its foreground,
        as a shell's job reads it."""
        while not self.stopped.is_set():
            try:
                if not select.select([fd], [], [], 0.5)[0]:
                    continue
                if os.isatty(fd) and os.tcgetpgrp(fd) != os.getpgrp():
                    time.sleep(0.5)
                    continue
                data = os.read(fd, 1 << 16)
                for process in processes:
                    process.send(frame(data))
            except OSError:
                return
            if not data:
                return

    def _tell(self, phase: str, text: str) -> None:
        """Tell ``on_phase`` what the run is doing, when that changed."""
        if (phase, text) != self.phase:
            self.phase = (phase, text)
            log.debug("%s", text)
            self.on_phase(phase, text)

    def _prepare_all(self, installed: list[str]) -> dict[str, str]:
        """Reach every host at once and carry the run's files there, and its requirements' environment
        (the hosts that had to install it go in ``installed``); each host's run directory. A group
        never stops at the first failure: every host is tried, and every one that failed is named."""
        uploads: dict[str, Upload] = {**code_uploads(),
                                      **{rel: Path(local) for rel, local in self.plan.uploads.items()}}
        work = {relative: Path(local) for relative, local in self.plan.work.items()}

        def prepare(transport: Transport) -> str:
            began = time.monotonic()
            own = {**uploads, **{file_of(rank): self.plan.inputs[rank]
                                 for rank in self.launcher.inputs_for(self.plan, transport.host.name)}}
            if self.plan.in_place and not transport.host.is_local:  # (the project in the folder the hosts share)
                script = Path(self.plan.script[0]) if self.plan.script and not self.plan.module else None
                workcache.check_shared(transport, self.plan.in_place, script or Path(self.plan.in_place))
            if not self.plan.work_key:  # (no project: an empty one is still carried, and what it gets comes back)
                run_dir = transport.prepare(self.plan.run_name, own)
            else:
                run_dir, carried = workcache.carry(transport, self.plan.run_name, own, work, self.plan.work_key)
                log.debug("host %s: the project (%d file(s)) %s", transport.host.name, len(work),
                          "carried there" if carried else "as the host kept it, unchanged")
            needs = self.plan.requirements.get(transport.host.name)
            if needs is not None and hostenv.ensure(transport, self.plan.run_name, run_dir, needs):
                installed.append(transport.host.name)
            log.debug("host %s: %d file(s) carried to %s in %.2fs", transport.host.name, len(own), run_dir,
                      time.monotonic() - began)
            return run_dir

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
        def start(i: int, launch: LaunchState) -> None:  # recorded at once, so `clean_up` stops it
            host = launch.launch.host
            self.processes[i] = self._start_launch(launch.launch.bound(run_dirs[host], self.ports),
                                                   self.transports[host])

        with ThreadPoolExecutor(max_workers=min(32, len(self.launches))) as pool:
            for future in [pool.submit(start, i, launch) for i, launch in enumerate(self.launches)]:
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
        for i, (launch, process) in enumerate(zip(self.launches, self.processes)):
            assert process is not None
            for stream_name, stream in (("out", process.stdout), ("err", process.stderr)):
                reader = StreamReader(i, stream_name, launch, self.states, self.events, self.plan.token,
                                      self.dumping, self.stopped, self.plan.options.cells_mark)
                threading.Thread(target=reader.pump, args=(stream,), name=f"lab-read-{i}-{stream_name}",
                                 daemon=True).start()
        self.ledger.begin(now)

    # -- watching ---------------------------------------------------------------------------

    def watch(self) -> tuple[RunStatus, list[int]]:
        """Consume events until every launch has finished, a rank hangs, one dies, the run's wall
        time is up or it is asked to stop; the status, and the ranks found hung."""
        crashed_at: float | None = None
        while not all(launch.finished for launch in self.launches):
            if self.stop.is_set():
                self.locate_ranks()  # (where each rank was: in a call, or in its own code)
                return "interrupted", []
            for item in self._take(0.2):
                self._handle_item(item)
            if self.ledger.saved:
                self._sync_saved()
            self._tell(*self.ledger.phase())
            preflight = self.ledger.preflight
            if preflight is not None and not preflight.decided and self._preflight_failed():
                return "preflight", []
            now = time.monotonic()
            ended = self._settle_ended(now)
            crashed_at = crashed_at or ended
            if crashed_at is None and any(s.died for s in self.states):  # (a host's launcher said one ended)
                crashed_at = now
            if crashed_at is not None and (now - crashed_at > CRASH_GRACE or self.ledger.crash_told(now)):
                if any(state.exit_code is None for state in self.states):
                    self.locate_ranks()  # (where the ranks still running are: one may be why the others failed)
                return "crashed", []
            late = self._late(now)
            if late:
                self.locate_ranks()
                return "timeout", late
            hung = self.ledger.hung(now, lambda host, since: self.transports[host].heard_since(since))
            if hung:
                self.hang_found = now
                self._await_flight(hung)
                self.locate_ranks()
                return "hung", hung
        return ("completed" if all(s.done for s in self.states) else "crashed"), []

    def _sync_saved(self) -> None:
        """What rank 0's host's ranks said they saved, brought back by a thread of its own while the job
        goes on, where the launch asked (--sync-back): one sync at a time, the next taking what was
        said meanwhile; what other hosts' ranks saved comes back at the end."""
        plan = self.plan
        if not plan.work_key or not plan.options.sync_back or not plan.options.bring_back_max:
            self.ledger.saved.clear()
            return
        if self.syncing is not None and self.syncing.is_alive():
            return
        lead = self.states[0].spec.host
        saved = {path: size for host, path, size in self.ledger.saved if host == lead}  # (the last said of each)
        self.ledger.saved.clear()
        if not saved:
            return

        def sync() -> None:
            try:
                lines = bringback.sync(self.transports[lead], Path(plan.work_root), saved, plan.options.sync_back,
                                       self.began_at, plan.options.bring_back_max, self.synced)
            except Exception as exc:  # (the end's bring-back tries again; nothing is lost)
                log.debug("syncing what rank 0's host saved", exc_info=True)
                lines = [f"not brought back as it was saved: {exception_line(exc)}; it comes back at the end"]
            for line in lines:
                self.on_note(line)

        self.syncing = threading.Thread(target=sync, name="lab-sync", daemon=True)
        self.syncing.start()

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
            self.ledger.stream_ended(launch)
        elif kind == "event":
            self.ledger.apply(launch, line, time.monotonic())
            if self.stdin is not None:
                self._stdin_once_ranks_run()
        elif kind == "bad":
            self.ledger.violation(whose if isinstance(whose, RankState) else self.ledger.first_rank(launch), line)
        elif whose is not None:
            self.on_line(whose, kind, line)

    def _settle_ended(self, now: float) -> float | None:
        """Note the launches that ended, and tell their ranks once their last lines are read; when
        the first of them left a rank unfinished (a crash), if one did."""
        for launch, process in zip(self.launches, self.processes):
            if launch.exit_code is None and process is not None:
                self.ledger.exited(launch, process.poll(), now)
        return self.ledger.settle(now)

    def _late(self, now: float) -> list[int]:
        """The live ranks past a step's timeout or an exercise's deadline (the ledger's rules); all of
        them once the run's wall time is up."""
        if self.deadline is not None and now > self.deadline:
            return [s.spec.rank for s in self.states if s.exit_code is None]
        return self.ledger.late(now)

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
        preflight = self.ledger.preflight
        assert preflight is not None
        lines = preflight.lines()
        for launch, process in zip(self.launches, self.processes):
            if launch.launch.host in lines and process is not None:
                with contextlib.suppress(OSError, EOFError):  # (a launcher that is gone is seen as such)
                    process.send(lines[launch.launch.host])
        return preflight.cause is not None

    # -- stopping ---------------------------------------------------------------------------

    def locate_ranks(self) -> None:
        """Ask every live rank for its stacks and note where each one stopped (a hang, the timeout, the
        ranks still running when others crashed, and where each was when the run was interrupted)."""
        if all(process is None for process in self.processes):
            return
        self.dumping.set()  # from now on the readers pass on every line of stderr, shown or not
        for launch, process in zip(self.launches, self.processes):
            if launch.exit_code is None and process is not None:
                process.signal(signal.SIGUSR1)
        live = [s for s in self.states if s.exit_code is None]
        asked = {id(s) for s in live}
        deadline = time.monotonic() + DUMP_WAIT
        last = time.monotonic()  # when the last line of a dump came
        # Until every live rank's dump came and none went on for DUMP_SETTLE s, or DUMP_WAIT at most
        while time.monotonic() < deadline and not (
                all(s.dump for s in live) and time.monotonic() - last > DUMP_SETTLE):
            for item in self._take(0.05):
                _, kind, whose, line = item
                if kind == "err" and id(whose) in asked and isinstance(whose, RankState) and (
                        not line.strip() or self.ledger.dumped(whose, line)):  # (a dump's, its blank lines too)
                    last = time.monotonic()
                else:  # (what else came meanwhile: a rank's own lines, its last events, its end)
                    self._handle_item(item)
        self.ledger.located(program_files(self.plan))

    def clean_up(self, status: RunStatus, keep: bool) -> None:
        """Leave nothing running: stop the readers waiting, free the ports, kill every launch, cancel
        a Slurm job that did not complete, and release every host's run directory (``keep``: its files)."""
        plan = self.plan
        self.stopped.set()
        if self.holder is not None:
            self.holder.kill()
        self._stop_all()
        if self.processes[0] is not None:
            self.launcher.clean_up(plan, self.transports[plan.hosts[0].name], status == "completed")
        also = [plan.shared_run_dir] if plan.shared_run_dir else []
        kept: set[str] = set()
        if self.syncing is not None:  # (a sync under way ends before the end's bring-back)
            self.syncing.join(bringback.FETCH_TIMEOUT)
        if plan.work_key and plan.options.bring_back_max and self.processes[0] is not None:
            self._tell("finishing", "bringing back what the ranks wrote into the project")
            try:
                self.brought, kept = bringback.bring_back(self.transports, Path(plan.work_root),
                                                          self.states[0].spec.host, self.began_at,
                                                          plan.options.bring_back_max, self.synced)
            except Exception as exc:  # (whatever it was, the hosts' copies stay: nothing the job wrote is lost)
                log.debug("bringing back what the ranks wrote", exc_info=True)
                kept = set(self.transports)
                where = ", ".join(f"{name}:{t.run_dir}" for name, t in sorted(self.transports.items()))
                self.brought = BroughtBack(left=[f"what the ranks wrote, for the lab could not bring it back "
                                                 f"({exception_line(exc)}): it stays in {where}"])
        for_each_host(self.transports, lambda t: release(t, keep or t.host.name in kept, also))

    def _stop_all(self) -> None:
        """Kill every launch's process group, on all hosts at once: one command per host for all its
        groups (``Transport.kill_all``: a session per rank would pass sshd's MaxSessions)."""
        started = [(launch, process) for launch, process in zip(self.launches, self.processes) if process is not None]
        by_host: dict[str, tuple[Transport, list[RankProcess]]] = {}
        for launch, process in started:
            by_host.setdefault(launch.launch.host, (self.transports[launch.launch.host], []))[1].append(process)
        for_each_host(by_host, lambda host: host[0].kill_all(host[1]))
        for launch, process in started:
            self.ledger.killed(launch, process.poll())

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
                             self.ports, walled, restarts=self.ledger.restarts, hang_found=self.hang_found,
                             brought_back=self.brought.lines() if self.brought else [], ended_at=time.monotonic())
        preflight = self.ledger.preflight
        outcome.cause = preflight.cause if status == "preflight" and preflight else explain_run(outcome)
        return outcome
