"""Benchmark: what carrying a project costs `lab launch`, once the hosts keep it.

The same small script launched two ways, alternately, in one run: alone in a folder of its own (a
one-file launch: the baseline), and in a project folder with 50 MiB of data beside it, launched
once before (so every host keeps the project: lab.core.workcache). Seconds per launch (median of
--repeat), the difference (goal: at most 0.2 s) and the ratio. Locally by default; with --hosts,
on those hosts (e.g. the container lab's inventory.yaml after `make lab-up`).

    python benchmarks/launch_workdir.py [--repeat 5] [--mb 50] [--hosts inventory.yaml]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAB = [sys.executable, "-m", "lab"]
SCRIPT = "import os\nprint('rank', os.environ['RANK'], 'sees', len(os.listdir('.')), 'entries')\n"


def launch(script: Path, where: list[str]) -> float:
    started = time.monotonic()
    done = subprocess.run([*LAB, "launch", *where, str(script)], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        sys.exit(f"lab launch failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mb", type=int, default=50, help="MiB of data beside the script (default 50)")
    parser.add_argument("--hosts", help="an inventory (default: 2 local ranks)")
    args = parser.parse_args()
    where = ["--hosts", args.hosts] if args.hosts else ["--nproc", "2"]
    with tempfile.TemporaryDirectory() as directory:
        alone, project = Path(directory, "alone"), Path(directory, "project")
        for folder in (alone, project):
            folder.mkdir()
            (folder / "main.py").write_text(SCRIPT)
        (project / "data").mkdir()
        for i in range(args.mb):
            (project / "data" / f"part{i:03}.bin").write_bytes(os.urandom(1 << 20))
        launch(project / "main.py", where)  # (the hosts keep it from now on)
        one_file, kept = [], []
        for _ in range(args.repeat):
            one_file.append(launch(alone / "main.py", where))
            kept.append(launch(project / "main.py", where))
    base, carried = statistics.median(one_file), statistics.median(kept)
    print(f"one-file launch:                        {base:6.2f} s (median of {args.repeat})")
    print(f"launch of an unchanged {args.mb} MiB project:  {carried:6.2f} s")
    print(f"difference {carried - base:+.2f} s (goal at most +0.20 s), ratio {carried / base:.2f}")


if __name__ == "__main__":
    main()
