"""``python -m lab``: the only module that prints to the user or exits."""
from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Iterator, NoReturn, Sequence

import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import cluster, crossvpc, doctor, engine, image, scenarios, suite
from .errors import ExitCode, LabError, UsageError
from .image import DEFAULT_BASE, OFFLINE
from .inventory import Inventory, load_inventory, local_inventory
from .judge import exit_code, hung_at_start, judge
from .plan import (
    BACKENDS,
    DEFAULT_TIMEOUT,
    INIT_METHODS,
    LAUNCHERS,
    Options,
    Plan,
    Resources,
    build_launch_plan,
    build_plan,
    ports_needed,
)
from .ports import reserved_ports
from .report import STATUS_STYLES, LineStreamer, print_report, to_json, to_junit
from .runner import run_plan
from .transport import with_master_address
from .transport.ssh import SSHSettings

DEBUG_LOG = Path(tempfile.gettempdir()) / "lab-debug.log"

EXIT_CODES = """\
exit codes:
  0    every check passed
  1    a check failed (a wrong result, or an exercise raised or crashed)
  2    bad usage or bad input (command line, inventory)
  3    a host could not be reached
  4    a rank did not finish a step within --timeout and was stopped
  5    the run itself broke (a rank could not start or died outside any exercise)
  130  interrupted (Ctrl-C or SIGTERM); every rank was stopped"""


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
                     "reference program (one exercise) and check it the same way")
    run.add_argument("--json", action="store_true", help="print the results as JSON on stdout "
                     "(rank output goes to stderr)")
    run.add_argument("--junit", metavar="FILE.xml", help="also write the results as JUnit XML (for grading in CI)")
    run.add_argument("--dry-run", action="store_true", help="print the plan as YAML and exit")
    run.add_argument("--keep", action="store_true", help="keep the run directory on every host")
    run.add_argument("-v", "--verbose", action="store_true", help="log what the lab does")

    up = commands.add_parser(
        "up", help="build the lab image and start the container lab, write its inventory, smoke-test it",
        description="Start a lab of hosts (containers with their own addresses and sshd) on the local "
                    "Docker engine, write the inventory for it, and run the p2p exercise across them.")
    up.add_argument("--hosts", type=int, default=4, metavar="N", help="hosts in the lab (default 4)")
    up.add_argument("--slots", type=int, default=1, metavar="S", help="ranks per host in the inventory (default 1)")
    up.add_argument("--topology", choices=cluster.TOPOLOGIES, default="plain",
                    help="plain: one network; cross-vpc: two private networks joined only through a NAT "
                         "gateway, like two cloud VPCs (default plain)")
    up.add_argument("--peering", action="store_true", help="cross-vpc: route between the private networks")
    up.add_argument("--base", default=DEFAULT_BASE, metavar="IMAGE",
                    help=f"base image (default {DEFAULT_BASE}); '{OFFLINE}' builds a Debian base with "
                         f"debootstrap, as happens when the base cannot be pulled")
    up.add_argument("--gpus", choices=("auto", "all", "none"), default="auto",
                    help="give the hosts the engine's GPUs (needs the NVIDIA container toolkit; "
                         "auto: when the engine has the nvidia runtime)")
    up.add_argument("--inventory", default="inventory.yaml", metavar="PATH",
                    help="where to write the lab's inventory (default inventory.yaml)")
    up.add_argument("--no-smoke", action="store_true", help="skip the p2p run across the hosts")

    launch = commands.add_parser(
        "launch", help="run any script on every rank with the rendezvous injected (torchrun across hosts)",
        description="Run SCRIPT on every rank of the cluster with MASTER_ADDR, MASTER_PORT, RANK, "
                    "WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE in its environment, set by the lab, by "
                    "torchrun or by mp.spawn on each host (--launcher), across the hosts of an inventory. "
                    "The tutorials' torchrun scripts run unchanged.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _cluster_options(launch)
    _launcher_option(launch)
    launch.add_argument("--timeout", type=float, metavar="SECONDS", help="stop the job when it runs longer "
                        "(default: no limit)")
    launch.add_argument("--keep", action="store_true", help="keep the run directory on every host")
    launch.add_argument("script", metavar="SCRIPT.py", help="the script every rank runs")
    launch.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")

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

    commands.add_parser("down", help="remove every container, network and volume of the lab")
    net = commands.add_parser("net", help="change the running lab's network (cross-vpc)")
    net_commands = net.add_subparsers(dest="net_command", required=True, metavar="WHAT", parser_class=_Parser)
    peering = net_commands.add_parser("peering", help="add or remove the route between the two private networks")
    peering.add_argument("state", choices=("on", "off", "show"))
    commands.add_parser("status", help="show each lab host, its addresses and whether sshd answers")
    return parser


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    """Which cluster: the hosts of an inventory, or the local cluster of --nproc ranks."""
    parser.add_argument("--hosts", metavar="INVENTORY", help="an Ansible-style YAML inventory; "
                        "without it: the local cluster, --nproc processes on this machine")
    parser.add_argument("--nproc", type=int, default=4, metavar="N", help="ranks of the local cluster (default 4)")
    parser.add_argument("--accept-new-host-keys", action="store_true",
                        help="trust SSH host keys not yet in known_hosts (and record them)")


def _launcher_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--launcher", choices=LAUNCHERS, default="lab",
                        help="who starts the ranks: lab (each rank, the settings in its environment), "
                             "torchrun (one per host: c10d rendezvous on rank 0's host, torchrun numbers "
                             "the ranks), spawn (one process per host that mp.spawns its ranks) (default lab)")


def _cluster(args: argparse.Namespace) -> Inventory:
    return load_inventory(args.hosts) if args.hosts else _local_cluster(args.nproc)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.WARNING,
                        format="lab: %(message)s")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        command = {"list": lambda: cmd_list(), "run": lambda: cmd_run(args), "up": lambda: cmd_up(args),
                   "down": lambda: cmd_down(), "status": lambda: cmd_status(),
                   "net": lambda: cmd_net(args), "doctor": lambda: cmd_doctor(args), "launch": lambda: cmd_launch(args)}[args.command]
        return command()
    except LabError as exc:
        print(f"lab: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("lab: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except Exception as exc:  # a bug: one line here, the whole traceback in the debug log
        DEBUG_LOG.write_text(traceback.format_exc())
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"lab: internal error: {type(exc).__name__}: {exc} "
              f"({Path(frame.filename).name}:{frame.lineno}; full traceback in {DEBUG_LOG})", file=sys.stderr)
        return ExitCode.RUN_ERROR


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def cmd_list() -> int:
    width = max(map(len, suite.EXERCISES))
    for exercise in suite.EXERCISES.values():
        print(f"{exercise.name:{width}}  {exercise.summary}")
    return ExitCode.OK


def cmd_run(args: argparse.Namespace) -> int:
    options = _options(args)
    inventory = _cluster(args)
    if not args.dry_run:  # a dry run stays offline: it shows the addresses as given
        inventory = with_master_address(inventory, _ssh_settings(args))
    if any(e.name == "cross-vpc" for e in options.exercises) and not args.dry_run:
        return _run_cross_vpc(inventory, options, args)
    with planned(inventory, options) as plan:
        if args.dry_run:
            print(yaml.safe_dump(plan.to_dict(), sort_keys=False), end="")
            return ExitCode.OK
        return _run(plan, inventory, args)


@contextmanager
def planned(inventory: Inventory, options: Options) -> Iterator[Plan]:
    """A plan with a fresh run token and free ports, held for as long as it runs."""
    token = secrets.token_hex(6)
    run_dir = os.path.join(tempfile.gettempdir(), f"lab-run-{token}")
    with reserved_ports(ports_needed(options)) as ports:
        yield build_plan(inventory, options, Resources(ports, token, run_dir))


def _run_cross_vpc(inventory: Inventory, options: Options, args: argparse.Namespace) -> int:
    """The tutorial's failure on the cross-VPC lab, the diagnosis, then the fix (lab.scenarios)."""
    if len(options.exercises) != 1:
        raise UsageError("cross-vpc runs alone: name no other exercise with it")
    client = engine.client()
    peered = crossvpc.peering(client)  # also: is this the cross-VPC lab at all?
    console = Console(stderr=args.json, highlight=False)
    say, stream = _sayer(console), LineStreamer(console)
    settings = _ssh_settings(args)
    try:
        say("1/3 peering off: the tutorial's job with MASTER_ADDR = the master's external address")
        crossvpc.set_peering(client, False)
        short = replace(options, timeout=min(options.timeout, scenarios.BROKEN_RUN_TIMEOUT))
        with planned(inventory, short) as plan:
            broken = run_plan(plan, on_line=stream, keep=args.keep, ssh=settings)
        say("2/3 why: the doctor checks every host and pair")
        diagnosis = doctor.diagnose(inventory, settings)
        doctor.print_diagnosis(console, diagnosis)
        for line in scenarios.explain(broken, diagnosis):
            say(line)
        say("3/3 peering on: the same job")
        crossvpc.set_peering(client, True)
        with planned(inventory, options) as plan:
            fixed = run_plan(plan, on_line=stream, keep=args.keep, ssh=settings)
    finally:
        crossvpc.set_peering(client, peered)
    steps = scenarios.judge_scenario(broken, diagnosis, judge(fixed))
    passed = all(step.passed for step in steps)
    if args.json:
        print(json.dumps({"passed": passed, "steps": [asdict(step) for step in steps],
                          "diagnosis": diagnosis.to_json()}, indent=2))
    else:
        console.print()
        for step in steps:
            console.print(Text(f"{'PASS' if step.passed else 'FAIL':8}", style=STATUS_STYLES["pass" if step.passed else "fail"])
                          + Text(f"{step.what}: {step.detail}"), soft_wrap=True)
        console.print(Text(f"cross-vpc {'passed' if passed else 'failed'}", style="bold"))
    return ExitCode.OK if passed else ExitCode.CHECK_FAILED


def _run(plan: Plan, inventory: Inventory, args: argparse.Namespace) -> int:
    console = Console(stderr=args.json, highlight=False)
    settings = _ssh_settings(args)
    outcome = run_plan(plan, on_line=LineStreamer(console), keep=args.keep, ssh=settings)
    reports = judge(outcome)
    code = exit_code(outcome, reports)
    causes = doctor.explain_hang(inventory, settings, plan.master_port) if hung_at_start(outcome) else []
    if args.junit:
        Path(args.junit).write_bytes(to_junit(outcome, reports))
    if args.json:
        print(json.dumps({**to_json(outcome, reports, code), "likely_causes": causes}, indent=2))
    else:
        print_report(console, outcome, reports)
        if causes:
            console.print(Text("likely cause (from `python -m lab doctor`):", style="bold yellow"))
            for line in causes:
                console.print(f"  {line}", soft_wrap=True, markup=False)
    return code


def cmd_up(args: argparse.Namespace) -> int:
    if args.hosts < 1 or args.slots < 1:
        raise UsageError("--hosts and --slots must be at least 1")
    console = Console(highlight=False)
    say = _sayer(console)
    if args.peering and args.topology != "cross-vpc":
        raise UsageError("--peering is for --topology cross-vpc")
    topology = cluster.Topology(hosts=args.hosts, slots=args.slots, kind=args.topology)
    paths = cluster.LabPaths(Path(args.inventory).resolve())
    client = engine.ensure_engine(say)
    cluster.ensure_key(paths.key, say)
    with console.status("building", spinner="dots") as spinner:
        tag = image.ensure_image(client, args.base, paths.state, say,
                                 lambda line: spinner.update(Text(line[:100], style="dim")))
    gpus = args.gpus == "all" or (args.gpus == "auto" and "nvidia" in client.info().get("Runtimes", {}))
    cluster.ensure_networks(client, topology, say)
    containers = cluster.start_hosts(client, topology, tag, paths, gpus, say)
    if topology.kind == "cross-vpc":
        crossvpc.start_gateway(client, topology, tag, args.peering, say)
        crossvpc.route_hosts_through_gateway(client, topology, tag)
    cluster.collect_host_keys(containers, topology, paths)
    cluster.wait_for_ssh(topology)
    paths.inventory.write_text(cluster.inventory_text(topology))
    say(f"wrote {args.inventory}: {topology.hosts} hosts x {topology.slots} slot(s), {topology.kind}")
    if args.no_smoke:
        return ExitCode.OK
    if topology.kind == "cross-vpc" and not args.peering:
        say("no smoke check: without peering the mesh cannot form (that is the point); "
            "see `python -m lab run cross-vpc --hosts inventory.yaml`")
        return ExitCode.OK
    say("smoke check: p2p across the hosts")
    return cmd_run(build_parser().parse_args(["run", "p2p", "--hosts", str(paths.inventory)]))


def cmd_down() -> int:
    console = Console(highlight=False)
    removed = cluster.down(engine.client(), _sayer(console))
    _sayer(console)(f"the lab is down ({removed} removed)" if removed else "no lab to remove")
    return ExitCode.OK


def cmd_launch(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if not script.is_file():
        raise UsageError(f"{args.script}: no such script")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    inventory = _cluster(args)
    settings = _ssh_settings(args)
    inventory = with_master_address(inventory, settings)
    console = Console(highlight=False)
    token = secrets.token_hex(6)
    run_dir = os.path.join(tempfile.gettempdir(), f"lab-run-{token}")
    with reserved_ports(1) as ports:
        plan = build_launch_plan(inventory, str(script.resolve()), args.args, args.timeout or float("inf"),
                                 Resources(ports, token, run_dir), args.launcher)
        outcome = run_plan(plan, on_line=LineStreamer(console), keep=args.keep, ssh=settings)
    failed = [s for s in outcome.ranks if not s.done]
    console.print()
    for s in failed:
        why = (f"stopped after {plan.timeout:g}s" + (f" at {s.stopped_at}" if s.stopped_at else "")
               if s.spec.rank in outcome.hung else f"exited with code {s.exit_code}")
        console.print(Text(f"rank {s.spec.rank} ({s.spec.host}) {why}", style="red"), soft_wrap=True)
    console.print(Text(f"{script.name}: {plan.world_size - len(failed)} of {plan.world_size} ranks succeeded "
                       f"in {outcome.seconds:.1f}s ({outcome.status})", style="bold"), highlight=False)
    if outcome.status in ("interrupted", "timeout"):
        return ExitCode.INTERRUPTED if outcome.status == "interrupted" else ExitCode.TIMEOUT
    return ExitCode.OK if not failed else ExitCode.CHECK_FAILED


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    inventory = _cluster(args)
    settings = _ssh_settings(args)
    diagnosis = doctor.diagnose(with_master_address(inventory, settings), settings,
                                master_port=args.master_port, timeout=args.timeout)
    if args.json:
        print(json.dumps(diagnosis.to_json(), indent=2))
    else:
        doctor.print_diagnosis(Console(highlight=False), diagnosis)
    return diagnosis.exit_code


def cmd_net(args: argparse.Namespace) -> int:
    client = engine.client()
    if args.state != "show":
        crossvpc.set_peering(client, args.state == "on")
    _sayer(Console(highlight=False))(f"peering is {'on' if crossvpc.peering(client) else 'off'}")
    return ExitCode.OK


def cmd_status() -> int:
    console = Console(highlight=False)
    hosts = cluster.status(engine.client())
    if not hosts:
        console.print("no lab is running; start one with `make lab-up`")
        return ExitCode.OK
    table = Table("container", "hostname", "state", "addresses", "ssh")
    for h in hosts:
        table.add_row(h.container, h.hostname, h.state, ", ".join(h.addresses),
                      Text("answers", style="green") if h.ssh else Text("no answer", style="red"))
    console.print(table)
    return ExitCode.OK if all(h.ssh for h in hosts) else ExitCode.UNREACHABLE


def _ssh_settings(args: argparse.Namespace) -> SSHSettings:
    return SSHSettings(accept_new_host_keys=args.accept_new_host_keys)


def _sayer(console: Console) -> Callable[[str], None]:
    return lambda message: console.print(Text(f"lab: {message}"), highlight=False)


def _options(args: argparse.Namespace) -> Options:
    try:
        exercises = tuple(suite.select(args.exercises))
    except KeyError as exc:
        raise UsageError(f"unknown exercise {exc.args[0]!r}; see 'python -m lab list'") from None
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    solution = None
    if args.solution:
        path = Path(args.solution)
        if path.suffix != ".py" or not path.is_file():
            raise UsageError(f"--solution {args.solution}: not a readable .py file")
        solution = str(path.resolve())
    return Options(exercises, args.backend, args.init, args.timeout, solution, args.launcher)


def _local_cluster(nproc: int) -> Inventory:
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    inventory = local_inventory(nproc)
    gpus = local_gpu_count()
    return Inventory(inventory.path, tuple(replace(h, gpus=gpus) for h in inventory.hosts))


def local_gpu_count() -> int:
    """GPUs torch can use here; asks torch only when nvidia-smi shows any (importing it is slow)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if "GPU" not in listed:
        return 0
    import torch

    return int(torch.cuda.device_count())
