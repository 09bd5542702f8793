"""``bench``: the collectives and p2p timed on each size, nccl-tests style, every result checked."""
from __future__ import annotations

import argparse
from pathlib import Path

from lab.cli.common import (
    Commands,
    add_command,
    check_timeout,
    cluster,
    cluster_options,
    launcher,
    launcher_option,
    solution_file,
    ssh_settings,
    watch_options,
)
from lab.cli.views import bench as views
from lab.cli.views import screen
from lab.cli.views.run import LineStreamer, phases, print_report
from lab.core.judge import exit_code, judge
from lab.core.plan import BACKENDS, DEFAULT_TIMEOUT, Options
from lab.core.planner import build_plan
from lab.core.runner import run_plan
from lab.errors import ExitCode, UsageError
from lab.jobs import bench
from lab.suite import registry
from lab.transport.reach import with_master_address


def add_bench(commands: Commands) -> None:
    benching = add_command(
        commands, "bench", help="time the collectives and p2p on each size, nccl-tests style, every result checked",
        description="Time all_reduce, all_gather, reduce_scatter, broadcast, reduce and p2p (each rank to the "
                    "next) on the cluster, for each size, and print nccl-tests' table: size, count, type, "
                    "redop, time, algbw, busbw (scaled so that it compares with a link's speed) and #wrong. "
                    "With --solution, a student's ring all-reduce beside gloo's.")
    cluster_options(benching)
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
    launcher_option(benching)
    benching.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT * 5, metavar="SECONDS",
                          help=f"the longest the measurement may take on any rank (default {DEFAULT_TIMEOUT * 5:g})")
    watch_options(benching)
    benching.add_argument("--json", action="store_true", help="print the rows as JSON")
    benching.add_argument("--csv", metavar="FILE", help="also write the rows to FILE as CSV")
    benching.add_argument("--plot", metavar="FILE.png", help="also draw busbw against size (one line per op, and "
                          "raw TCP's) to FILE.png")
    benching.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    check_timeout(args.timeout)
    for option, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{option} {path}: no such directory")
    if args.plot:
        bench.check_plotting()
    ops, solution = bench.parse_ops(args.ops or "all"), None
    if args.solution:
        solution = solution_file(args.solution)
        ops = bench.solution_ops(ops, bench.solution_rings(Path(solution)), args.ops is not None)
    env = bench.rank_env(ops, bench.parse_sizes(args.sizes), args.iters, args.warmup)
    options = Options((registry.EXERCISES["bench"],), args.backend, "env", args.timeout, solution,
                      launcher=launcher(args), partition=args.partition, rank_env=env, hang_after=args.hang_after,
                      preflight=args.preflight)
    settings = ssh_settings(args)
    inventory = with_master_address(cluster(args), settings)
    console = views.console(stderr=args.json)
    with phases(console) as on_phase:
        on_phase("timing", f"timing {','.join(ops)} on {inventory.world_size} ranks")
        outcome = run_plan(build_plan(inventory, options), on_line=LineStreamer(console), ssh=settings,
                           on_phase=lambda phase, text: on_phase(phase, f"timing {','.join(ops)}: {text}"))
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
        screen.print_json({"ranks": ranks, "backend": outcome.plan.backend, "rows": [row.to_json() for row in rows],
                           "tcp": tcp.to_json() if tcp else None,
                           "fit": fitted.to_json(ranks) if fitted else None, "notes": list(notes)})
        return code
    views.print_bench(console, title, rows, tcp)
    if fitted is not None:
        views.print_model(console, fitted, rows, ranks)
    views.print_notes(console, notes)
    return code
