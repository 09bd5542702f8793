"""``python -m lab``: parses the command line and dispatches; the only module that prints to the
user or exits. Every step it calls lives in ``lab.core``, ``lab.doctor`` or ``lab.containerlab``."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import stat
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import NoReturn

import yaml
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from lab.containerlab import crossvpc, engine, faults, hosts, shaping, slurm, spread
from lab.containerlab.image import DEFAULT_BASE, OFFLINE
from lab.containerlab.topology import (
    DEFAULT_LAB,
    SCHEDULERS,
    TOPOLOGIES,
    HostLimits,
    LabPaths,
    Topology,
    check_lab_name,
    default_inventory,
)
from lab.containerlab.up import UpRequest, bring_up
from lab.core import bench
from lab.core import slurm as slurm_jobs
from lab.core.inventory import ALLOCATION, Inventory, allocation_inventory, load_inventory, local_inventory
from lab.core.judge import ended, exit_code, hung_at_start, judge
from lab.core.plan import (
    BACKENDS,
    DEFAULT_TIMEOUT,
    INIT_METHODS,
    LAUNCHERS,
    Launcher,
    Options,
    build_launch_plan,
    build_plan,
    without_unshared,
)
from lab.core.report import STATUS_STYLES, LineStreamer, print_report, to_json, to_junit
from lab.core.runner import run_plan
from lab.core.slurm import WORKING
from lab.core.text import printable
from lab.doctor.known import printed_causes, run_causes
from lab.doctor.render import print_diagnosis
from lab.doctor.run import diagnose, explain_hang
from lab.doctor.scenario import run_scenario
from lab.errors import ExitCode, LabError, UsageError
from lab.grading.grade import Grade, Gradebook, find_submissions, grade_all
from lab.grading.places import DEFAULT_WALL, GradeRequest, places_for
from lab.grading.sandbox import Limits
from lab.suite import registry
from lab.transport import with_master_address
from lab.transport.local import local_gpu_count
from lab.transport.ssh import SSHSettings

DEFAULT_LAUNCH_TIMEOUT = 3600.0  # seconds a `launch` may run unless --timeout says otherwise
EXIT_CODES = "exit codes:\n" + "\n".join(f"  {int(code):<4} {code.meaning}" for code in ExitCode)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, like every bad input
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m lab",
        description="Run torch.distributed exercises on a cluster of hosts and check every result.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    commands.add_parser("list", help="list the exercises, one line each")

    run = commands.add_parser(
        "run", help="run exercises on the local cluster or the hosts of an inventory, and check them",
        description="Run exercises (or 'all') and check every rank's result against an independent oracle.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("exercises", nargs="+", metavar="NAME", help="exercise names, or 'all' (see 'list')")
    _cluster_options(run)
    run.add_argument("--backend", choices=BACKENDS, help="default: nccl when every rank has its own GPU, else gloo")
    run.add_argument("--init", choices=INIT_METHODS, default="env",
                     help="how the ranks rendezvous for the shared process group (default env)")
    _launcher_option(run)
    run.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                     help=f"the longest any rank may spend on one step: start-up, rendezvous or one "
                          f"exercise (default {DEFAULT_TIMEOUT:g})")
    run.add_argument("--solution", metavar="FILE.py", help="run this file in place of the exercise's "
                     "reference program (one exercise) and check it the same way; it runs as you, with "
                     "your environment and files: for other people's code use `grade`")
    run.add_argument("--json", action="store_true", help="print the results as JSON on stdout "
                     "(rank output goes to stderr)")
    run.add_argument("--junit", metavar="FILE.xml", help="also write the results as JUnit XML (for grading in CI)")
    run.add_argument("--dry-run", action="store_true", help="print the plan as YAML and exit")
    run.add_argument("--keep", action="store_true", help="keep the run directory on every host")

    grading = commands.add_parser(
        "grade", help="grade a class: run one exercise with every student's file, write a gradebook",
        description="Run EXERCISE with each submission in SUBMISSIONS (a NAME.py file or a NAME/ folder "
                    "per student) exactly as `run EXERCISE --solution FILE` would, check it, and write "
                    "OUT/grades.csv (student, exercise, verdict, score, reason, seconds) and a JUnit "
                    "file per student. On the local cluster each submission runs in a throwaway "
                    "container (no network, read-only, user nobody, the limits below); the exit code "
                    "says whether grading worked, not whether the students passed.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    grading.add_argument("submissions", metavar="SUBMISSIONS", help="a folder with one .py file or folder per student")
    grading.add_argument("--exercise", required=True, metavar="NAME", help="the exercise to grade (see 'list')")
    _cluster_options(grading)
    grading.add_argument("--parallel", type=int, default=1, metavar="K",
                       help="grade K submissions at once, each on its own share of the cluster (default 1)")
    grading.add_argument("--out", default="grades", metavar="DIR", help="where the gradebook goes (default grades)")
    grading.add_argument("--sandbox", choices=("container", "none"),
                       help="local cluster: container (default) runs each submission in a throwaway "
                            "container; none runs it as you, like `run --solution` (with --hosts: none)")
    grading.add_argument("--memory", type=int, default=Limits.memory_mb, metavar="MB",
                       help=f"data memory per rank (RLIMIT_DATA, on every kind of host; default {Limits.memory_mb})")
    grading.add_argument("--pids", type=int, default=Limits.pids, metavar="N",
                       help=f"processes (and threads) per rank in the sandbox (default {Limits.pids})")
    grading.add_argument("--wall", type=float, default=DEFAULT_WALL, metavar="SECONDS",
                       help=f"the longest one submission may run in all (default {DEFAULT_WALL:g})")
    grading.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                       help=f"the longest any rank may spend on one step (default {DEFAULT_TIMEOUT:g})")
    grading.add_argument("--backend", choices=BACKENDS, help="default: as for run")

    up = commands.add_parser(
        "up", help="build the lab image and start the container lab, write its inventory, smoke-test it",
        description="Start a lab of hosts (containers with their own addresses and sshd) on the local "
                    "Docker engine, or across the Docker machines of --machines joined in a Swarm, write the "
                    "inventory for it, and run the p2p exercise across them.")
    up.add_argument("--hosts", type=int, metavar="N", help="hosts in the lab (default 4; with --machines: one "
                    "per machine, or each machine's lab_hosts)")
    up.add_argument("--slots", type=int, default=1, metavar="S", help="ranks per host in the inventory (default 1)")
    up.add_argument("--topology", choices=TOPOLOGIES, default="plain",
                    help="plain: one network; cross-vpc: two private networks joined only through a NAT "
                         "gateway, like two cloud VPCs (default plain)")
    up.add_argument("--peering", action="store_true", help="cross-vpc: route between the private networks")
    up.add_argument("--scheduler", choices=SCHEDULERS, default="none",
                    help="slurm: the hosts also form a Slurm cluster (slurmctld on node1, slurmd on every "
                         "host, munge with a key of the lab's own; plain topology) (default none)")
    up.add_argument("--base", default=DEFAULT_BASE, metavar="IMAGE",
                    help=f"base image (default {DEFAULT_BASE}); '{OFFLINE}' builds a Debian base with "
                         f"debootstrap, as happens when the base cannot be pulled")
    up.add_argument("--gpus", choices=("auto", "all", "none"), default="auto",
                    help="give the hosts the engine's GPUs (needs the NVIDIA container toolkit; "
                         "auto: when the engine has the nvidia runtime)")
    up.add_argument("--memory", type=int, default=HostLimits.memory_mb, metavar="MB",
                    help=f"memory each host's container may use (default {HostLimits.memory_mb})")
    up.add_argument("--pids", type=int, default=HostLimits.pids, metavar="N",
                    help=f"processes (and threads) each host may run (default {HostLimits.pids})")
    _name_option(up)
    up.add_argument("--inventory", metavar="PATH", help="where to write the lab's inventory (default: "
                    "inventory.yaml for the lab named lab, NAME.inventory.yaml for the others)")
    up.add_argument("--no-smoke", action="store_true", help="skip the p2p run across the hosts")
    machines_options = up.add_argument_group("across Docker machines (README: Several machines)")
    _machines_option(machines_options, "start the hosts across the Docker machines of FILE (an Ansible-style "
                     "inventory of machines), joined in a Swarm; the image goes to each by docker save | load")
    machines_options.add_argument("--network", choices=spread.NETWORK_MODES, default="overlay",
                                  help="overlay: the hosts on an attachable overlay network, each at its own address "
                                       "(default); host: one host per machine, on the machine's own address")
    machines_options.add_argument("--accept-new-host-keys", action="store_true",
                                  help="trust and record a machine's SSH host key seen for the first time")

    launch = commands.add_parser(
        "launch", help="run any script on every rank with the rendezvous injected (torchrun across hosts)",
        description="Run SCRIPT on every rank of the cluster with MASTER_ADDR, MASTER_PORT, RANK, "
                    "WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE in its environment, set by the lab, by "
                    "torchrun or by mp.spawn on each host (--launcher), across the hosts of an inventory. "
                    "The tutorials' torchrun scripts run unchanged.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _cluster_options(launch)
    _launcher_option(launch)
    launch.add_argument("--timeout", type=float, default=DEFAULT_LAUNCH_TIMEOUT, metavar="SECONDS",
                        help=f"stop the job when it runs longer (default {DEFAULT_LAUNCH_TIMEOUT:g}: an hour)")
    launch.add_argument("--keep", action="store_true", help="keep the run directory on every host")
    launch.add_argument("script", metavar="SCRIPT.py", help="the script every rank runs")
    launch.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")

    benching = commands.add_parser(
        "bench", help="time the collectives and p2p on each size, nccl-tests style, every result checked",
        description="Time all_reduce, all_gather, reduce_scatter, broadcast, reduce and p2p (each rank to the "
                    "next) on the cluster, for each size, and print nccl-tests' table: size, count, type, "
                    "redop, time, algbw, busbw (scaled so that it compares with a link's speed) and #wrong. "
                    "With --solution, a student's ring all-reduce beside gloo's.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _cluster_options(benching)
    benching.add_argument("--ops", metavar="OP,...", help=f"of {', '.join(bench.OPS)} (default all), and "
                          f"{', '.join(bench.RINGS.values())}: the ring-allreduce exercise's two rings")
    benching.add_argument("--solution", metavar="FILE.py", help="time this file's allreduce(send, recv) and/or "
                          "ring_allreduce(tensor) as ring and chunked_ring, checked, beside all_reduce and p2p "
                          "(or the --ops given)")
    benching.add_argument("--sizes", default=bench.DEFAULT_SIZES, metavar="SIZE,...",
                          help=f"bytes per buffer, with K, M, G (default {bench.DEFAULT_SIZES})")
    benching.add_argument("--iters", type=int, default=20, metavar="N", help="timed calls per size (default 20)")
    benching.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed calls first (default 2)")
    benching.add_argument("--backend", choices=BACKENDS, help="default: as for run")
    _launcher_option(benching)
    benching.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT * 5, metavar="SECONDS",
                          help=f"the longest the measurement may take on any rank (default {DEFAULT_TIMEOUT * 5:g})")
    benching.add_argument("--json", action="store_true", help="print the rows as JSON")
    benching.add_argument("--csv", metavar="FILE", help="also write the rows to FILE as CSV")
    benching.add_argument("--plot", metavar="FILE.png", help="also draw busbw against size (one line per op, and "
                          "raw TCP's) to FILE.png")

    submission = commands.add_parser(
        "submit", help="run exercises as a Slurm batch job (sbatch), here on the cluster's login host",
        description="Write an sbatch script that runs `python -m lab run NAME... --hosts slurm` on the nodes "
                    "Slurm gives the job, submit it and print its id; with --wait, wait for it and print its "
                    "report (its exit code is the run's). The job's output and JUnit results go to --out.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    submission.add_argument("exercises", nargs="+", metavar="NAME", help="exercise names, or 'all' (see 'list')")
    submission.add_argument("--nodes", type=int, default=2, metavar="N", help="nodes for the job (default 2)")
    submission.add_argument("--ntasks-per-node", type=int, default=1, metavar="S",
                            help="ranks on each node (default 1)")
    submission.add_argument("--time", metavar="LIMIT", help="the job's time limit, as Slurm writes it (MINUTES, "
                            "HH:MM:SS, DAYS-HH); default: the partition's")
    submission.add_argument("--partition", metavar="NAME", help="the partition (default: the cluster's default)")
    submission.add_argument("--launcher", choices=LAUNCHERS, help="who starts the ranks in the job (default srun)")
    submission.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                            help=f"as for run (default {DEFAULT_TIMEOUT:g})")
    submission.add_argument("--out", default="lab-jobs", metavar="DIR",
                            help="where the script, the job's output and its JUnit results go; the job's nodes "
                                 "must see it (default lab-jobs)")
    submission.add_argument("--wait", action="store_true", help="wait for the job and print its report; Ctrl-C "
                            "cancels it")

    doc = commands.add_parser(
        "doctor", help="check a cluster for what makes multi-node jobs fail or hang",
        description="Check every host and every pair: SSH, python/torch versions, GPUs/NCCL, name "
                    "resolution, the address gloo and NCCL advertise, MASTER_ADDR:MASTER_PORT, the "
                    "all-pairs mesh, NAT, address families. Exit 0 only when the cluster can run a job.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _cluster_options(doc)
    doc.add_argument("--master-port", type=int, metavar="PORT", help="check this MASTER_PORT (default: a free one)")
    doc.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="per connection (default 5)")
    doc.add_argument("--json", action="store_true", help="print the diagnosis as JSON")

    down = commands.add_parser("down", help="remove every container, network and volume of a lab")
    _name_option(down)
    down.add_argument("--all", action="store_true", help="remove every lab on the engine")
    down.add_argument("--inventory", metavar="PATH", help="the lab's inventory, beside which `lab up` keeps its "
                      "state (default: as for up)")
    _machines_option(down, "the lab is across the Docker machines of FILE: clean every one, and leave each "
                           "Swarm as lab up found it (default: the file `lab up --machines` was given)")
    net = commands.add_parser("net", help="shape the running lab's links (delay, jitter, loss, rate), or peer its "
                                          "two private networks (cross-vpc)")
    _name_option(net)
    net_commands = net.add_subparsers(dest="net_command", required=True, metavar="WHAT", parser_class=_Parser)
    peering = net_commands.add_parser("peering", help="add or remove the route between the two private networks")
    peering.add_argument("state", choices=("on", "off", "show"))
    shape = net_commands.add_parser(
        "shape", help="give hosts' links a delay, jitter, loss or rate (in place of the shape they had)",
        description="Delay, jitter and loss apply once to each packet a shaped host exchanges with another (a "
                    "round trip grows by the delay of each shaped end, as with tc netem on both), the rate to what "
                    "it sends. A helper container with NET_ADMIN in each host's network namespace sets them (tc tbf "
                    "for the rate, an NFQUEUE for the rest); the hosts stay unprivileged. `lab net clear` takes "
                    "them away, `lab down` too.")
    shape.add_argument("hosts", nargs="*", metavar="HOST", help="node1 node2 ... or all (default: all)")
    shape.add_argument("--delay", metavar="TIME", help="added to every packet: 20ms, 500us, 1s")
    shape.add_argument("--jitter", metavar="TIME", help="each packet's delay varies by up to this, either way")
    shape.add_argument("--loss", metavar="PERCENT", help="the share of packets lost: 0.1%%")
    shape.add_argument("--rate", metavar="RATE", help="what a host sends, at most: 100mbit, 1gbit")
    net_commands.add_parser("show", help="each host's shape")
    clear = net_commands.add_parser("clear", help="take hosts' shapes away")
    clear.add_argument("hosts", nargs="*", metavar="HOST", help="node1 node2 ... or all (default: all)")
    broken = commands.add_parser(
        "break", help="make a classic multi-node failure happen on a lab host, for real (`lab fix` undoes it)",
        epilog="\n".join(f"  {f.kind:18} {f.about}" for f in faults.FAULTS.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _name_option(broken)
    broken.add_argument("kind", choices=faults.KINDS, metavar="KIND", help=", ".join(faults.KINDS))
    broken.add_argument("hosts", nargs="*", metavar="HOST", help="node1 node2 ... or all (default: every host for "
                        "loopback-hostname, as Debian installs them; node1, MASTER_ADDR's host, for slow-dns and "
                        "port-taken; node2 otherwise)")
    broken.add_argument("--port", type=int, default=faults.DEFAULT_PORT, metavar="PORT",
                        help=f"port-taken: the port to hold (default {faults.DEFAULT_PORT}, the tutorials')")
    fixed = commands.add_parser("fix", help="undo `lab break`: every fault on every host, or one kind")
    _name_option(fixed)
    fixed.add_argument("kind", nargs="?", choices=faults.KINDS, metavar="KIND", help="default: every kind")
    fixed.add_argument("hosts", nargs="*", metavar="HOST", help="node1 node2 ... or all (default: all)")
    status = commands.add_parser("status", help="show each lab host, its addresses and whether sshd answers "
                                                "(and, with Slurm, each node's state and munge key)")
    _name_option(status)
    status.add_argument("--inventory", metavar="PATH", help="the lab's inventory, beside which `lab up` keeps its "
                        "state (default: as for up)")
    _machines_option(status, "the lab is across the Docker machines of FILE (default: the file `lab up "
                             "--machines` was given)")
    commands.add_parser("ls", help="list the labs on the Docker engine: name, topology, hosts, slots, state")
    return parser


def _lab_paths(args: argparse.Namespace) -> LabPaths:
    return LabPaths(Path(args.inventory or default_inventory(args.name)).resolve(), args.name)


def _machines_file(args: argparse.Namespace) -> str | None:
    """--machines, else the machines file `lab up --machines` recorded for the lab (None: the lab
    is on this machine's engine)."""
    return args.machines or spread.recorded_machines(_lab_paths(args))


ACROSS_MACHINES_HINT = ("a lab across machines is found beside its inventory: give its --inventory, or its "
                        "--machines file")


def _machines_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, about: str) -> None:
    parser.add_argument("--machines", metavar="FILE", help=about)


def _name_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=DEFAULT_LAB, type=_lab_name, metavar="NAME",
                        help=f"which lab: labs of different names stand side by side on one engine "
                             f"(default {DEFAULT_LAB})")


def _lab_name(text: str) -> str:
    try:
        return check_lab_name(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--name {text!r}: ")) from None


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    """Which cluster: the hosts of an inventory, or the local cluster of --nproc ranks."""
    parser.add_argument("--hosts", metavar="INVENTORY", help="an Ansible-style YAML inventory, or 'slurm': the "
                        "nodes of the Slurm allocation the lab runs in (salloc, sbatch); without it: the local "
                        "cluster, --nproc processes on this machine")
    parser.add_argument("--nproc", type=int, default=4, metavar="N", help="ranks of the local cluster (default 4)")
    parser.add_argument("--accept-new-host-keys", action="store_true",
                        help="trust SSH host keys not yet in known_hosts (and record them)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the lab does (and the "
                        "inventory's variables it ignores)")


def _launcher_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--launcher", choices=LAUNCHERS,
                        help="who starts the ranks: lab (each rank, the settings in its environment, "
                             "forked from one process per host that imported torch once), "
                             "torchrun (one per host: c10d rendezvous on rank 0's host, torchrun numbers "
                             "the ranks), spawn (one process per host that mp.spawns its ranks), "
                             "srun (the ranks are the tasks of one Slurm job, started by srun on the first "
                             "host), srun-torchrun (srun starts one torchrun per node, as the tutorials' "
                             "`srun torchrun`) (default lab; srun with --hosts slurm)")
    parser.add_argument("--partition", metavar="NAME", help="the Slurm partition (--launcher srun and "
                        "srun-torchrun; default: the cluster's default partition)")


def _cluster(args: argparse.Namespace) -> Inventory:
    """The hosts of ``--hosts`` (``slurm``: the allocation's nodes), or the local cluster of ``--nproc`` ranks."""
    if args.hosts == ALLOCATION:
        return allocation_inventory(os.environ, sys.executable)
    if args.hosts:
        return load_inventory(args.hosts)
    return local_inventory(args.nproc, gpus=local_gpu_count() if args.nproc >= 1 else 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
                        format="lab: %(message)s")
    # Ctrl-C and SIGTERM stop every rank on every host, whatever this process inherited: a shell
    # that starts it in the background (and many CI runners) ignores SIGINT for it.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "list": cmd_list, "run": cmd_run, "launch": cmd_launch, "doctor": cmd_doctor,
        "grade": cmd_grade, "bench": cmd_bench, "submit": cmd_submit, "up": cmd_up, "down": cmd_down,
        "status": cmd_status, "net": cmd_net, "ls": cmd_ls, "break": cmd_break, "fix": cmd_fix}
    try:
        return commands[args.command](args)
    except LabError as exc:
        for line in str(exc).splitlines():
            print(f"lab: error: {printable(line)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as exc:  # a bug: one line here, the whole traceback in the debug log
        written = write_debug_log(traceback.format_exc())
        if written is None:  # nowhere private to write it: here, then
            traceback.print_exc()
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"lab: internal error: {type(exc).__name__}: {printable(str(exc))} "
              f"({Path(frame.filename).name}:{frame.lineno}; full traceback "
              f"{f'in {written}' if written else 'above'})", file=sys.stderr)
        return ExitCode.RUN_ERROR


def debug_log_path() -> Path:
    """Where the traceback of an internal error goes: ``$XDG_STATE_HOME/lab/debug.log``, else
    ``~/.local/state/lab/debug.log``."""
    state = os.environ.get("XDG_STATE_HOME", "")
    return (Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state") / "lab" / "debug.log"


def write_debug_log(text: str) -> Path | None:
    """Write ``text`` where only this user can read it: ``debug_log_path()`` (the file 0600, its
    directory 0700 and the user's), else ``lab-UID/debug.log`` in the temp directory (0700, the
    user's). The file is written anew and renamed into place, so whatever was there (a symlink,
    someone else's file) is replaced, never followed; a directory that is a symlink or someone
    else's is not used. Where it went; None when it could go nowhere."""
    for directory in (debug_log_path().parent, Path(tempfile.gettempdir()) / f"lab-{os.getuid()}"):
        try:
            return _write_private(directory, "debug.log", text)
        except OSError:
            continue
    return None


def _write_private(directory: Path, name: str, text: str) -> Path:
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise PermissionError(f"{directory}: not a directory of this user's")
    if stat.S_IMODE(found.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.")  # 0600, a new file
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return directory / name


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cmd_list(args: argparse.Namespace) -> int:
    width = max(map(len, registry.EXERCISES))
    for exercise in registry.EXERCISES.values():
        print(f"{exercise.name:{width}}  {exercise.summary}")
    return ExitCode.OK


def cmd_run(args: argparse.Namespace) -> int:
    options = _options(args)
    inventory = _cluster(args)
    if "all" in args.exercises:
        options, left_out = without_unshared(options, inventory.hosts)
        for e in left_out:
            print(f"lab: {e.name} is left out of `run all`: its file:// rendezvous needs a directory every host "
                  f"mounts, and these hosts share none (shared_dir); `run {e.name}` runs it anyway", file=sys.stderr)
    if args.dry_run:  # a dry run stays offline: it shows the addresses as given
        print(yaml.safe_dump(build_plan(inventory, options).to_dict(), sort_keys=False), end="")
        return ExitCode.OK
    inventory = with_master_address(inventory, _ssh_settings(args))
    if any(e.name == "cross-vpc" for e in options.exercises):
        return _run_cross_vpc(inventory, options, args)
    return run_and_report(inventory, options, _ssh_settings(args), Console(stderr=args.json, highlight=False),
                          json_out=args.json, junit=args.junit, keep=args.keep)


def run_and_report(inventory: Inventory, options: Options, settings: SSHSettings, console: Console,
                   json_out: bool = False, junit: str | None = None, keep: bool = False) -> int:
    """Run the exercises, check them, report; the exit code."""
    plan = build_plan(inventory, options)
    outcome = run_plan(plan, on_line=LineStreamer(console), keep=keep, ssh=settings)
    reports = judge(outcome)
    code = exit_code(outcome, reports)
    causes = explain_hang(inventory, settings, outcome.master_port) if hung_at_start(outcome) else []
    printed = run_causes(outcome, reports)
    if junit:
        Path(junit).write_bytes(to_junit(outcome, reports))
    if json_out:
        print(json.dumps({**to_json(outcome, reports, code), "likely_causes": causes, "known_errors": printed},
                         indent=2))
    else:
        print_report(console, outcome, reports)
        _print_causes(console, "likely cause (from `python -m lab doctor`):", causes)
        _print_causes(console, "what the ranks printed means:", printed)
    return code


def _print_causes(console: Console, title: str, causes: list[str]) -> None:
    if causes:
        console.print(Text(title, style="bold yellow"))
        for line in causes:
            console.print(Text(f"  {printable(line)}"), soft_wrap=True)


def _run_cross_vpc(inventory: Inventory, options: Options, args: argparse.Namespace) -> int:
    """The tutorial's failure on the cross-VPC lab, the diagnosis, then the fix (lab.doctor.scenario)."""
    if len(options.exercises) != 1:
        raise UsageError("cross-vpc runs alone: name no other exercise with it")
    console = Console(stderr=args.json, highlight=False)
    result = run_scenario(inventory, options, _ssh_settings(args), LineStreamer(console), _sayer(console),
                          lambda diagnosis: print_diagnosis(console, diagnosis), keep=args.keep)
    if args.json:
        print(json.dumps({"passed": result.passed, "steps": [asdict(step) for step in result.steps],
                          "diagnosis": result.diagnosis.to_json()}, indent=2))
    else:
        console.print()
        for step in result.steps:
            status = "pass" if step.passed else "fail"
            line = Text(f"{status.upper():8}", style=STATUS_STYLES[status])
            line.append(printable(f"{step.what}: {step.detail}"))
            console.print(line, soft_wrap=True)
        console.print(Text(f"cross-vpc {'passed' if result.passed else 'failed'}", style="bold"))
    return ExitCode.OK if result.passed else ExitCode.CHECK_FAILED


def cmd_grade(args: argparse.Namespace) -> int:
    request = GradeRequest(_one_exercise(args.exercise), args.parallel, args.timeout, args.wall, args.hosts,
                           args.nproc, args.sandbox, Limits(args.memory, args.pids), args.backend)
    request.check()
    submissions = find_submissions(Path(args.submissions), request.exercise.program.rsplit(".", 1)[-1])
    settings = _ssh_settings(args)
    book = Gradebook(Path(args.out))
    console = Console(highlight=False)
    with places_for(request, settings, _sayer(console), partial(_working, console)) as places:
        if places.one_user_hosts:
            console.print(f"note: {', '.join(places.one_user_hosts)} name no grade_users: the submissions graded "
                          "at once there run as one user and can read each other's run files", style="yellow")
        grades = _grade_with_progress(console, request.exercise.name, len(submissions),
                                      lambda graded: grade_all(submissions, request.options(), places.makers, book,
                                                               settings, request.wall, on_graded=graded))
    csv_path = book.write_csv(grades)
    print_gradebook(console, grades)
    console.print(Text(f"wrote {csv_path} and {len(grades)} JUnit file(s) in {book.out / 'junit'}"))
    failed = [g for g in grades if not g.graded]
    return failed[0].exit_code if failed else ExitCode.OK


@contextlib.contextmanager
def _working(console: Console, what: str) -> Iterator[Callable[[str], None]]:
    with console.status(what, spinner="dots") as status:
        yield lambda line: status.update(Text(line[:100], style="dim"))


def _grade_with_progress(console: Console, exercise: str, submissions: int,
                         grading: Callable[[Callable[[Grade], None]], list[Grade]]) -> list[Grade]:
    columns = (SpinnerColumn(), TextColumn("grading {task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(exercise, total=submissions)

        def graded(g: Grade) -> None:
            progress.console.print(Text(f"{g.verdict.upper():8}", style=GRADE_STYLES[g.verdict])
                                   + Text(printable(f"{g.student}  {g.seconds:.1f}s  {g.reason}")), soft_wrap=True)
            progress.advance(task)

        return grading(graded)


GRADE_STYLES = {"pass": "bold green", "fail": "bold red", "timeout": "bold red", "error": "yellow"}


def print_gradebook(console: Console, grades: list[Grade]) -> None:
    """The grades as a table, by student, and the count of each verdict (names and reasons as
    Text: a str cell would be read as rich markup)."""
    table = Table("student", "verdict", "score", "seconds", "reason (whole in grades.csv)")
    rows = [(Text(printable(g.student)), Text(g.verdict, style=GRADE_STYLES[g.verdict]), Text(f"{g.score:g}"),
             Text(f"{g.seconds:.1f}"), Text(printable(g.reason))) for g in sorted(grades, key=lambda g: g.student)]
    # the reason takes what the other columns leave (unbounded, a long one would squeeze them out)
    widths = [max([len(str(column.header)), *(row[i].cell_len for row in rows)])
              for i, column in enumerate(table.columns[:-1])]
    reason = table.columns[-1]
    reason.no_wrap, reason.overflow = True, "ellipsis"
    reason.max_width = max(20, console.width - sum(widths) - 3 * len(table.columns) - 1)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    counts = {v: sum(g.verdict == v for g in grades) for v in GRADE_STYLES}
    console.print(f"{len(grades)} graded: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n))


def _one_exercise(name: str) -> registry.Exercise:
    if name not in registry.EXERCISES:
        raise UsageError(f"unknown exercise {name!r}; see 'python -m lab list'")
    return registry.EXERCISES[name]


def cmd_up(args: argparse.Namespace) -> int:
    if args.peering and args.topology != "cross-vpc":
        raise UsageError("--peering is for --topology cross-vpc")
    if args.machines:
        return _up_across_machines(args)
    if args.network != "overlay" or args.accept_new_host_keys:
        raise UsageError("--network and --accept-new-host-keys are for a lab across --machines")
    if (recorded := _machines_file(args)) is not None:
        raise UsageError(f"lab {args.name} is across the machines of {recorded}: `python -m lab down --name "
                         f"{args.name}` first, or give this lab another --name")
    topology = Topology(args.hosts or 4, args.slots, args.topology, args.name,  # checked before anything starts
                        scheduler=args.scheduler)
    console = Console(highlight=False)
    say = _sayer(console)
    request = UpRequest(topology, Path(args.inventory or default_inventory(args.name)), args.base, args.gpus,
                        args.peering, HostLimits(args.memory, args.pids))
    with console.status("starting the lab", spinner="dots") as spinner:
        inventory = bring_up(request, say, lambda line: spinner.update(Text(line[:100], style="dim")))
    if args.no_smoke:
        return ExitCode.OK
    if topology.kind == "cross-vpc" and not args.peering:
        say("no smoke check: without peering the mesh cannot form (that is the point); "
            f"see `python -m lab run cross-vpc --hosts {inventory}`")
        return ExitCode.OK
    say("smoke check: p2p across the hosts")
    return run_and_report(load_inventory(inventory), Options(tuple(registry.select(["p2p"]))), SSHSettings(), console)


def _up_across_machines(args: argparse.Namespace) -> int:
    if args.topology != "plain" or args.scheduler != "none":
        raise UsageError("--machines starts a plain lab: the machines' network is the topology, and Slurm "
                         "across machines is not supported yet")
    console = Console(highlight=False)
    request = spread.SpreadRequest(args.machines, args.name, Path(args.inventory or default_inventory(args.name)),
                                   args.hosts, args.slots, args.network, args.base, args.gpus,
                                   HostLimits(args.memory, args.pids))
    with console.status("starting the lab across machines", spinner="dots") as spinner:
        inventory = spread.bring_up(request, _ssh_settings(args), _sayer(console),
                                    lambda line: spinner.update(Text(line[:100], style="dim")))
    if args.no_smoke:
        return ExitCode.OK
    _sayer(console)("smoke check: p2p across the hosts")
    return run_and_report(load_inventory(inventory), Options(tuple(registry.select(["p2p"]))), SSHSettings(), console)


def cmd_down(args: argparse.Namespace) -> int:
    say = _sayer(Console(highlight=False))
    machines = None if args.all and not args.machines else _machines_file(args)
    if machines:
        if args.all:
            raise UsageError("--all is for the labs on this machine's engine; name the lab with --name")
        removed = spread.bring_down(machines, args.name, SSHSettings(), say)
        _lab_paths(args).machines_record.unlink(missing_ok=True)
        say(f"lab {args.name} is down on every machine ({removed} removed)" if removed else
            f"lab {args.name}: nothing to remove on the machines")
        return ExitCode.OK
    removed = hosts.down(engine.client(), say, None if args.all else args.name)
    which = "every lab" if args.all else f"lab {args.name}"
    say(f"{which} is down ({removed} removed)" if removed else
        f"{which}: nothing to remove on this machine's engine" + ("" if args.all else f" ({ACROSS_MACHINES_HINT})"))
    return ExitCode.OK


def cmd_launch(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"{args.script}: no such script")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    settings = _ssh_settings(args)
    inventory = with_master_address(_cluster(args), settings)
    console = Console(highlight=False)
    plan = build_launch_plan(inventory, str(script.resolve()), args.args, args.timeout, _launcher(args),
                             partition=args.partition)
    outcome = run_plan(plan, on_line=LineStreamer(console), keep=args.keep, ssh=settings)
    failed = [s for s in outcome.ranks if not s.done]
    console.print()
    for s in failed:
        why = (f"stopped after {plan.timeout:g}s" + (f" at {s.stopped_at}" if s.stopped_at else "")
               if s.spec.rank in outcome.hung else ended(s.exit_code))
        console.print(Text(f"rank {s.spec.rank} ({s.spec.host}) {why}", style="red"), soft_wrap=True)
    console.print(Text(f"{script.name}: {plan.world_size - len(failed)} of {plan.world_size} ranks succeeded "
                       f"in {outcome.seconds:.1f}s ({outcome.status})", style="bold"), highlight=False)
    _print_causes(console, "what the ranks printed means:", printed_causes(failed))
    if outcome.status == "interrupted":
        return ExitCode.INTERRUPTED
    if outcome.status == "timeout":
        return ExitCode.TIMEOUT
    return ExitCode.OK if not failed else ExitCode.CHECK_FAILED


def cmd_bench(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    for option, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{option} {path}: no such directory")
    if args.plot:
        bench.check_plotting()
    ops, solution = bench.parse_ops(args.ops or "all"), None
    if args.solution:
        solution = _solution_file(args.solution)
        ops = bench.solution_ops(ops, bench.solution_rings(Path(solution)), args.ops is not None)
    env = bench.rank_env(ops, bench.parse_sizes(args.sizes), args.iters, args.warmup)
    options = Options((registry.EXERCISES["bench"],), args.backend, "env", args.timeout, solution,
                      launcher=_launcher(args), partition=args.partition, rank_env=env)
    settings = _ssh_settings(args)
    inventory = with_master_address(_cluster(args), settings)
    console = Console(stderr=args.json, highlight=False)
    console.width = max(console.width, 100)  # (the table's numbers whole, never cut, on a narrow terminal too)
    with console.status(f"timing {','.join(ops)} on {inventory.world_size} ranks", spinner="dots"):
        outcome = run_plan(build_plan(inventory, options), on_line=LineStreamer(console), ssh=settings)
    reports = judge(outcome)
    code = exit_code(outcome, reports)
    if code != ExitCode.OK:  # (the run's own report says what went wrong, and where)
        print_report(console, outcome, reports)
        return code
    results, ranks = outcome.exercises["bench"].results, outcome.plan.world_size
    rows, tcp = bench.rows(results, ranks), bench.baseline(results)
    fitted = bench.fit(rows)
    notes = next(r.notes for r in reports if r.name == "bench")  # (what the rings sent, with a solution's)
    title = f"{ranks} ranks, {outcome.plan.backend}" + (f", rings of {Path(solution).name}" if solution else "")
    if args.csv:
        Path(args.csv).write_text(bench.csv_text(rows, tcp))
    if args.plot:
        bench.plot(rows, tcp, Path(args.plot), title)
    if args.json:
        print(json.dumps({"ranks": ranks, "backend": outcome.plan.backend, "rows": [row.to_json() for row in rows],
                          "tcp": tcp.to_json() if tcp else None,
                          "fit": fitted.to_json(ranks) if fitted else None, "notes": list(notes)}, indent=2))
        return code
    _print_bench(console, title, rows, tcp)
    if fitted is not None:
        _print_model(console, fitted, rows, ranks)
    for note in notes:
        console.print(Text(f"note: {printable(note)}"))
    return code


def _print_bench(console: Console, title: str, rows: list[bench.Row], tcp: bench.Baseline | None) -> None:
    """nccl-tests' table, with each op's busbw as a share of raw TCP's when the ranks measured it."""
    table = Table("op", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
                  *(("of tcp",) if tcp else ()), box=box.SIMPLE_HEAD,
                  title=f"{title}: size in bytes, time in us, algbw and busbw in GB/s")
    for column in table.columns:
        column.no_wrap = True
        column.justify = "left" if column.header in ("op", "type", "redop") else "right"
    for row in rows:
        timed = row.seconds is not None
        busbw = row.busbw if timed else None
        table.add_row(row.op, f"{row.bytes}", f"{row.count}", "float", bench.REDOPS.get(row.op, "none"),
                      f"{row.seconds * 1e6:.1f}" if row.seconds is not None else "n/a",
                      f"{row.algbw:.3f}" if timed and row.algbw is not None else "n/a",
                      f"{busbw:.3f}" if busbw is not None else "n/a", str(row.wrong),
                      *((f"{busbw / tcp.gbs:.0%}" if busbw is not None else "n/a",) if tcp else ()))
    console.print(table)
    if tcp is not None:
        console.print(f"raw TCP, {tcp.hosts[1]} -> {tcp.hosts[0]}: {tcp.gbs:.3f} GB/s in one stream, "
                      f"round trip {tcp.rtt * 1e6:.0f} us")


def _print_model(console: Console, fitted: bench.Fit, rows: list[bench.Row], ranks: int) -> None:
    """The alpha-beta fit of the p2p sweep, and the two rings' times as it predicts them."""
    console.print(f"p2p fit, t = alpha + S*beta: alpha = {fitted.alpha * 1e6:.1f} us, beta = {fitted.beta * 1e9:.3f} "
                  f"ns/byte ({1 / fitted.beta / 1e9 if fitted.beta else float('inf'):.3f} GB/s)")
    measured = {(row.op, row.bytes): row.seconds for row in rows if row.seconds}
    timed = [op for op in ("ring", "chunked_ring", "all_reduce") if any(o == op for o, _ in measured)]
    table = Table("size", "tutorial's ring", "chunked ring", *(f"{op} measured" for op in timed),
                  box=box.SIMPLE_HEAD, title=f"ring all-reduce on {ranks} ranks as the fit predicts it (us): "
                                             "(n-1)(alpha+S*beta) and 2(n-1)(alpha+S*beta/n)")
    for column in table.columns:
        column.justify = "right"
    for size in sorted({row.bytes for row in rows if row.op == "p2p"}):
        times = [measured.get((op, size)) for op in timed]
        table.add_row(str(size), f"{fitted.ring(size, ranks) * 1e6:.1f}",
                      f"{fitted.chunked_ring(size, ranks) * 1e6:.1f}",
                      *(f"{seconds * 1e6:.1f}" if seconds else "n/a" for seconds in times))
    console.print(table)
    crossover = fitted.crossover(ranks)
    if crossover:
        console.print(f"the chunked ring wins above {crossover:.0f} bytes: alpha / (beta (1 - 2/n))")
    elif ranks <= 2:
        console.print(f"on {ranks} ranks the chunked ring never wins: as many bytes, in more messages")
    else:
        console.print("the fit found no cost per byte (the sizes are too small to show one): time larger sizes "
                      "to see where the chunked ring wins")


def cmd_submit(args: argparse.Namespace) -> int:
    _exercises(args.exercises)  # (checked here: the job runs them)
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    run_args = (*args.exercises, "--timeout", f"{args.timeout:g}",
                *(("--launcher", args.launcher) if args.launcher else ()))
    job = slurm_jobs.BatchJob(run_args, args.nodes, args.ntasks_per_node, args.time, args.partition)
    out = Path(args.out)
    say = _sayer(Console(highlight=False, stderr=True))
    job_id, code = slurm_jobs.submit(job, out, args.wait, lambda job_id: say(
        f"submitted batch job {job_id}: its report goes to {out / f'slurm-{job_id}.out'}"))
    if code is None:
        return ExitCode.OK
    output = slurm_jobs.job_output(out, job_id)
    print(output, end="")
    if slurm_jobs.ran_out_of_time(output):
        limit = args.time or "the partition's"
        raise slurm_jobs.SlurmError(f"job {job_id}: Slurm stopped it at its time limit ({limit})", ExitCode.TIMEOUT)
    return code


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    settings = _ssh_settings(args)
    diagnosis = diagnose(with_master_address(_cluster(args), settings), settings,
                         master_port=args.master_port, timeout=args.timeout)
    if args.json:
        print(json.dumps(diagnosis.to_json(), indent=2))
    else:
        print_diagnosis(Console(highlight=False), diagnosis)
    return diagnosis.exit_code


def cmd_net(args: argparse.Namespace) -> int:
    wanted = shaping.parse_shape(args.delay, args.jitter, args.loss, args.rate) if args.net_command == "shape" else None
    client = engine.client()
    topology = hosts.running_topology(client, args.name)
    say = _sayer(Console(highlight=False))
    if args.net_command == "peering":
        if args.state != "show":
            crossvpc.set_peering(client, topology, args.state == "on")
        say(f"lab {args.name}: peering is {'on' if crossvpc.peering(client, topology) else 'off'}")
    elif wanted is not None:
        shaping.shape(client, topology, shaping.host_indices(topology, args.hosts), wanted, say)
    elif args.net_command == "clear":
        shaping.clear(client, topology, shaping.host_indices(topology, args.hosts), say)
    else:
        for host, shape in shaping.shapes(client, topology).items():
            print(f"{host}: {shape or 'none'}")
    return ExitCode.OK


def cmd_break(args: argparse.Namespace) -> int:
    client = engine.client()
    topology = hosts.running_topology(client, args.name)
    fault = faults.FAULTS[args.kind]
    default = [name for name in fault.default_hosts if name in map(topology.name, topology.indices())] or ["all"]
    indices = shaping.host_indices(topology, args.hosts or default)
    faults.break_hosts(client, topology, args.kind, indices, args.port)
    _sayer(Console(highlight=False))(f"{', '.join(topology.name(i) for i in indices)}: broken: {fault.about}; a job "
                                     f"shows: {fault.shows} (`lab fix {args.kind}` mends it)")
    return ExitCode.OK


def cmd_fix(args: argparse.Namespace) -> int:
    client = engine.client()
    topology = hosts.running_topology(client, args.name)
    faults.fix(client, topology, [args.kind] if args.kind else faults.KINDS,
               shaping.host_indices(topology, args.hosts), _sayer(Console(highlight=False)))
    return ExitCode.OK


def cmd_status(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    machines = _machines_file(args)
    if machines:
        return _status_across_machines(console, machines, args.name)
    found = hosts.status(engine.client(), args.name)
    if not found:
        start = "`make lab-up`" if args.name == DEFAULT_LAB else f"`python -m lab up --name {args.name}`"
        console.print(f"no lab named {args.name} is running on this machine's engine; start one with {start} "
                      f"({ACROSS_MACHINES_HINT})")
        return ExitCode.OK
    table = Table("container", "hostname", "state", "addresses", "ssh")
    for h in found:
        table.add_row(h.container, h.hostname, h.state, ", ".join(h.addresses),
                      Text("answers", style="green") if h.ssh else Text("no answer", style="red"))
    console.print(table)
    problems = _slurm_status(console, args) if found[0].scheduler == "slurm" else ()
    for problem in problems:
        console.print(Text(f"lab: {problem}", style="red"))
    return ExitCode.OK if all(h.ssh for h in found) and not problems else ExitCode.UNREACHABLE


def _status_across_machines(console: Console, machines: str, lab: str) -> int:
    found, lost = spread.status(machines, lab, SSHSettings())
    table = Table("machine", "container", "state", "ssh at", "data address", "ssh")
    for h in found:
        table.add_row(h.machine, h.container, h.state, h.ssh_at, h.data_address,
                      Text("answers", style="green") if h.ssh else Text("no answer", style="red"))
    console.print(table if found else f"no host of lab {lab} on the machines that answered")
    for error in lost:
        console.print(Text(f"lab: {error}", style="red"))
    return ExitCode.OK if found and all(h.ssh for h in found) and not lost else ExitCode.UNREACHABLE


def _slurm_status(console: Console, args: argparse.Namespace) -> tuple[str, ...]:
    """The lab's Slurm cluster: a row per node, and its problems."""
    topology = hosts.running_topology(engine.client(), args.name)
    health = slurm.health(topology, _lab_paths(args))
    table = Table("slurm node", "state", "munge key")
    for node, same in health.keys.items():
        state = health.states.get(node, "?")
        table.add_row(node, Text(state, style="green" if state in WORKING else "red"),
                      Text({True: "the lab's", False: "another", None: "?"}[same],
                           style="green" if same else "red"))
    console.print(table)
    return health.problems


def cmd_ls(args: argparse.Namespace) -> int:
    console = Console(highlight=False)
    found = hosts.labs(engine.client())
    across = {lab: record.read_text().strip() for lab in _recorded_labs()
              if (record := LabPaths(Path(default_inventory(lab)).resolve(), lab).machines_record).is_file()}
    if not found and not across:
        console.print("no lab is running; start one with `make lab-up` or `python -m lab up --name NAME`")
        return ExitCode.OK
    if found:
        table = Table("name", "topology", "scheduler", "hosts", "slots", "state", "subnets", "inventory")
        for lab in found:
            table.add_row(lab.name, lab.kind, lab.scheduler, str(lab.hosts), str(lab.slots),
                          Text(lab.state, style="green" if lab.state == "running" else "yellow"),
                          ", ".join(lab.subnets), default_inventory(lab.name))
        console.print(table)
    if across:
        table = Table("name", "machines", "inventory", title="labs across Docker machines (their state: "
                      "`python -m lab status --name NAME`)", title_justify="left")
        for name, machines in sorted(across.items()):
            table.add_row(name, machines, default_inventory(name))
        console.print(table)
    return ExitCode.OK


def _recorded_labs() -> list[str]:
    """The labs whose state is under this directory's .lab/ (see state_subdir)."""
    labs = Path(".lab/labs")
    return [DEFAULT_LAB, *sorted(d.name for d in labs.iterdir() if d.is_dir())] if labs.is_dir() else [DEFAULT_LAB]


def _ssh_settings(args: argparse.Namespace) -> SSHSettings:
    return SSHSettings(accept_new_host_keys=args.accept_new_host_keys)


def _sayer(console: Console) -> Callable[[str], None]:
    return lambda message: console.print(Text(f"lab: {printable(message)}"), highlight=False)


def _exercises(names: list[str]) -> tuple[registry.Exercise, ...]:
    try:
        return tuple(registry.select(names))
    except KeyError as exc:
        raise UsageError(f"unknown exercise {exc.args[0]!r}; see 'python -m lab list'") from None


def _options(args: argparse.Namespace) -> Options:
    exercises = _exercises(args.exercises)
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    solution = _solution_file(args.solution) if args.solution else None
    return Options(exercises, args.backend, args.init, args.timeout, solution, _launcher(args),
                   partition=args.partition)


def _solution_file(text: str) -> str:
    path = Path(text)
    if path.suffix != ".py" or not path.is_file():
        raise UsageError(f"--solution {text}: not a readable .py file")
    return str(path.resolve())


def _launcher(args: argparse.Namespace) -> Launcher:
    """``--launcher``, else srun on the nodes of a Slurm allocation, else the lab's own."""
    return args.launcher or ("srun" if args.hosts == ALLOCATION else "lab")
