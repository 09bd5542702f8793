"""Benchmark: the lab in a notebook (issue 54), through a real kernel (jupyter_client), each figure
against a baseline or a goal in the same run.

    cell    a trivial %%dist cell's round trip (execute to reply) on 4 warm ranks, median of --cells;
            beside it, a trivial cell of the kernel's own                           goal <= 50 ms (local)
                                                                                     <= 150 ms (--hosts)
    start   `%lab start --nproc 4` (to the reply: every rank in the group)
            / `lab launch --nproc 4` of an empty script, alternating, medians       goal <= 1.20
    hang    a cell where rank 0 alone calls all_reduce, --hang-after 3: from the cell's start to its
            verdict, less --hang-after                                               goal <= 3 s

    python benchmarks/notebook.py [--repeat 3] [--cells 20] [--hosts INVENTORY]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

REPO = Path(__file__).resolve().parents[1]


class Kernel:
    """A kernel of its own in ``folder``; ``run`` times one cell to its reply (and says whether it failed)."""

    def __init__(self, folder: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(folder))
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str, timeout: float = 300) -> tuple[float, bool]:
        began = time.perf_counter()
        reply: Any = self.client.execute_interactive(code, timeout=timeout, output_hook=lambda _: None)
        return time.perf_counter() - began, reply["content"]["status"] == "ok"

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


def cell_round_trip(folder: Path, cluster: str, cells: int) -> tuple[float, float]:
    kernel = Kernel(folder)
    try:
        assert kernel.run(f"%load_ext lab.notebook\n%lab start {cluster}")[1]
        kernel.run("%%dist\npass")  # (the first of its kind: IPython's magic machinery warms up)
        dist = sorted(kernel.run("%%dist\npass")[0] for _ in range(cells))
        plain = sorted(kernel.run("pass")[0] for _ in range(cells))
        kernel.run("%lab stop")
        return statistics.median(dist), statistics.median(plain)
    finally:
        kernel.close()


def start_against_launch(folder: Path, repeat: int) -> tuple[float, float]:
    empty = folder / "empty.py"
    empty.write_text("")
    starts, launches = [], []
    for _ in range(repeat):
        kernel = Kernel(folder)
        try:
            kernel.run("%load_ext lab.notebook")
            seconds, ok = kernel.run("%lab start --nproc 4")
            assert ok
            starts.append(seconds)
            kernel.run("%lab stop")
        finally:
            kernel.close()
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lab", "launch", "--nproc", "4", str(empty)], cwd=folder, check=True,
                       capture_output=True)
        launches.append(time.perf_counter() - began)
    return statistics.median(starts), statistics.median(launches)


def hang_verdict(folder: Path, repeat: int, hang_after: float = 3.0) -> float:
    late = []
    for _ in range(repeat):
        kernel = Kernel(folder)
        try:
            assert kernel.run(f"%load_ext lab.notebook\n%lab start --nproc 4 --hang-after {hang_after:g}")[1]
            seconds, ok = kernel.run("%%dist\nif rank == 0:\n    dist.all_reduce(torch.ones(1))")
            assert not ok
            late.append(seconds - hang_after)
            kernel.run("%lab stop")
        finally:
            kernel.close()
    return max(late)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cells", type=int, default=20)
    parser.add_argument("--hosts", metavar="INVENTORY", help="also time the cell on these hosts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        dist, plain = cell_round_trip(folder, "--nproc 4", args.cells)
        print(f"cell (local)   {dist * 1000:7.1f} ms   (a cell of the kernel's own: {plain * 1000:.1f} ms)   "
              f"goal <= 50 ms: {'met' if dist <= 0.050 else 'MISSED'}")
        if args.hosts:
            dist, plain = cell_round_trip(folder, f"--hosts {Path(args.hosts).resolve()}", args.cells)
            print(f"cell (--hosts) {dist * 1000:7.1f} ms   (a cell of the kernel's own: {plain * 1000:.1f} ms)   "
                  f"goal <= 150 ms: {'met' if dist <= 0.150 else 'MISSED'}")
        start, launch = start_against_launch(folder, args.repeat)
        print(f"start          {start:.2f} s / lab launch {launch:.2f} s = {start / launch:.2f}   goal <= 1.20: "
              f"{'met' if start / launch <= 1.20 else 'MISSED'}")
        late = hang_verdict(folder, args.repeat)
        print(f"hang           {late:.2f} s past --hang-after (the slowest of {args.repeat})   goal <= 3 s: "
              f"{'met' if late <= 3 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
