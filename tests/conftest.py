"""Shared helpers: run the real CLI as a subprocess and look for processes it left behind; start
ranks on this machine as the lab starts each one, and read their events."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.rank import warm
from lab.rank.events import parse_event
from lab.rank.protocol import MARK
from lab.rank.reaper import descendants

from .sshd import SSHServer, require_sshd, start_sshd

REPO = Path(__file__).resolve().parents[1]
WRONG = Path(__file__).resolve().parent / "wrong"

# -- the suite on two workers (make test: pytest-xdist, --dist loadgroup) ---------------------------
# Two lanes. The container lane: every test of the docker and machines tiers, one after another in one
# worker (their labs' containers are CPU-heavy in bursts, and two labs side by side on 2 cores starved
# each other's timing); in it, the default lab's tests together (they change the lab named "lab": up,
# down, faults, shaped links, and its hosts are theirs alone while a test counts what is left on them),
# with test_doctor's that use it as they leave it. The other lane: the rest (unit, local, sshd), a
# module at a time in whichever worker is free, so that a module's fixtures (an sshd, a batch of
# launches) are made once. The container lane goes first (the longest by far), then the other lane's
# longest modules, so that none is left to run alone at the end. The grader's sandbox tests start no
# lab (a container a share, on no network of a lab's): they run with their module in the other lane,
# beside a lab as the local runs do, which evens the lanes (the container lane was 3 minutes longer).
# Not those marked default_lab: their sandboxes are the default lab's for a moment (a killed
# grader's, which `lab down` takes), and the container lane's tests count that lab's containers.
CONTAINER_TIERS = ("docker", "machines")
CONTAINER_LANE = "containers"
BESIDE_THE_LABS = ("test_grade",)
DEFAULT_LAB_MODULES = ("test_lab_docker",)
DEFAULT_LAB_FIXTURE = "container_lab"  # (test_doctor's: the lab up, as those modules leave it or find it)
LONGEST_FIRST = (CONTAINER_LANE, "default-lab", "test_lab_jobs", "test_machines", "test_cross_vpc", "test_slurm",
                 "test_local_run", "test_notebook", "test_train_programs", "test_launchers", "test_why_fixtures",
                 "test_grade", "test_ssh_hosts", "test_flight", "test_method")


def group_of(item: pytest.Item) -> str:
    """The xdist group a test runs in: the container lane's, or its module's."""
    part = _part_of(item)
    if part in BESIDE_THE_LABS:
        return part
    if part == "default-lab" or any(item.get_closest_marker(tier) for tier in CONTAINER_TIERS):
        return CONTAINER_LANE
    return part


def _part_of(item: pytest.Item) -> str:
    """The default lab's tests, or the test's module."""
    module = Path(item.nodeid.split("::", 1)[0]).stem
    uses_lab = DEFAULT_LAB_FIXTURE in getattr(item, "fixturenames", ()) or item.get_closest_marker("default_lab")
    return "default-lab" if module in DEFAULT_LAB_MODULES or uses_lab else module


@pytest.hookimpl(tryfirst=True)  # (before xdist's own hook, which reads the groups)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {group: n for n, group in enumerate(LONGEST_FIRST)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
    # (stable: the rest in their order)
    items.sort(key=lambda item: (first.get(group_of(item), len(first)), first.get(_part_of(item), len(first))))


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


@dataclass
class Ended:
    """A rank process that ended: its exit status, its events (in order, checked, as it sent them: the
    rank's side is what these tests look at), its stderr."""

    code: int
    events: list[dict[str, Any]]
    stderr: str


def run_ranks_as_the_lab_does(cwd: Path, n: int, argv: list[str], token: str, env: dict[str, str] | None = None,
                              timeout: float = 180) -> list[Ended]:
    """Run ``python ARGV`` as ranks 0 to n-1 of a run with ``token`` on this machine, each with a
    channel as the lab gives one (stdout) and the stdin the controller holds open; STORE in their
    environment is a file:// rendezvous of their own (in ``cwd``)."""
    stdin, held_open = os.pipe()  # (a rank ends its group when its stdin closes: the controller is gone)
    procs = []
    try:
        for rank in range(n):
            rank_env = {**os.environ, "PYTHONPATH": str(REPO), "LAB_TOKEN": token, "RANK": str(rank),
                        "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1",
                        "STORE": f"file://{cwd}/store?rank={rank}&world_size={n}", **(env or {})}
            procs.append(subprocess.Popen([sys.executable, *argv], stdin=stdin, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=rank_env, cwd=cwd, start_new_session=True))
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
        os.close(stdin)
        os.close(held_open)
    return [Ended(p.returncode, [as_sent(line, token) for line in out.decode().splitlines()
                                 if parse_event(line, token)], err.decode()) for p, (out, err) in zip(procs, outs)]


def as_sent(line: str, token: str) -> dict[str, Any]:
    """A checked event line's JSON object, as the rank sent it (what these tests look at: the rank's side)."""
    return json.loads(line[len(f"{MARK}{token} "):])


def lines_of(program: str) -> dict[str, int]:
    """The line of each ``# @name`` mark in ``program``."""
    return {m: n for n, line in enumerate(program.splitlines(), 1) for m in re.findall(r"# @(\w+)", line)}


class WarmServer:
    """``python -m lab.rank.warm serve`` for this user, in its folder under ``root`` (LAB_WARM_DIR)."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.folder = root / str(os.getuid())
        self.folder.mkdir(mode=0o700)
        self.process = subprocess.Popen([sys.executable, "-m", "lab.rank.warm", "serve", str(self.folder)],
                                        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, cwd=REPO,
                                        start_new_session=True, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not (self.folder / warm.SERVED).exists():
            assert self.process.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)

    @property
    def served(self) -> int:
        return int((self.folder / warm.SERVED).read_text())

    @property
    def log(self) -> str:
        return (self.folder / warm.LOG).read_text() if (self.folder / warm.LOG).exists() else ""

    def below(self) -> list[int]:
        """What runs below the server now: a launch's keeper, its zygote, its ranks, what they left."""
        return descendants(self.process.pid)

    def left_below(self) -> list[int]:
        """What is still below the server a moment after the runs through it ended (a keeper sweeps,
        says how its launch ended, then ends)."""
        deadline = time.monotonic() + 10
        while self.below() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.below()

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(30)


_SHARED_WARM: list[WarmServer] = []  # this worker's server for the tests' local runs (shared_warm_server)


def shared_warm_server() -> WarmServer:
    """This worker's warm server, which the local runs of every test's :class:`Lab` but a cold one are
    forked from (one torch import for the session, as a container host's server gives the lab's runs
    on its host: docs/engineers.md); started on first use, and again where a run stopped it."""
    if _SHARED_WARM and _SHARED_WARM[0].process.poll() is not None:
        _stop_shared_warm_server()
    if not _SHARED_WARM:
        _SHARED_WARM.append(WarmServer(Path(tempfile.mkdtemp(prefix="lab-tests-warm-"))))
    return _SHARED_WARM[0]


def _stop_shared_warm_server() -> None:
    for server in _SHARED_WARM:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)
    _SHARED_WARM.clear()


def pytest_sessionfinish() -> None:
    _stop_shared_warm_server()


class Lab:
    """Runs ``python -m lab`` with a marker in its environment that every rank inherits, so a test
    can find any process the run left behind.

    Its local runs under ``--launcher lab`` are forked from this worker's warm server
    (:func:`shared_warm_server`): what they leave is what is left below the server (a forked rank
    keeps the server's environment, marker-less). A ``cold`` lab's start as a user's own machine
    starts them (each run imports torch in its zygote): for what a test asks of that start itself
    (the import, its pulses, the reaper's sweep, the processes a run counts while it runs)."""

    def __init__(self, *, cold: bool = False) -> None:
        self.marker = uuid.uuid4().hex
        self.env = {**os.environ, "LAB_TEST_MARKER": self.marker, "COLUMNS": "200"}
        self.started: list[int] = []  # the pids of the commands it ran (whose, say, a sandbox is)
        self.warm = None if cold else shared_warm_server()
        if self.warm is not None:
            self.env[warm.WARM_DIR_VAR] = str(self.warm.root)

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "lab", *args]

    def __call__(self, *args: str, timeout: float = 240, stdin: str | None = None) -> Result:
        """The command's end; ``stdin``: what it reads on its stdin (else nothing: /dev/null)."""
        with self._start(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE) as proc:
            try:
                out, err = proc.communicate(stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
        return Result(proc.returncode, out, err)

    def measured(self, *args: str, timeout: float = 240) -> tuple[Result, int]:
        """Like calling it, and its peak resident memory in MB (VmHWM, read from /proc while it runs)."""
        proc = self._start(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        streams: dict[str, bytes] = {}
        readers = [threading.Thread(target=lambda n=n, s=s: streams.__setitem__(n, s.read()))
                   for n, s in (("out", proc.stdout), ("err", proc.stderr))]
        for reader in readers:
            reader.start()
        peak, deadline = 0, time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
                peak = max([peak, *(int(line.split()[1]) for line in status.splitlines()
                                    if line.startswith("VmHWM"))])
            except (OSError, ValueError):
                pass
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for reader in readers:
            reader.join()
        result = Result(proc.returncode, streams["out"].decode("utf-8", "replace"),
                        streams["err"].decode("utf-8", "replace"))
        return result, peak // 1024

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """The lab in the background, started as a non-interactive shell starts a background job
        (and as many CI runners do): with SIGINT ignored. Ctrl-C must stop it all the same."""
        return self._start(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           preexec_fn=_ignore_sigint)

    def _start(self, args: tuple[str, ...], **how: Any) -> subprocess.Popen[Any]:
        """``lab ARGS`` started from the repository with this lab's environment (and ``how``), its pid kept."""
        proc = subprocess.Popen(self.argv(*args), cwd=REPO, env=self.env, **how)
        self.started.append(proc.pid)
        return proc

    def leftovers(self) -> list[int]:
        """Pids of live processes that carry this test's marker, and (a warm lab's) what its runs left
        below the warm server: for after a run, where no other lab runs beside it."""
        return self.marked() + (self.warm.left_below() if self.warm else [])

    def marked(self) -> list[int]:
        """Pids of live processes that carry this test's marker (a warm lab's runs: not the processes
        forked from the warm server)."""
        return live_pids_with(f"LAB_TEST_MARKER={self.marker}")

    def running(self) -> list[int]:
        """The processes of this lab's run that runs now (a cold lab's: a warm server's processes
        carry no marker)."""
        assert self.warm is None, "a test that counts a run's processes while it runs starts it cold"
        return self.marked()

    def interrupt_when_running(self, proc: subprocess.Popen[str], processes: int) -> tuple[int, str]:
        """Ctrl-C ``proc`` once ``processes`` of its processes are up and have had time to get
        into their work; its exit code and output."""
        deadline = time.monotonic() + 60
        while len(self.running()) < processes and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        return proc.returncode, out


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def live_pids_with(needle: str) -> list[int]:
    """Live (not zombie) processes on this machine whose environment contains ``needle``:
    whatever a run started inherits the marker a test puts in its environment."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle.encode() in (entry / "environ").read_bytes():
                stat = (entry / "stat").read_text()
                if stat[stat.rindex(")") + 2] != "Z":
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHServer]:
    """A real sshd on loopback, one per test module (skips, or fails under CI, without sshd)."""
    require_sshd()
    sshd = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield sshd
    sshd.stop()


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Lab:
    """A :class:`Lab`; a cold one for a test marked ``cold``."""
    return Lab(cold=request.node.get_closest_marker("cold") is not None)


DDP_SERIES = REPO / "tests" / "projects" / "ddp_series"  # a project shaped as pytorch/examples' DDP series
TOKENIZED = REPO / "tests" / "projects" / "tokenized"  # a trainer that needs a package the hosts lack


def assert_ddp_series_trained(out: str, ranks: int) -> None:
    """tests/projects/ddp_series ran whole, launched with --env SERIES_TAG=series-1 and --epochs 2:
    its package, config and data found by relative paths."""
    assert f"trained 2 epoch(s) on {ranks} rank(s), tag series-1; snapshot at snapshots/latest.pt: True" in out, out
    assert re.search(r"epoch 1 loss \d+\.\d{4}", out), out


# The lab's processes of a run on a host, by their command lines: ranks, host launchers, taggers, port
# holders; and whatever the warm start forked for a launch (lab.rank.warm: they keep its server's command line)
RUN_PROCESSES = re.compile(r"lab[.]rank[.](worker|script|node|output|ports)")
WARM_SERVER = "lab.rank.warm serve"
HOST_PROCESSES = ("ps", "-eo", "pid=,ppid=,args=")  # (what run_processes reads, run on the host)


def run_processes(ps: str) -> list[str]:
    """The lab's processes of a run in a host's ``ps -eo pid=,ppid=,args=`` (each as ``PID ARGS``): those
    named above, and what runs below the host's warm server (the server itself is the host's, not a run's)."""
    rows = [fields for fields in (line.split(None, 2) for line in ps.splitlines()) if len(fields) == 3]
    warm = {pid for pid, _, args in rows if WARM_SERVER in args}
    return [f"{pid} {args}" for pid, ppid, args in rows
            if RUN_PROCESSES.search(args) or (pid in warm and ppid in warm)]


# What a run says of its phases on stderr when it is not on a terminal (lab.cli.views.run.phases)
PHASE_LINE = re.compile(r"lab: (reaching|holding|starting|checking|rendezvous|running|finishing|timing)\b")


def said_apart_from_phases(stderr: str) -> list[str]:
    """The lines of ``stderr`` but the phase lines a run prints in a pipe."""
    return [line for line in stderr.splitlines() if not PHASE_LINE.match(line)]
