"""Running programs on a cluster: ``list``, ``run`` (the exercises, checked), ``launch`` (any
script, torchrun-style), ``submit`` (a run as a Slurm batch job)."""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import asdict
from pathlib import Path

from lab.cli.common import (
    Commands,
    add_command,
    check_records,
    check_timeout,
    cluster,
    cluster_options,
    env_options,
    exercise_names,
    exercises,
    launcher,
    launcher_option,
    rank_env,
    record_options,
    solution_file,
    ssh_settings,
    watch_options,
    write_records,
)
from lab.cli.views import run as views
from lab.cli.views import screen
from lab.cli.views.doctor import print_diagnosis
from lab.core import bringback, launchers, random_inputs, requirements, workdir
from lab.core.judge import exit_code, judge, stopped_exit, the_network_may_be_why
from lab.core.logdir import LogDir
from lab.core.outcome import LaunchState, RankState, RunOutcome
from lab.core.plan import BACKENDS, DEFAULT_TIMEOUT, INIT_METHODS, Options
from lab.core.planner import build_launch_plan, build_plan, without_unshared
from lab.core.report import launch_json, to_json, to_junit
from lab.core.requirements import Requirements
from lab.core.runner import run_plan
from lab.core.slurm import SlurmError
from lab.doctor.known import printed_causes, run_causes
from lab.doctor.run import explain_hang
from lab.errors import ExitCode, UsageError
from lab.inventory.model import Inventory
from lab.jobs import submit as batch
from lab.transport.reach import with_master_address
from lab.transport.ssh.settings import SSHSettings


def add_list(commands: Commands) -> None:
    commands.add_parser("list", help="list the exercises, one line each").set_defaults(handler=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    views.print_exercises()
    return ExitCode.OK


# -- run --------------------------------------------------------------------------------------


def add_run(commands: Commands) -> None:
    run = add_command(
        commands, "run", help="run exercises on the local cluster or the hosts of an inventory, and check them",
        description="Run exercises (or 'all') and check every rank's result against an independent oracle.")
    exercise_names(run.add_argument("exercises", nargs="+", metavar="NAME",
                                    help="exercise names, or 'all' (see 'list')"))
    cluster_options(run)
    run.add_argument("--backend", choices=BACKENDS, help="default: nccl when every rank has its own GPU, else gloo")
    run.add_argument("--init", choices=INIT_METHODS, default="env",
                     help="how the ranks rendezvous for the shared process group (default env)")
    launcher_option(run)
    run.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                     help=f"the longest any rank may spend on one step: start-up, rendezvous or one "
                          f"exercise (default {DEFAULT_TIMEOUT:g})")
    watch_options(run)
    record_options(run)
    env_options(run)
    run.add_argument("--part", metavar="NAME", help="check only this part of the (one) exercise: one of the "
                     "functions it asks for (ring-allreduce: allreduce or ring_allreduce)")
    run.add_argument("--seed", metavar="SEED", help="draw the inputs of an exercise that takes some (ring-allreduce) "
                     "from SEED, as the run that showed it did: to replay a graded run exactly (default: fresh ones)")
    run.add_argument("--solution", metavar="FILE.py", help="run this file (or a notebook's, FILE.ipynb: the "
                     "functions its cells define) in place of the exercise's "
                     "reference program (one exercise) and check it the same way; it runs as you, with "
                     "your environment and files: for other people's code use `grade`")
    run.add_argument("--json", action="store_true", help="print the results as JSON on stdout "
                     "(rank output goes to stderr)")
    run.add_argument("--junit", metavar="FILE.xml", help="also write the results as JUnit XML (for grading in CI)")
    run.add_argument("--dry-run", action="store_true", help="print the plan as YAML and exit")
    run.add_argument("--keep", action="store_true", help="keep the run directory on every host")
    run.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    options = _options(args)
    inventory = cluster(args)
    if "all" in args.exercises:
        options, left_out = without_unshared(options, inventory.hosts)
        views.print_left_out(left_out)
    if args.dry_run:  # a dry run stays offline: it shows the addresses as given
        views.print_plan(build_plan(inventory, options).to_dict())
        return ExitCode.OK
    inventory = with_master_address(inventory, ssh_settings(args))
    if any(e.name == "cross-vpc" for e in options.exercises):
        return _run_cross_vpc(inventory, options, args)
    return run_and_report(inventory, options, ssh_settings(args), json_out=args.json, junit=args.junit,
                          keep=args.keep, records=args)


def _options(args: argparse.Namespace) -> Options:
    chosen = exercises(args.exercises)
    check_timeout(args.timeout)
    check_records(args)
    solution = solution_file(args.solution) if args.solution else None
    if args.seed is not None and not random_inputs.SEED.fullmatch(args.seed):
        raise UsageError(f"--seed {args.seed[:40]!r}: a seed is 32 hex digits, as a run shows it")
    if args.seed is not None and not any(e.drawn for e in chosen):
        raise UsageError(f"--seed: {', '.join(e.name for e in chosen)} draw(s) no inputs")
    return Options(chosen, args.backend, args.init, args.timeout, solution, launcher(args),
                   partition=args.partition, rank_env=rank_env(args), hang_after=args.hang_after,
                   preflight=args.preflight, part=args.part, seed=args.seed, trace=bool(args.trace),
                   torch_dumps=bool(args.fr_dir))


def run_and_report(inventory: Inventory, options: Options, settings: SSHSettings, json_out: bool = False,
                   junit: str | None = None, keep: bool = False, records: argparse.Namespace | None = None) -> int:
    """Run the exercises, check them, report (on stderr when stdout carries JSON); the exit code."""
    console = screen.console(stderr=json_out)
    plan = build_plan(inventory, options)
    with views.phases(console) as on_phase:
        outcome = run_plan(plan, on_line=views.LineStreamer(console), keep=keep, ssh=settings, on_phase=on_phase)
    if records is not None:
        write_records(records, outcome)
    reports = judge(outcome)
    code = exit_code(outcome, reports)
    causes = explain_hang(inventory, settings) if the_network_may_be_why(outcome) else []
    printed = run_causes(outcome, reports)
    if junit:
        Path(junit).write_bytes(to_junit(outcome, reports))
    if json_out:
        screen.print_json({**to_json(outcome, reports, code), "likely_causes": causes, "known_errors": printed})
    else:
        views.print_report(console, outcome, reports)
        views.print_causes(console, "likely cause (from `python -m lab doctor`):", causes)
        views.print_causes(console, "what the ranks printed means:", printed)
    return code


def _run_cross_vpc(inventory: Inventory, options: Options, args: argparse.Namespace) -> int:
    """The tutorial's failure on the cross-VPC lab, the diagnosis, then the fix (lab.doctor.scenario)."""
    if len(options.exercises) != 1:
        raise UsageError("cross-vpc runs alone: name no other exercise with it")
    from lab.doctor.scenario import run_scenario  # (it drives the lab's engine: the Docker SDK, here only)

    console = screen.console(stderr=args.json)
    result = run_scenario(inventory, options, ssh_settings(args), views.LineStreamer(console), screen.sayer(console),
                          lambda diagnosis: print_diagnosis(console, diagnosis), keep=args.keep)
    if args.json:
        screen.print_json({"passed": result.passed, "steps": [asdict(step) for step in result.steps],
                           "diagnosis": result.diagnosis.to_json()})
    else:
        views.print_scenario(console, result)
    return ExitCode.OK if result.passed else ExitCode.CHECK_FAILED


# -- launch -----------------------------------------------------------------------------------


def add_launch(commands: Commands) -> None:
    launch = add_command(
        commands, "launch", help="run any script on every rank with the rendezvous injected (torchrun across hosts)",
        description="Run SCRIPT on every rank of the cluster with MASTER_ADDR, MASTER_PORT, RANK, "
                    "WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE in its environment, set by the lab, by "
                    "torchrun or by mp.spawn on each host (--launcher), across the hosts of an inventory. "
                    "The tutorials' torchrun scripts run unchanged. Rank 0 reads this command's stdin, as under "
                    "torchrun; the other ranks read nothing.")
    cluster_options(launch)
    launcher_option(launch)
    launch.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS",
                        help="stop the job when it runs longer (default 0: never; a job that hangs is stopped "
                             "by --hang-after, a lost host by its keepalives)")
    watch_options(launch)
    record_options(launch)
    launch.add_argument("--json", action="store_true", help="print how the job ended, its cause and each rank "
                        "as JSON on stdout (rank output goes to stderr)")
    launch.add_argument("--keep", action="store_true", help="keep the run directory on every host")
    restarting = [launcher.name for launcher in launchers.LAUNCHERS.values() if launcher.restarts_ranks]
    launch.add_argument("--max-restarts", "--max_restarts", type=int, default=0, metavar="N",
                        help=f"with --launcher {' or '.join(restarting)}: restart every rank up to N times after one "
                             "fails, as torchrun's --max-restarts (default 0); each restart is said, with what "
                             "ended the attempt before it")
    launch.add_argument("--log-dir", "--log_dir", metavar="DIR",
                        help="also write each rank's output to DIR/rank_N.log (its stderr's lines marked [err]), "
                             "a launcher's to DIR/launcher_HOST.log, and how the job ended to DIR/summary.json")
    env_options(launch)
    launch.add_argument("--workdir", metavar="DIR", help="the project folder every host gets a copy of, where the "
                        "ranks start (default: the script's folder; with -m, this one)")
    launch.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                        help="leave files matching PATTERN (.gitignore's syntax) out of the workdir, as its "
                             ".gitignore files do (repeatable)")
    launch.add_argument("--include", action="append", default=[], metavar="PATTERN",
                        help="carry files matching PATTERN (.gitignore's syntax) that the workdir's ignore rules "
                             "leave out: its data, say (repeatable; --exclude still wins)")
    launch.add_argument("--requirements", metavar="FILE",
                        help="install what FILE (pip's requirements format) names on every host, once, for the ranks "
                             "(an environment each host keeps by FILE's content and its Python; this machine gets the "
                             "wheels: a second launch with it costs a short command per host); over the inventory's "
                             "`requirements:`")
    launch.add_argument("--bring-back-max", type=float, default=bringback.DEFAULT_MAX_MB, metavar="MB",
                        help="on hosts other than this machine, bring back into the project at the end what the "
                             "ranks wrote in their copies of it, up to this much in all (default "
                             f"{bringback.DEFAULT_MAX_MB} MiB; more stays on the hosts, said; 0: nothing)")
    launch.add_argument("--sync-back", action="append", default=[], metavar="PATTERN",
                        help="on hosts other than this machine, bring back a file matching PATTERN (.gitignore's "
                             "syntax; '*': any) that rank 0's host's ranks save with torch.save as soon as it is "
                             "saved, while the job goes on (a checkpoint); said in a line (repeatable; within "
                             "--bring-back-max)")
    launch.add_argument("--max-workdir-size", type=float, default=workdir.DEFAULT_MAX_MB, metavar="MB",
                        help=f"refuse a workdir larger than this (default {workdir.DEFAULT_MAX_MB} MiB)")
    launch.add_argument("-m", "--module", action="store_true",
                        help="SCRIPT is a module of the workdir, run as `python -m` runs it (as torchrun's -m)")
    torchrun_flags(launch)
    launch.add_argument("script", metavar="SCRIPT.py", help="the script every rank runs (with -m: a module name)")
    launch.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    launch.set_defaults(handler=cmd_launch)


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
RENDEZVOUS = ("the lab chooses the rendezvous itself: rank 0's host (the first of --hosts) and a port it holds "
              "there for the run; to have it reached at another address, give that host master_addr in the inventory")
# torchrun's own flags that mean nothing, or another thing, under the lab: what the lab does instead
TORCHRUN_FLAGS = {
    ("--node-rank", "--node_rank"): "the lab starts every host's ranks itself and numbers the hosts (GROUP_RANK): "
                                    "run one lab launch, from any machine, with --hosts",
    ("--rdzv-endpoint", "--rdzv_endpoint"): RENDEZVOUS,
    ("--master-addr", "--master_addr"): RENDEZVOUS,
    ("--master-port", "--master_port"): RENDEZVOUS,
    ("--rdzv-backend", "--rdzv_backend"): "under --launcher torchrun the lab runs torchrun's c10d rendezvous, on "
                                          "rank 0's host",
    ("--rdzv-id", "--rdzv_id"): "the lab gives each run a rendezvous id of its own",
}


class _TorchrunFlag(argparse.Action):
    """One of torchrun's flags the lab answers with its own way (TORCHRUN_FLAGS), as a usage error."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option: str | None = None) -> None:
        parser.error(f"{option}: torchrun's flag; {self.help}")


def torchrun_flags(parser: argparse.ArgumentParser) -> None:
    """torchrun's flags, understood where they mean what the lab's do (--nproc_per_node, --nnodes,
    --max_restarts, --log_dir: the lab's own take them), a no-op where the lab does it anyway
    (--standalone), and answered with the lab's way where they do not."""
    parser.add_argument("--standalone", action="store_true", help="as torchrun's: nothing to do (a cluster of one "
                        "machine meets on it without it)")
    for names, answer in TORCHRUN_FLAGS.items():
        parser.add_argument(*names, action=_TorchrunFlag, metavar="VALUE", help=answer)


def cmd_launch(args: argparse.Namespace) -> int:
    script = Path(args.script)
    if args.module:
        if not MODULE_NAME.match(args.script):
            raise UsageError(f"-m {args.script[:80]!r}: not a module name (dotted Python names)")
        root = Path(args.workdir or ".")
    else:
        if not script.is_file():
            raise UsageError(f"{args.script}: no such script")
        root = Path(args.workdir) if args.workdir else script.resolve().parent
        if args.workdir and not script.resolve().is_relative_to(root.resolve()):
            raise UsageError(f"{args.script}: not inside --workdir {args.workdir}")
    if args.timeout < 0:
        raise UsageError(f"--timeout must be 0 (no limit) or more, got {args.timeout:g}")
    if args.bring_back_max < 0:
        raise UsageError(f"--bring-back-max must be 0 (nothing) or more, got {args.bring_back_max:g}")
    check_records(args)
    if args.max_restarts < 0:
        raise UsageError(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    settings = ssh_settings(args)
    inventory = with_master_address(cluster(args), settings)
    in_place = root.resolve() if _in_place(root.resolve(), inventory) else None  # (torchrun's way: see docs)
    project = None
    if in_place is not None and (args.include or args.exclude or args.sync_back):
        views.print_in_place(in_place, ("--include",) * bool(args.include) + ("--exclude",) * bool(args.exclude)
                             + ("--sync-back",) * bool(args.sync_back),
                             shared=not all(h.is_local for h in inventory.hosts))
    if in_place is None:
        project = workdir.collect(root, tuple(args.exclude), args.max_workdir_size, tuple(args.include))
        views.print_skipped(project.root, project.skipped)
        views.print_ignored_data(project.ignored_data)
    console = screen.console(stderr=args.json)
    plan = build_launch_plan(inventory, args.script if args.module else str(script.resolve()), args.args,
                             args.timeout, launcher(args), partition=args.partition, hang_after=args.hang_after,
                             preflight=args.preflight, rank_env=rank_env(args, root.resolve(), in_place is None),
                             workdir=project, module=args.module, max_restarts=args.max_restarts,
                             trace=bool(args.trace), torch_dumps=bool(args.fr_dir), in_place=in_place,
                             bring_back_max=int(args.bring_back_max * 2**20), sync_back=args.sync_back,
                             requirements=_requirements(args.requirements, inventory))
    name = args.script if args.module else script.name
    streamer = views.LineStreamer(console)
    logs = LogDir(args.log_dir, (r.rank for r in plan.ranks)) if args.log_dir else None

    def on_line(state: RankState | LaunchState, stream: str, line: str) -> None:
        streamer(state, stream, line)
        if logs is not None:
            logs(state, stream, line)

    try:
        with views.phases(console) as on_phase:
            outcome = run_plan(plan, on_line=on_line, keep=args.keep, ssh=settings, on_phase=on_phase,
                               stdin=_stdin(), on_note=views.print_note)
    finally:
        if logs is not None:
            logs.close()
    write_records(args, outcome)
    failed = [s for s in outcome.ranks if not s.done]
    code = _launch_exit(outcome, failed)
    if logs is not None:
        logs.summarize(outcome, launch_json(outcome, name, code))
    printed = printed_causes(failed)
    if args.json:
        screen.print_json({**launch_json(outcome, name, code), "known_errors": printed})
    else:
        views.print_launch(console, name, outcome, failed)
        views.print_causes(console, "what the ranks printed means:", printed)
    return code


def _in_place(project: Path, inventory: Inventory) -> bool:
    """Whether every host's ranks can run in the project itself: they are this machine's, or the project
    lies in the folder every other host mounts (its ``shared_dir``, seen here at the same path; the
    runner makes sure each host sees the project there)."""
    return all(h.is_local or h.shared_dir is not None and project.is_relative_to(h.shared_dir)
               for h in inventory.hosts)


def _stdin() -> int | None:
    """This process's stdin, for rank 0 (as torchrun gives it its own); None where it has none."""
    try:
        os.fstat(0)
    except OSError:
        return None
    return 0


def _requirements(given: str | None, inventory: Inventory) -> dict[str, Requirements]:
    """What each host's ranks need beyond torch: ``--requirements``, else the host's in the inventory."""
    files = {host.name: given or host.requirements for host in inventory.hosts if given or host.requirements}
    read = {path: requirements.read(path) for path in set(files.values()) if path}
    return {host: read[path] for host, path in files.items() if path}


def _launch_exit(outcome: RunOutcome, failed: list[RankState]) -> ExitCode:
    stopped = stopped_exit(outcome)
    if stopped is not None:
        return stopped
    return ExitCode.OK if not failed else ExitCode.CHECK_FAILED


# -- submit -----------------------------------------------------------------------------------


def add_submit(commands: Commands) -> None:
    submission = add_command(
        commands, "submit", help="run exercises as a Slurm batch job (sbatch), here on the cluster's login host",
        description="Write an sbatch script that runs `python -m lab run NAME... --hosts slurm` on the nodes "
                    "Slurm gives the job, submit it and print its id; with --wait, wait for it and print its "
                    "report (its exit code is the run's). The job's output and JUnit results go to --out.")
    exercise_names(submission.add_argument("exercises", nargs="+", metavar="NAME",
                                    help="exercise names, or 'all' (see 'list')"))
    submission.add_argument("--nodes", type=int, default=2, metavar="N", help="nodes for the job (default 2)")
    submission.add_argument("--ntasks-per-node", type=int, default=1, metavar="S",
                            help="ranks on each node (default 1)")
    submission.add_argument("--time", metavar="LIMIT", help="the job's time limit, as Slurm writes it (MINUTES, "
                            "HH:MM:SS, DAYS-HH); default: the partition's")
    submission.add_argument("--partition", metavar="NAME", help="the partition (default: the cluster's default)")
    submission.add_argument("--launcher", choices=launchers.NAMES,
                            help=f"who starts the ranks in the job (default {launchers.ON_ALLOCATION})")
    submission.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                            help=f"as for run (default {DEFAULT_TIMEOUT:g})")
    submission.add_argument("--out", default="lab-jobs", metavar="DIR",
                            help="where the script, the job's output and its JUnit results go; the job's nodes "
                                 "must see it (default lab-jobs)")
    submission.add_argument("--wait", action="store_true", help="wait for the job and print its report; Ctrl-C "
                            "cancels it")
    submission.set_defaults(handler=cmd_submit)


def cmd_submit(args: argparse.Namespace) -> int:
    exercises(args.exercises)  # (checked here: the job runs them)
    check_timeout(args.timeout)
    run_args = (*args.exercises, "--timeout", f"{args.timeout:g}",
                *(("--launcher", args.launcher) if args.launcher else ()))
    job = batch.BatchJob(run_args, args.nodes, args.ntasks_per_node, args.time, args.partition)
    out = Path(args.out)
    say = screen.sayer(screen.console(stderr=True))
    job_id, code = batch.submit(job, out, args.wait, lambda job_id: say(
        f"submitted batch job {job_id}: its report goes to {out / f'slurm-{job_id}.out'}"))
    if code is None:
        return ExitCode.OK
    output = batch.job_output(out, job_id)
    views.print_job_output(output)
    if batch.ran_out_of_time(output):
        limit = args.time or "the partition's"
        raise SlurmError(f"job {job_id}: Slurm stopped it at its time limit ({limit})", ExitCode.TIMEOUT)
    return code
