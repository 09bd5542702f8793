"""Benchmark: the lab's own speed, each figure a ratio against a baseline timed in the same run.

    launch-ssh    `lab launch --hosts` on 4 container hosts (over SSH)
                  / the same script started by parallel `docker exec` on them         goal <= 1.10
    warm-start    `lab run p2p` on 4 container hosts, forked from each host's warm server
                  / the same run started cold (--env PYTHONHASHSEED=0, a setting the servers
                  did not start with: each host's launcher imports torch)             goal <= 0.60
    run-all       the `processes` exercise / the whole `run all` on 8 container hosts goal <  0.25
    up            `lab up --no-smoke` / `docker-compose up -d` of the same 4 hosts
                  (image built, no container yet)                                      goal <= 1.20
    doctor        the doctor's all-pairs phase / the slowest pair, on 8 hosts
                  (benchmarks/doctor_mesh.py, 0.25 s per connection)                   goal <= 1.30
    launch-local  `lab launch --nproc 4` / `torchrun --nproc-per-node 4`               goal <  1.00
    hang-verdict  the time each hanging program of tests/why/ (but FORMS_LATE's) takes to its verdict
                  past a healthy run of as many ranks (start-up, one all_reduce, the end), the slowest
                  / --hang-after + 3 s (a verdict at most 3 s after the hang is due) goal <= 1.00
    hang-training the time from when each hanging training program of tests/train/ hangs (the
                  last rank's entry into the call it hangs in, DDP's C++ all_reduce included) to the
                  hang finder's verdict, both read from its --trace file, the slowest
                  / --hang-after + 3 s                                                   goal <= 1.00
    preflight     what the preflight adds to `lab run p2p` on 4 container hosts (with it, less the
                  median without it: --no-preflight) / 0.3 s                           goal <= 1.00
    cross-vpc     `lab run p2p` on the cross-VPC lab without peering, to its verdict (the
                  preflight stops it, exit 6) / 5 s                                    goal <= 1.00
    cross-vpc-busy  the same with twice as many busy processes as cores / 10 s          goal <= 1.00
    requirements  what `--requirements` adds to `lab launch` of an unchanged project on 4 container
                  hosts that keep its environment (with it, less the median without it) / 0.2 s
                                                                                        goal <= 1.00
    bring-back    what bringing back a 50 MiB checkpoint that the ranks of 2 container hosts wrote
                  adds to their launch (less the median with --bring-back-max 0)
                  / an `scp` of it from rank 0's host                                    goal <= 1.20
    busy          false verdicts / runs of healthy jobs on 4 container hosts with twice as many
                  busy processes as cores (`run p2p`, `launch` under the lab's launcher and
                  torchrun: 10 runs of each, at least)                                  goal  = 0
    p2p-8         false verdicts / runs of `run p2p` on 8 container hosts on 2 cores (10 runs at
                  least: the hosts importing torch at once are load enough)             goal  = 0

Each pair is timed --repeat times, alternating, and compared by medians. The container
benchmarks bring up labs of their own (named bench4 and bench8) and take them down again;
`up` needs the default lab down (it starts and removes it). Needs the Docker engine and the
lab image (`make lab-up` builds it), except doctor, launch-local, hang-verdict and hang-training; cross-vpc
brings up the cross-VPC lab as benchx (its networks are the default cross-VPC lab's: that one
must be down).

    python benchmarks/lab_speed.py [NAME...] [--repeat 3]        (make bench: all of them)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.doctor_mesh import parallel_mesh  # noqa: E402
from lab.containerlab.topology import PYTHON, Topology  # noqa: E402
from tests.load import cpu_hog  # noqa: E402
from tests.wheels import LABTOK, make_wheel  # noqa: E402

LAB = [sys.executable, "-m", "lab"]
TIMEOUT = 600
# What every rank runs: a rendezvous, one all_reduce checked, and the end of the group.
SCRIPT = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.ones(1024)
dist.all_reduce(total)
assert total[0].item() == dist.get_world_size()
dist.destroy_process_group()
"""


@dataclass(frozen=True)
class Figure:
    name: str
    what: str
    lab: list[float]
    baseline: list[float]
    goal: float
    strict: bool  # the goal is "under", not "at most"

    @property
    def ratio(self) -> float:
        return statistics.median(self.lab) / statistics.median(self.baseline)

    @property
    def met(self) -> bool:
        return self.ratio < self.goal if self.strict else self.ratio <= self.goal


def timed(argv: list[str], what: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Seconds ``argv`` took; a failure ends the benchmark with its output."""
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{what}: {' '.join(argv)} exited {done.returncode}:\n"
                         f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return seconds, done


Timing = Callable[[], float]


def alternating(repeat: int, lab: Timing, baseline: Timing) -> tuple[list[float], list[float]]:
    """Both timed ``repeat`` times, taking turns (a slow moment of the machine falls on both)."""
    ours, theirs = [], []
    for _ in range(repeat):
        ours.append(lab())
        theirs.append(baseline())
    return ours, theirs


class ContainerLab:
    """A lab of ``hosts`` hosts named ``name``, up for the benchmark and down after it."""

    def __init__(self, name: str, hosts: int) -> None:
        self.topology = Topology(hosts=hosts, lab=name)
        self.inventory = REPO / f"{name}.inventory.yaml"

    def __enter__(self) -> ContainerLab:
        timed([*LAB, "up", "--name", self.topology.lab, "--hosts", str(self.topology.hosts), "--no-smoke"],
              f"lab up --name {self.topology.lab}")
        return self

    def __exit__(self, *_: object) -> None:
        subprocess.run([*LAB, "down", "--name", self.topology.lab], cwd=REPO, capture_output=True, timeout=TIMEOUT)
        self.inventory.unlink(missing_ok=True)

    def addresses(self) -> list[str]:
        hosts = yaml.safe_load(self.inventory.read_text())["all"]["hosts"]
        return [hosts[self.topology.name(i)]["ansible_host"] for i in self.topology.indices()]


def launch_ssh(repeat: int, script: Path) -> Figure:
    with ContainerLab("bench4", 4) as lab:
        master, n = lab.addresses()[0], lab.topology.hosts
        ports = iter(range(29600, 29600 + repeat))

        def over_ssh() -> float:
            return timed([*LAB, "launch", "--hosts", str(lab.inventory), str(script)], "lab launch --hosts")[0]

        def docker_exec(i: int, port: int) -> None:
            container = lab.topology.container(i)
            # (not /tmp: a host's /tmp is a tmpfs, which docker cp cannot write into)
            timed(["docker", "cp", str(script), f"{container}:/opt/{script.name}"], "docker cp")
            env = {"MASTER_ADDR": master, "MASTER_PORT": str(port), "RANK": str(i - 1), "LOCAL_RANK": "0",
                   "WORLD_SIZE": str(n)}
            timed(["docker", "exec", "-u", "lab", *(f"-e{k}={v}" for k, v in env.items()), container, PYTHON,
                   f"/opt/{script.name}"], f"docker exec {container}")

        def by_docker_exec() -> float:
            port, started = next(ports), time.monotonic()
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(lambda i: docker_exec(i, port), lab.topology.indices()))
            return time.monotonic() - started

        ours, theirs = alternating(repeat, over_ssh, by_docker_exec)
    return Figure("launch-ssh", "lab launch --hosts (4 hosts) / parallel docker exec", ours, theirs, 1.10, False)


def warm_start(repeat: int) -> Figure:
    with ContainerLab("bench4", 4) as lab:
        run = [*LAB, "run", "p2p", "--hosts", str(lab.inventory)]
        ours, theirs = alternating(repeat, lambda: timed(run, "lab run p2p (warm)")[0],
                                   lambda: timed([*run, "--env", "PYTHONHASHSEED=0"], "lab run p2p (cold)")[0])
    return Figure("warm-start", "run p2p on 4 hosts, warm / cold", ours, theirs, 0.6, False)


def run_all(repeat: int) -> Figure:
    whole, processes = [], []
    with ContainerLab("bench8", 8) as lab:
        for _ in range(repeat):
            seconds, done = timed([*LAB, "run", "all", "--hosts", str(lab.inventory), "--json"], "lab run all")
            report = json.loads(done.stdout)
            whole.append(seconds)
            processes.append(next(e["seconds"] for e in report["exercises"] if e["name"] == "processes"))
    return Figure("run-all", "processes / run all (8 hosts)", processes, whole, 0.25, True)


def compose_tool() -> list[str]:
    for tool in (["docker-compose"], ["docker", "compose"]):
        if shutil.which(tool[0]) and subprocess.run([*tool, "version"], capture_output=True).returncode == 0:
            return tool
    raise SystemExit("up: neither docker-compose nor `docker compose` is installed")


def up(repeat: int) -> Figure:
    default = Topology()
    running = subprocess.run(["docker", "ps", "-q", "--filter", f"name=^{default.container(1)}$"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    if running:
        raise SystemExit("up: the default lab is up; `python -m lab down` first (this benchmark starts and "
                         "removes it)")
    compose = [*compose_tool(), "-f", str(REPO / "compose" / "lab.yml")]
    down = [*LAB, "down"]
    timed([*LAB, "up", "--no-smoke"], "lab up (warming: the image and the key)")
    timed(down, "lab down")

    def lab_up() -> float:
        seconds = timed([*LAB, "up", "--no-smoke"], "lab up")[0]
        timed(down, "lab down")
        return seconds

    def compose_up() -> float:
        seconds = timed([*compose, "up", "-d"], "compose up")[0]
        timed([*compose, "down", "-v"], "compose down")
        return seconds

    try:
        ours, theirs = alternating(repeat, lab_up, compose_up)
    finally:
        subprocess.run(down, cwd=REPO, capture_output=True, timeout=TIMEOUT)
    return Figure("up", "lab up --no-smoke / docker-compose up -d (4 hosts)", ours, theirs, 1.2, False)


def doctor(repeat: int) -> Figure:
    delay = 0.25
    mesh = parallel_mesh(8, delay, repeat)
    return Figure("doctor", f"doctor's mesh phase / the slowest pair ({delay:g} s), 8 hosts", mesh,
                  [delay] * repeat, 1.3, False)


def launch_local(repeat: int, script: Path) -> Figure:
    def lab_launch() -> float:
        return timed([*LAB, "launch", "--nproc", "4", str(script)], "lab launch --nproc 4")[0]

    def torchrun() -> float:
        return timed([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", str(script)],
                     "torchrun")[0]

    ours, theirs = alternating(repeat, lab_launch, torchrun)
    return Figure("launch-local", "lab launch --nproc 4 / torchrun", ours, theirs, 1.0, True)


def cli_start(repeat: int) -> Figure:
    """A command's start: ``lab list`` against a Python that imports what every command prints with."""
    def lab_list() -> float:
        return timed([*LAB, "list"], "lab list")[0]

    def python() -> float:
        return timed([sys.executable, "-c", "import argparse, yaml, rich.console"], "python")[0]

    ours, theirs = alternating(repeat, lab_list, python)
    return Figure("cli-start", "lab list / python importing yaml and rich", ours, theirs, 4.0, False)


HANG_AFTER = 5.0
VERDICT_WITHIN = 3.0  # seconds past --hang-after


# hanging fixtures whose hang forms long after the ranks start, on purpose: not a verdict's delay
FORMS_LATE = {"recv_cycle_while_bytes_move": "its ranks move bytes for 8 s before nothing moves"}


def hang_verdict(repeat: int, script: Path) -> Figure:
    """Each hanging fixture of tests/why/ (exit 4, found by the hang finder: no timeout= of its own)."""
    from tests.test_why_fixtures import FIXTURES, expectation  # the fixtures' own reader

    hangs = [(path, e.nproc) for path in FIXTURES
             if (e := expectation(path)).exit == 4 and e.timeout is None and path.stem not in FORMS_LATE]
    healthy: dict[int, list[float]] = {}
    slowest = []
    for _ in range(repeat):
        for nproc in sorted({n for _, n in hangs}):
            healthy.setdefault(nproc, []).append(
                timed([*LAB, "launch", "--nproc", str(nproc), str(script)], f"lab launch --nproc {nproc}")[0])
        excess = []
        for path, nproc in hangs:
            started = time.monotonic()
            done = subprocess.run([*LAB, "launch", "--nproc", str(nproc), "--hang-after", f"{HANG_AFTER:g}",
                                   "--timeout", "120", str(path)], cwd=REPO, capture_output=True, text=True,
                                  timeout=TIMEOUT)
            if done.returncode != 4 or "hung: nothing moved" not in done.stdout:
                sys.exit(f"{path.name}: not found hung (exit {done.returncode}):\n{done.stdout[-2000:]}")
            excess.append(time.monotonic() - started - statistics.median(healthy[nproc]))
        slowest.append(max(excess))
    return Figure("hang-verdict", f"slowest of {len(hangs)} hangs past a healthy run / --hang-after "
                  f"{HANG_AFTER:g} + {VERDICT_WITHIN:g} s", slowest, [HANG_AFTER + VERDICT_WITHIN] * repeat, 1.0,
                  False)


def slowest_traced(exit_code: int, what: str, delay: Callable[[dict[str, Any], str], float | None],
                   repeat: int) -> tuple[int, list[float]]:
    """Each program of tests/train/ that ends with ``exit_code`` (no timeout= of its own) under ``lab launch
    --trace``, timed by the lab's own clock: ``delay(trace, stdout)`` in seconds (None: not ``what`` it
    should be, which ends the benchmark); how many, and the slowest of each round."""
    from tests.test_train_programs import PROGRAMS
    from tests.test_why_fixtures import expectation

    runs = [(path, e.nproc) for path in PROGRAMS if (e := expectation(path)).exit == exit_code and e.timeout is None]
    slowest = []
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        for _ in range(repeat):
            delays = []
            for path, nproc in runs:
                done = subprocess.run([*LAB, "launch", "--nproc", str(nproc), "--hang-after", f"{HANG_AFTER:g}",
                                       "--timeout", "120", "--trace", str(trace), str(path)], cwd=REPO,
                                      capture_output=True, text=True, timeout=TIMEOUT)
                found = delay(json.loads(trace.read_text()), done.stdout) if done.returncode == exit_code else None
                if found is None:
                    sys.exit(f"{path.name}: not {what} (exit {done.returncode}):\n{done.stdout[-2000:]}")
                delays.append(found)
            slowest.append(max(delays))
    return len(runs), slowest


def hang_training(repeat: int) -> Figure:
    """Each hanging program of tests/train/ (exit 4, found by the hang finder): from the newest start of a
    call a rank hangs in to the verdict."""
    def hung(trace: dict[str, Any], out: str) -> float | None:
        if "hung: nothing moved" not in out:
            return None
        formed = max(e["ts"] for e in trace["traceEvents"]
                     if e["ph"] == "X" and e["name"].endswith("(in flight at the end)"))
        return float(trace["otherData"]["hang_found"] - formed) / 1e6

    count, slowest = slowest_traced(4, "found hung", hung, repeat)
    return Figure("hang-training", f"slowest of {count} training hangs, from the hang to its verdict / "
                  f"--hang-after {HANG_AFTER:g} + {VERDICT_WITHIN:g} s", slowest,
                  [HANG_AFTER + VERDICT_WITHIN] * repeat, 1.0, False)


def crash_training(repeat: int) -> Figure:
    """Each crashing program of tests/train/ (exit 1): from when the first rank that failed was seen to
    (its end event, or its end) to the verdict."""
    def crashed(trace: dict[str, Any], out: str) -> float | None:
        said = trace["otherData"]
        return float(said["verdict"] - said["first_failure"]) / 1e6 if "first_failure" in said else None

    count, slowest = slowest_traced(1, "a crash", crashed, repeat)
    return Figure("crash-training", f"slowest of {count} training crashes, from the first rank's failure to "
                  f"the verdict / {VERDICT_WITHIN:g} s", slowest, [VERDICT_WITHIN] * repeat, 1.0, False)


PREFLIGHT_GOAL = 0.3  # seconds the preflight may add to a healthy run
CROSS_VPC_GOAL = 5.0  # seconds to the verdict on the unpeered cross-VPC lab


def preflight(repeat: int) -> Figure:
    with ContainerLab("bench4", 4) as lab:
        def run(*extra: str) -> Timing:
            return lambda: timed([*LAB, "run", "p2p", "--hosts", str(lab.inventory), *extra], "lab run p2p")[0]

        checked, unchecked = alternating(repeat, run(), run("--no-preflight"))
    added = [t - statistics.median(unchecked) for t in checked]
    return Figure("preflight", f"run p2p (4 hosts) with the preflight less without it / {PREFLIGHT_GOAL:g} s",
                  added, [PREFLIGHT_GOAL] * repeat, 1.0, False)


REQUIREMENTS_GOAL = 0.2  # seconds a requirements file the hosts keep may add to a launch


def requirements(repeat: int) -> Figure:
    with ContainerLab("bench4", 4) as lab, tempfile.TemporaryDirectory() as folder:
        project = Path(folder)  # (one project for both: its tokenizer used where it is there)
        (project / "train.py").write_text("try:\n    import labtok\nexcept ImportError:\n    labtok = None\n")
        make_wheel(project / "wheels", "labtok", "1.0", LABTOK)
        (project / "requirements.txt").write_text("--no-index\n--find-links wheels\nlabtok==1.0\n")

        def launch(*extra: str) -> Timing:
            return lambda: timed([*LAB, "launch", "--hosts", str(lab.inventory), *extra, str(project / "train.py")],
                                 "lab launch")[0]

        with_it = launch("--requirements", str(project / "requirements.txt"))
        with_it()  # (the hosts keep the project and install its environment, once)
        kept, plain = alternating(repeat, with_it, launch())
    added = [t - statistics.median(plain) for t in kept]
    return Figure("requirements", f"launch (4 hosts) with a kept requirements file less without it / "
                                  f"{REQUIREMENTS_GOAL:g} s", added, [REQUIREMENTS_GOAL] * repeat, 1.0, False)


CHECKPOINT_MB = 50
# Each rank writes the same checkpoint of CHECKPOINT_MB MiB to a relative out/.
CHECKPOINT = f"""\
import os, random
os.makedirs("out", exist_ok=True)
with open("out/ckpt.bin", "wb") as f:
    f.write(random.Random(0).randbytes({CHECKPOINT_MB} << 20))
"""


def bring_back(repeat: int) -> Figure:
    with ContainerLab("bench4", 2) as lab, tempfile.TemporaryDirectory() as folder:
        project, copies = Path(folder, "project"), Path(folder, "scp")
        project.mkdir()
        copies.mkdir()
        (project / "train.py").write_text(CHECKPOINT)
        hosts = yaml.safe_load(lab.inventory.read_text())["all"]
        login = hosts["vars"]
        ssh = ["-i", str(lab.inventory.parent / os.path.expanduser(login["ansible_ssh_private_key_file"])), "-o",
               f"UserKnownHostsFile={lab.inventory.parent / os.path.expanduser(login['ssh_known_hosts_file'])}",
               "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-q"]

        def launch(*extra: str) -> Timing:
            def once() -> float:
                seconds = timed([*LAB, "launch", "--hosts", str(lab.inventory), *extra, str(project / "train.py")],
                                "lab launch (a checkpoint)")[0]
                shutil.rmtree(project / "out", ignore_errors=True)  # (the next launch carries the same project)
                shutil.rmtree(project / ".lab", ignore_errors=True)
                return seconds
            return once

        user, first = login.get("ansible_user", "lab"), lab.topology.name(1)
        timed(["docker", "exec", "-u", user, lab.topology.container(1), PYTHON, "-c",
               CHECKPOINT.replace('"out', '"/tmp/bench-out')], "the checkpoint on rank 0's host, for scp")

        def scp() -> float:
            return timed(["scp", *ssh, f"{user}@{hosts['hosts'][first]['ansible_host']}:/tmp/bench-out/ckpt.bin",
                          str(copies / "ckpt.bin")], "scp")[0]

        launch()()  # (the hosts keep the project)
        brought, plain, copied = [], [], []
        for _ in range(repeat):
            brought.append(launch()())
            plain.append(launch("--bring-back-max", "0")())
            copied.append(scp())
    added = [t - statistics.median(plain) for t in brought]
    return Figure("bring-back", f"bringing back a {CHECKPOINT_MB} MiB checkpoint from 2 hosts / an scp of it",
                  added, copied, 1.2, False)


CROSS_VPC_BUSY_GOAL = 10.0  # seconds to that verdict with the CPU hog
FALSE_VERDICT_RUNS = 10  # runs of each healthy job, at least


def cross_vpc(repeat: int) -> list[Figure]:
    """The unpeered cross-VPC lab's verdict, on a quiet machine and with the CPU hog."""
    inventory = REPO / "benchx.inventory.yaml"
    timed([*LAB, "up", "--name", "benchx", "--topology", "cross-vpc", "--inventory", str(inventory), "--no-smoke"],
          "lab up --topology cross-vpc")

    def verdict() -> float:
        started = time.monotonic()
        done = subprocess.run([*LAB, "run", "p2p", "--hosts", str(inventory)], cwd=REPO, capture_output=True,
                              text=True, timeout=TIMEOUT)
        if done.returncode != 6 or "behind NAT" not in done.stdout:
            sys.exit(f"run p2p on the unpeered cross-VPC lab: not stopped by the preflight "
                     f"(exit {done.returncode}):\n{done.stdout[-3000:]}")
        return time.monotonic() - started

    try:
        quiet = [verdict() for _ in range(repeat)]
        with cpu_hog():
            busy = [verdict() for _ in range(repeat)]
    finally:
        subprocess.run([*LAB, "down", "--name", "benchx"], cwd=REPO, capture_output=True, timeout=TIMEOUT)
        inventory.unlink(missing_ok=True)
    return [Figure("cross-vpc", f"run p2p to its verdict, cross-VPC lab without peering / {CROSS_VPC_GOAL:g} s",
                   quiet, [CROSS_VPC_GOAL] * repeat, 1.0, False),
            Figure("cross-vpc-busy", f"the same, with the CPU hog / {CROSS_VPC_BUSY_GOAL:g} s", busy,
                   [CROSS_VPC_BUSY_GOAL] * repeat, 1.0, False)]


def false_verdicts(jobs: dict[str, list[str]], runs: int) -> tuple[int, int]:
    """(verdicts, runs): each healthy job run ``runs`` times in turn; any exit but 0 is a false verdict."""
    verdicts = 0
    for _ in range(runs):
        for name, argv in jobs.items():
            done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT)
            if done.returncode != 0:
                verdicts += 1
                print(f"  {name}: exit {done.returncode}: {(done.stdout + done.stderr).strip().splitlines()[-1:]}",
                      flush=True)
    return verdicts, runs * len(jobs)


def busy(repeat: int, script: Path) -> Figure:
    with ContainerLab("bench4", 4) as lab, cpu_hog() as hogs:
        hosts = str(lab.inventory)
        verdicts, runs = false_verdicts({
            "run p2p": [*LAB, "run", "p2p", "--hosts", hosts],
            "launch": [*LAB, "launch", "--hosts", hosts, str(script)],
            "launch torchrun": [*LAB, "launch", "--hosts", hosts, "--launcher", "torchrun", str(script)]},
            max(repeat, FALSE_VERDICT_RUNS))
    return Figure("busy", f"false verdicts / runs, 4 hosts, {len(hogs)} busy processes on {os.cpu_count()} cores",
                  [verdicts], [runs], 0.0, False)


def p2p_eight(repeat: int) -> Figure:
    with ContainerLab("bench8", 8) as lab:
        verdicts, runs = false_verdicts({"run p2p": [*LAB, "run", "p2p", "--hosts", str(lab.inventory)]},
                                        max(repeat, FALSE_VERDICT_RUNS))
    return Figure("p2p-8", "false verdicts / runs of run p2p on 8 hosts", [verdicts], [runs], 0.0, False)


def main() -> int:
    names = ("launch-ssh", "warm-start", "run-all", "up", "doctor", "launch-local", "hang-verdict", "hang-training",
             "preflight", "requirements", "bring-back", "cross-vpc", "busy", "p2p-8", "cli-start", "crash-training")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(names)} (default all)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in names]
    if unknown or args.repeat < 1:
        parser.error(f"unknown {', '.join(unknown)}" if unknown else "--repeat must be at least 1")
    os.environ["PYTHONPATH"] = str(REPO)
    figures = []
    with tempfile.TemporaryDirectory() as directory:
        script = Path(directory, "allreduce_once.py")
        script.write_text(SCRIPT)
        script.chmod(0o644)
        runs = {"launch-ssh": lambda: launch_ssh(args.repeat, script), "warm-start": lambda: warm_start(args.repeat),
                "run-all": lambda: run_all(args.repeat),
                "up": lambda: up(args.repeat), "doctor": lambda: doctor(args.repeat),
                "launch-local": lambda: launch_local(args.repeat, script),
                "hang-verdict": lambda: hang_verdict(args.repeat, script),
                "hang-training": lambda: hang_training(args.repeat),
                "preflight": lambda: preflight(args.repeat), "requirements": lambda: requirements(args.repeat),
                "bring-back": lambda: bring_back(args.repeat), "cross-vpc": lambda: cross_vpc(args.repeat),
                "busy": lambda: busy(args.repeat, script), "p2p-8": lambda: p2p_eight(args.repeat),
                "cli-start": lambda: cli_start(args.repeat), "crash-training": lambda: crash_training(args.repeat)}
        for name in args.names or names:
            made = runs[name]()
            for figure in made if isinstance(made, list) else [made]:
                figures.append(figure)
                print(f"{figure.name:13} {figure.ratio:5.2f}  ({figure.what}: "
                      f"{', '.join(f'{t:.2f}' for t in figure.lab)} / {', '.join(f'{t:.2f}' for t in figure.baseline)})"
                      f"  goal {'<' if figure.strict else '<='} {figure.goal:g}: {'met' if figure.met else 'NOT met'}",
                      flush=True)
    return 0 if all(f.met for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
