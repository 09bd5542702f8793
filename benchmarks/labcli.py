"""What the two-host network benchmarks share: the lab's CLI run as a user runs it, and a script
launched across a lab's hosts that prints one line of figures (``BENCH <GB/s> GB/s <us> us``)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULT = re.compile(r"BENCH ([\d.]+) GB/s ([\d.]+) us")


def lab(*args: str) -> str:
    """``python -m lab ARGS`` in the repository; its stdout (a failure ends the benchmark, saying why)."""
    done = subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"lab {' '.join(args)} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def lab_down(name: str) -> None:
    """``lab down`` of a benchmark's lab, whatever state it is in."""
    subprocess.run([sys.executable, "-m", "lab", "down", "--name", name], cwd=REPO, capture_output=True, timeout=600)


def measure(inventory: Path, script: Path, mib: int) -> tuple[float, float]:
    """Launch ``script MIB`` on the inventory's hosts: the bandwidth (GB/s) and latency (us) it printed."""
    out = lab("launch", "--hosts", str(inventory), "--timeout", "300", str(script), str(mib))
    found = RESULT.search(out)
    if found is None:
        raise SystemExit(f"no result in:\n{out[-2000:]}")
    return float(found.group(1)), float(found.group(2))
