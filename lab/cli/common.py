"""What the commands share: the parser class, the options several take (which cluster, which
launcher, which lab), and reading them into the core's terms."""
from __future__ import annotations

import argparse
import difflib
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeAlias

from lab.cli.views import run as run_views
from lab.containerlab.topology import DEFAULT_LAB, check_lab_name
from lab.core import launchers, rankenv
from lab.core.plan import DEFAULT_HANG_AFTER, RUN_DIR, WORK_DIR
from lab.core.slurm import ALLOCATION, allocation_inventory
from lab.errors import ExitCode, UsageError
from lab.grading import notebooks
from lab.inventory.hosts import load_inventory, local_inventory
from lab.inventory.model import Inventory
from lab.suite import registry
from lab.transport.local import local_gpu_count
from lab.transport.ssh.settings import SSHSettings

if TYPE_CHECKING:
    from lab.core.outcome import RunOutcome

Commands: TypeAlias = "argparse._SubParsersAction[Parser]"  # where each command adds its parser
EXIT_CODES = "exit codes:\n" + "\n".join(f"  {int(code):<4} {code.meaning}" for code in ExitCode)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, like every bad input
        self.exit(ExitCode.BAD_INPUT, f"{self.prog}: error: {message}\n")


def add_command(commands: Commands, name: str, help: str, description: str,
                exit_codes: str = EXIT_CODES) -> argparse.ArgumentParser:
    """The parser of a command that runs something: its description as written, its exit codes
    (default: every one's meaning) after its options."""
    return commands.add_parser(name, help=help, description=description, epilog=exit_codes,
                               formatter_class=argparse.RawDescriptionHelpFormatter)


# -- options ----------------------------------------------------------------------------------


def cluster_options(parser: argparse.ArgumentParser, shaped: bool = True) -> None:
    """Which cluster: the hosts of an inventory, or the local cluster of --nproc ranks; ``shaped``:
    torchrun's --nproc-per-node and --nnodes too (``cluster``)."""
    parser.add_argument("--hosts", metavar="INVENTORY", help="an Ansible-style YAML inventory, or 'slurm': the "
                        "nodes of the Slurm allocation the lab runs in (salloc, sbatch); without it: the local "
                        "cluster, --nproc processes on this machine")
    parser.add_argument("--nproc", type=int, metavar="N", help=f"ranks of the local cluster (default {DEFAULT_NPROC}); "
                        "with --hosts, the ranks the inventory must have (it is an error when it disagrees)")
    if shaped:
        parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, metavar="N",
                            help="ranks on each host, as torchrun's: with --hosts, in place of the inventory's slots; "
                                 "without, the local cluster's ranks")
        parser.add_argument("--nnodes", type=int, metavar="N", help="with --hosts: the first N of its hosts, as "
                            "torchrun's (an error when it has fewer)")
    parser.add_argument("--accept-new-host-keys", action="store_true",
                        help="trust SSH host keys not yet in known_hosts (and record them)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log the lab's own steps, each with its time (and the inventory's variables it "
                             "ignores); -vv: SSH's own talk and every line whole too")


def launcher_option(parser: argparse.ArgumentParser) -> None:
    kinds = ", ".join(f"{launcher.name} ({launcher.summary})" for launcher in launchers.LAUNCHERS.values())
    parser.add_argument("--launcher", choices=launchers.NAMES,
                        help=f"who starts the ranks: {kinds} (default {launchers.DEFAULT}; "
                             f"{launchers.ON_ALLOCATION} with --hosts {ALLOCATION})")
    parser.add_argument("--partition", metavar="NAME", help="the Slurm partition (--launcher srun and "
                        "srun-torchrun; default: the cluster's default partition)")


def name_option(parser: argparse.ArgumentParser, *subcommands: argparse.ArgumentParser) -> None:
    """--name on ``parser``, and accepted after each of its ``subcommands`` as well (`lab net
    overlay up --name L`, as `lab net --name L overlay up`): there it keeps the value given before
    unless it is given again."""
    for where, default in ((parser, DEFAULT_LAB), *((s, argparse.SUPPRESS) for s in subcommands)):
        where.add_argument("--name", default=default, type=_lab_name, metavar="NAME",
                           help=f"which lab: labs of different names stand side by side on one engine "
                                f"(default {DEFAULT_LAB})")


def _lab_name(text: str) -> str:
    try:
        return check_lab_name(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--name {text!r}: ")) from None


def machines_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, about: str) -> None:
    parser.add_argument("--machines", metavar="FILE", help=about)


# -- reading them -----------------------------------------------------------------------------


DEFAULT_NPROC = 4  # ranks of the local cluster


def cluster(args: argparse.Namespace) -> Inventory:
    """The hosts of ``--hosts`` (``slurm``: the allocation's nodes), or the local cluster of ``--nproc``
    ranks; shaped by ``--nnodes`` and ``--nproc-per-node`` as torchrun's are, and checked against ``--nproc``."""
    for option in ("nproc", "nproc_per_node", "nnodes"):
        if getattr(args, option) is not None and getattr(args, option) < 1:
            raise UsageError(f"--{option.replace('_', '-')} must be at least 1, got {getattr(args, option)}")
    if not args.hosts:
        if args.nnodes not in (None, 1):
            raise UsageError(f"--nnodes {args.nnodes}: the local cluster is one node; name the hosts with --hosts")
        if None not in (args.nproc, args.nproc_per_node) and args.nproc != args.nproc_per_node:
            raise UsageError(f"--nproc {args.nproc} and --nproc-per-node {args.nproc_per_node} disagree "
                             "(on the local cluster they are the same number)")
        nproc = args.nproc_per_node or args.nproc or DEFAULT_NPROC
        return local_inventory(nproc, gpus=local_gpu_count())
    inventory = allocation_inventory(os.environ, sys.executable) if args.hosts == ALLOCATION \
        else load_inventory(args.hosts)
    hosts = inventory.hosts
    if args.nnodes is not None:
        if args.nnodes > len(hosts):
            raise UsageError(f"--nnodes {args.nnodes}: {inventory.path} has {len(hosts)} host(s)")
        hosts = hosts[:args.nnodes]
    if args.nproc_per_node is not None:
        hosts = tuple(replace(h, slots=args.nproc_per_node) for h in hosts)
    inventory = Inventory(inventory.path, tuple(hosts))
    if args.nproc is not None and args.nproc != inventory.world_size:
        raise UsageError(f"--nproc {args.nproc} disagrees with {inventory.path}: {inventory.world_size} rank(s) on "
                         f"{len(hosts)} host(s); give --nproc-per-node N for N ranks on each host, or leave --nproc "
                         "out")
    return inventory


def launcher(args: argparse.Namespace) -> str:
    """``--launcher``, else srun on the nodes of a Slurm allocation, else the lab's own."""
    return args.launcher or (launchers.ON_ALLOCATION if args.hosts == ALLOCATION else launchers.DEFAULT)


def ssh_settings(args: argparse.Namespace) -> SSHSettings:
    return SSHSettings(accept_new_host_keys=args.accept_new_host_keys)


def exercises(names: list[str]) -> tuple[registry.Exercise, ...]:
    try:
        return tuple(registry.select(names))
    except KeyError as exc:
        raise unknown_exercise(exc.args[0]) from None


def env_options(parser: argparse.ArgumentParser) -> None:
    """What the user adds to every rank's environment (lab.core.rankenv)."""
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="set KEY in every rank's environment (repeatable); it wins over --env-file, this "
                             "machine's variables and the inventory's env")
    parser.add_argument("--env-file", action="append", default=[], metavar="FILE",
                        help="KEY=VALUE lines (# comments; an `export` first and quotes allowed) for every rank's "
                             "environment (repeatable)")
    parser.add_argument("--forward-env", action="append", default=[], metavar="PATTERN",
                        help="also give the ranks this machine's variables whose names match PATTERN (shell-style: "
                             f"MY_*; repeatable); {', '.join(rankenv.FORWARDED)} go when set")


def rank_env(args: argparse.Namespace, project: Path | None = None, carried: bool = True) -> dict[str, str]:
    """The settings of ``env_options`` for every rank, later ones winning, without the run's own
    (each left out named on stderr, in one line); with the ``project`` folder of a launch, the
    caller's PYTHONPATH: where the project is ``carried``, its entries inside it, as its copy on the
    hosts has them (the rest named on stderr), else (its ranks start in it, on this machine) whole."""
    env = rankenv.forwarded(os.environ, args.forward_env)
    if project is not None and os.environ.get("PYTHONPATH") and not carried:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    elif project is not None and os.environ.get("PYTHONPATH"):
        python_path, outside = rankenv.project_python_path(os.environ["PYTHONPATH"], project, f"{RUN_DIR}/{WORK_DIR}")
        if python_path:
            env["PYTHONPATH"] = python_path
        run_views.print_outside_project("PYTHONPATH", outside)
    for path in args.env_file:
        env.update(rankenv.read_env_file(path))
    env.update(rankenv.assignment(text, "--env") for text in args.env)
    kept, left_out = rankenv.without_reserved(env)
    run_views.print_reserved(left_out)
    return kept


def exercise_names(argument: argparse.Action) -> None:
    """The shell completes ``argument`` with the suite's exercise names (``lab completion``)."""
    argument.completer = lambda **_: ["all", *registry.EXERCISES]  # type: ignore[attr-defined]


def unknown_exercise(name: str) -> UsageError:
    """The error for an exercise name the suite has not, with the nearest one it has."""
    near = difflib.get_close_matches(name.replace("_", "-").lower(), registry.EXERCISES, n=1, cutoff=0.6)
    mean = f": did you mean {near[0]!r}?" if near else ""
    return UsageError(f"unknown exercise {name!r}{mean}; see 'python -m lab list'")


def solution_file(text: str) -> str:
    """The solution to run: a .py file, or a notebook's (.ipynb: the functions its cells define, taken
    into a .py file of a temporary folder of this command's: lab.grading.notebooks)."""
    path = Path(text)
    if path.suffix == ".ipynb" and path.is_file():
        extracted = notebooks.extract(notebooks.read_cells(path), path.name)
        run_views.print_notebook_notes(path.name, extracted.notes)
        return str(notebooks.written(extracted, path.stem))
    if path.suffix != ".py" or not path.is_file():
        raise UsageError(f"--solution {text}: not a readable .py file (or .ipynb notebook)")
    return str(path.resolve())


def check_timeout(seconds: float) -> None:
    if seconds <= 0:
        raise UsageError(f"--timeout must be positive, got {seconds:g}")


def watch_options(parser: argparse.ArgumentParser) -> None:
    """How the lab watches a job: the network before it starts, hangs while it runs."""
    parser.add_argument("--no-preflight", dest="preflight", action="store_false",
                        help="start the ranks without checking the network first (by default each host's launcher "
                             "checks, before any rank starts, that its peers and MASTER_ADDR:MASTER_PORT reach it "
                             "and it them, and a failure stops the job with the cause, exit code 6)")
    parser.add_argument("--hang-after", type=_hang_after, default=DEFAULT_HANG_AFTER, metavar="SECONDS",
                        help="stop the job as hung, and say why across its ranks, once every live rank has "
                             "waited in a torch.distributed call while nothing moved on its connections (no byte "
                             "sent or received, no call completed) for this long "
                             f"(default {DEFAULT_HANG_AFTER:g}; 0: only --timeout stops it)")


def record_options(parser: argparse.ArgumentParser) -> None:
    """What the lab writes of a job's calls, to look at."""
    parser.add_argument("--trace", metavar="FILE", help="write every rank's torch.distributed calls (the program's "
                        "and the collectives torch issues itself: DDP's), on one clock across the hosts, and the "
                        "verdict, to FILE as Chrome trace-event JSON: open it in ui.perfetto.dev or chrome://tracing")
    parser.add_argument("--fr-dir", metavar="DIR", help="write each rank's torch flight-recorder dump to "
                        "DIR/rank_N, as torch's own analyzer reads it (torchfrtrace DIR -p rank_)")


def check_records(args: argparse.Namespace) -> None:
    """Refuse, before the job runs, a --trace whose folder is not there and a --fr-dir that cannot be
    made (it is made now)."""
    if args.trace and not Path(args.trace).parent.is_dir():
        raise UsageError(f"--trace {args.trace}: no such folder: {Path(args.trace).parent}")
    if args.fr_dir:
        try:
            Path(args.fr_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--fr-dir {args.fr_dir}: {exc.strerror or exc}") from None


def write_records(args: argparse.Namespace, outcome: RunOutcome) -> None:
    """The files --trace and --fr-dir asked for."""
    from lab.core import torchdumps, trace

    if args.trace:
        try:
            trace.write(args.trace, outcome)
        except OSError as exc:
            raise UsageError(f"--trace {args.trace}: {exc.strerror or exc}") from None
    if args.fr_dir:
        try:
            torchdumps.write(args.fr_dir, outcome)
        except OSError as exc:
            raise UsageError(f"--fr-dir {args.fr_dir}: {exc.strerror or exc}") from None


def _hang_after(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or a positive number of seconds, got {value}")
    return seconds
