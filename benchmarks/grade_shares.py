"""Benchmark: what keeping shares apart costs `lab grade --hosts`.

A class of N copies of a correct ring (tests/class/ring/alice.py), graded on the container lab's
node1 with 4 slots as two shares at once (``--parallel 2``: users share1 and share2 on one host),
alternately with everything that keeps shares apart in place (lab.containerlab.shares: the packet
filter, a control group per share, /proc hidepid; lab.containerlab.sharehosts: a network of its own
per share, through share hosts) and with all of it undone (the filter's chains emptied, the groups
unmounted, /proc as it was, and the grader run without share hosts, each share on the host's own
network; the marker left, so the grader still grades the shares at once): seconds per submission,
and the ratio (goal at most 1.2). Everything is put back at the end. Needs the default lab up
(``make lab-up``); it takes the lab for itself while it runs.

    python benchmarks/grade_shares.py [--students 10] [--repeat 3]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lab.containerlab import engine, helper, shares  # noqa: E402
from lab.containerlab.topology import Topology  # noqa: E402

CORRECT = REPO / "tests" / "class" / "ring" / "alice.py"
LAB = [sys.executable, "-m", "lab"]
# The same CLI with the shares on the hosts' own network (no share hosts): the baseline's grader.
ON_HOSTS_NETWORK = [sys.executable, "-c", "import runpy, sys; import lab.grading.places as places; "
                    "places.through_share_hosts = lambda split, lab, say: (split, [h.name for h in split[0].hosts]); "
                    "sys.argv[0] = 'lab'; runpy.run_module('lab', run_name='__main__')"]
EMPTY = " && ".join(f"iptables -w 5 -t {table} -F {chain}" for table, chain in
                    (("mangle", "LAB-SHARES-OUT"), ("mangle", "LAB-SHARES-IN"), ("filter", "LAB-SHARES-ANSWER")))
UNGROUP = (" && ".join(f"umount {shares.GROUPS}/{c}" for c in shares.CONTROLLERS)
           + " && mount -o remount,hidepid=off /proc")


def keep_apart(client: docker.DockerClient, topology: Topology, on: bool) -> None:
    """node1 with everything that keeps shares apart in place, or with all of it undone."""
    helper.in_namespace(client, topology, 1, shares.filter_script() if on else EMPTY)
    helper.in_mounts(client, topology, 1, shares.groups_script() if on else UNGROUP)


def one_host(directory: Path) -> Path:
    """The lab's inventory cut to node1, with 4 slots (the key paths as the lab wrote them)."""
    data = yaml.safe_load((REPO / "inventory.yaml").read_text())
    data["all"]["vars"]["slots"] = 4
    data["all"]["hosts"] = {"node1": data["all"]["hosts"]["node1"]}
    path = directory / "node1x4.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def grade(root: Path, inventory: Path, out: Path, apart: bool) -> float:
    started = time.monotonic()
    done = subprocess.run([*(LAB if apart else ON_HOSTS_NETWORK), "grade", str(root), "--exercise", "ring-allreduce",
                           "--hosts", str(inventory), "--parallel", "2", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or "cannot keep shares apart" in done.stdout or apart == ("share its ports" in done.stdout):
        sys.exit(f"lab grade failed, graded one share at a time or not as asked:\n{done.stdout[-2000:]}"
                 f"{done.stderr[-2000:]}")
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    client, topology = engine.client(), Topology()
    with_filter: list[float] = []
    without: list[float] = []
    try:
        with tempfile.TemporaryDirectory() as directory:
            root = Path(directory, "class")
            root.mkdir()
            for i in range(args.students):
                shutil.copyfile(CORRECT, root / f"student{i:02d}.py")
            inventory = one_host(Path(directory))
            for round_ in range(args.repeat):
                keep_apart(client, topology, True)
                with_filter.append(grade(root, inventory, Path(directory, f"on{round_}"), True) / args.students)
                keep_apart(client, topology, False)
                without.append(grade(root, inventory, Path(directory, f"off{round_}"), False) / args.students)
    finally:
        keep_apart(client, topology, True)
    on, off = statistics.median(with_filter), statistics.median(without)
    print(f"{args.students} ring-allreduce submissions, 2 shares at once on node1, {args.repeat} round(s)")
    print(f"  with the shares kept apart {on:5.2f}s per submission  ({', '.join(f'{t:.2f}' for t in with_filter)})")
    print(f"  with all of that undone    {off:5.2f}s per submission  ({', '.join(f'{t:.2f}' for t in without)})")
    print(f"isolation cost (with / without): {on / off:.2f}x  (goal <= 1.2)")


if __name__ == "__main__":
    main()
