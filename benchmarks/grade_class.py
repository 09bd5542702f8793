"""Benchmark: grading a class of ring all-reduce submissions, contained and in parallel.

A class of N copies of one correct submission (tests/class/ring/alice.py, each under its own
student name), 3 ranks each, graded three ways in one run:

* baseline: ``python -m lab run ring-allreduce --solution FILE --nproc 3`` for each file, one
  after the other (what an instructor would script without ``lab grade``);
* ``lab grade --parallel 1``: each submission in its own throwaway sandbox container;
* ``lab grade --parallel 2``: two sandboxes at a time.

``--sandbox ranks`` grades with a container a rank instead (``lab grade --sandbox ranks``).

It prints seconds per submission and the ratios: containment (grade --parallel 1 against the
baseline; goal at most 1.2) and throughput (--parallel 2 against --parallel 1; goal at least
1.6), the bound the machine's cores put on any parallelism (the CPU seconds the baseline's
processes used, over the cores), what the drawn inputs cost the controller per submission
(drawing every rank's values, staging their files, summing them in the check) against a
submission's run: every run above pays it too, and what the measure of each sandbox's connections
(lab.rank.wire, which only `lab grade` takes) costs against the CPU a submission uses. Needs the
Docker engine and the lab image (``make lab-up`` builds it).

    python benchmarks/grade_class.py [--students 40] [--nproc 3] [--sandbox container|ranks]
"""
from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab.core import random_inputs  # noqa: E402  (this checkout's)
from lab.rank import wire  # noqa: E402
from lab.suite.check import World  # noqa: E402
from lab.suite.checks import ring  # noqa: E402
from lab.suite.exercises import ring_cases  # noqa: E402

CORRECT = REPO / "tests" / "class" / "ring" / "alice.py"
LAB = [sys.executable, "-m", "lab"]


def make_class(directory: Path, students: int) -> Path:
    root = directory / "submissions"
    root.mkdir()
    for i in range(students):
        shutil.copyfile(CORRECT, root / f"student{i:02d}.py")
    return root


def baseline(root: Path, nproc: int) -> tuple[float, float]:
    """Seconds for every file, one `run` after another, and the CPU seconds they used."""
    cpu = _children_cpu()
    started = time.monotonic()
    for path in sorted(root.glob("*.py")):
        done = subprocess.run([*LAB, "run", "ring-allreduce", "--solution", str(path), "--nproc", str(nproc)],
                              cwd=REPO, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"baseline: {path.name} did not pass:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.monotonic() - started, _children_cpu() - cpu


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def grade(root: Path, nproc: int, parallel: int, out: Path, sandbox: str) -> float:
    started = time.monotonic()
    done = subprocess.run([*LAB, "grade", str(root), "--exercise", "ring-allreduce", "--nproc", str(nproc),
                           "--parallel", str(parallel), "--sandbox", sandbox, "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    with (out / "grades.csv").open() as f:
        verdicts = [row["verdict"] for row in csv.DictReader(f)]
    if done.returncode != 0 or verdicts.count("pass") != len(list(root.glob("*.py"))):
        raise SystemExit(f"grade --parallel {parallel}: exit {done.returncode}, verdicts {verdicts}:\n"
                         f"{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return seconds


def inputs_cost(nproc: int, repeat: int = 20) -> float:
    """Seconds the controller spends per submission on its drawn inputs: the draw (lab.core.random_inputs) and
    the check's sums, on a correct report of that draw (the runner hands the transports the drawn bytes)."""
    spent = 0.0
    for _ in range(repeat):
        started = time.perf_counter()
        seed = random_inputs.new_seed()
        inputs = {rank: random_inputs.draw(ring_cases.DRAWN, seed, rank) for rank in range(nproc)}
        world = replace(World.local(nproc), inputs={r: random_inputs.values(d) for r, d in inputs.items()})
        spent += time.perf_counter() - started
        results = _correct(world)  # (the ranks' part: not the controller's)
        started = time.perf_counter()
        verdict = ring.check_ring_allreduce(results, world)
        spent += time.perf_counter() - started
        assert verdict.passed, verdict.reason
    return spent / repeat


def wire_cost(sockets: int = 24, repeat: int = 200) -> float:
    """Seconds one sample of the host's connections takes (lab.rank.wire: each host's launcher takes
    one every POLL seconds while its ranks run), with ``sockets`` TCP sockets open on loopback (a
    3-rank run's gloo mesh, store and listeners are about that many)."""
    import socket

    held = []
    for _ in range(sockets // 3):
        listener = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(listener.getsockname())
        held += [listener, client, listener.accept()[0]]
    try:
        measure = wire.Wire.start("netns")
        started = time.perf_counter()
        for _ in range(repeat):
            measure.poll(force=True)
        spent = (time.perf_counter() - started) / repeat
        measure.close()
    finally:
        for s in held:
            s.close()
    return spent


def _correct(world: World) -> dict[int, dict[str, Any]]:
    """Every rank's correct report of ``world``'s draw, as the rank program makes it."""
    sums = [sum(column) for column in zip(*(world.inputs[r] for r in range(world.world_size)))]
    reports: dict[str, dict[str, Any]] = {}
    for function in ring_cases.FUNCTIONS:
        cases = reports.setdefault(function, {})
        for shape, start in ring_cases.starts(function).items():
            values = sums[start:start + ring_cases.numel(shape)]
            for dtype in ring_cases.DTYPES:
                as_dtype = float if dtype.startswith("float") else int
                reported = ring_cases.digest([as_dtype(v) for v in values], world.world_size)
                cases[ring_cases.case_name(shape, dtype)] = {"shape": list(shape), "dtype": dtype, **reported}
    return {r: reports for r in range(world.world_size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--sandbox", choices=("container", "ranks"), default="container",
                        help="lab grade's sandbox: a container a submission, or one a rank")
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = str(REPO)
    with tempfile.TemporaryDirectory() as directory:
        root = make_class(Path(directory), args.students)
        plain, cpu = baseline(root, args.nproc)
        one = grade(root, args.nproc, 1, Path(directory, "p1"), args.sandbox)
        two = grade(root, args.nproc, 2, Path(directory, "p2"), args.sandbox)
    drawn = inputs_cost(args.nproc)
    sample = wire_cost()
    n, cores = args.students, os.cpu_count() or 1
    bound = cpu / cores  # no schedule of these processes on this machine's cores can take less
    print(f"{n} ring-allreduce submissions, {args.nproc} ranks each, {cores} CPU(s)")
    print(f"  run --solution, one after another   {plain:7.1f}s  {plain / n:5.2f}s per submission")
    print(f"  grade --parallel 1 (--sandbox {args.sandbox:9}) {one:7.1f}s  {one / n:5.2f}s per submission")
    print(f"  grade --parallel 2 (--sandbox {args.sandbox:9}) {two:7.1f}s  {two / n:5.2f}s per submission")
    print(f"containment cost (grade -p1 / run):   {one / plain:.2f}x  (goal <= 1.2)")
    print(f"throughput of -p2 over -p1:           {one / two:.2f}x  (goal >= 1.6)")
    print(f"CPU a submission's processes use:     {cpu / n:5.2f}s, so on {cores} core(s) no --parallel can take "
          f"less than {bound / n:.2f}s per submission: at best {one / bound:.2f}x over -p1")
    print(f"drawn inputs (draw, the check's sums): {drawn * 1000:.0f} ms per submission, "
          f"{drawn / (plain / n):.3f} of a submission's run")
    sampled = sample * (one / n) / wire.POLL  # CPU seconds one submission's samples take in its sandbox
    print(f"the measure of the connections: {sample * 1e6:.0f} us a sample, one every {wire.POLL:g}s: "
          f"{sampled * 1000:.0f} ms of CPU per submission, {sampled / (cpu / n):.3f} of its processes' CPU")


if __name__ == "__main__":
    main()
