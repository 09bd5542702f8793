"""Benchmark: what the flight recorder costs a rank (lab.rank.flight), as a throughput ratio.

Two local gloo ranks make CALLS all_reduces of 1 KiB each with the lab's wrappers
(lab.rank.calls.install: the method check and the flight recorder, its progress thread running,
its events going to /dev/null), and CALLS without them (torch's own functions and methods put
back), in blocks of BLOCK calls taken in turn (ABBA), so that both see the same machine: on a
shared machine a whole run with and a whole run without differ by more than the recorder costs.
Rank 0 times the blocks; the ratio is calls per second with the recorder / without, the median
of --repeat runs (fresh ranks each), each the ratio of the median blocks (a block that another
process slowed down weighs nothing).  Goal: >= 0.97.

    python benchmarks/recorder_cost.py [--calls 10000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
GOAL = 0.97
WARMUP = 500  # calls before the timed ones
BLOCK = 50  # calls timed at a time
NUMEL = 256  # float32: 1 KiB


def install() -> list[tuple[Any, str, Any, Any]]:
    """Install the lab's wrappers; (owner, name, torch's own, the lab's wrapper) of each."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from lab.rank.calls import install

    owners = (dist, c10d, c10d.ProcessGroup)
    before = [dict(vars(owner)) for owner in owners]  # (a class's own entries: its methods as descriptors)
    install()
    return [(owner, name, own, vars(owner)[name]) for owner, own_vars in zip(owners, before)
            for name, own in own_vars.items() if vars(owner).get(name) is not own]


def rank_main(rank: int, port: int, calls: int) -> None:
    """One rank: ``calls`` all_reduces each way, in turns (rank 0 prints the seconds of each way)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    import torch
    import torch.distributed as dist

    from lab.rank import protocol
    from lab.rank.flight import FLIGHT

    protocol.CHANNEL = protocol.Channel(os.open(os.devnull, os.O_WRONLY), "bench")
    wrapped = install()
    FLIGHT.watch(rank)
    dist.init_process_group("gloo")
    tensor = torch.ones(NUMEL)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for block in range(-2, 2 * (calls // BLOCK)):
        recorded = block % 4 in (0, 3)  # ABBA
        for owner, name, own, wrapper in wrapped:
            setattr(owner, name, wrapper if recorded else own)
        started = time.perf_counter()
        for _ in range(BLOCK if block >= 0 else WARMUP):
            dist.all_reduce(tensor)
        if block >= 0:
            seconds[recorded].append(time.perf_counter() - started)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps([seconds[False], seconds[True]]))


def timed(calls: int) -> tuple[list[float], list[float]]:
    """The seconds rank 0 took for each block of all_reduces without the recorder, and with it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--calls", str(calls)],
                              stdout=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in ranks]
    if any(p.returncode for p in ranks):
        raise SystemExit(f"a rank failed: {[p.returncode for p in ranks]}")
    plain, recorded = json.loads(outs[0].splitlines()[-1])
    return plain, recorded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.calls)
        return 0
    runs = [timed(args.calls) for _ in range(args.repeat)]
    ratios = sorted(statistics.median(plain) / statistics.median(recorded) for plain, recorded in runs)
    ratio = statistics.median(ratios)
    plain, recorded = (statistics.median(t for run in runs for t in run[i]) / BLOCK for i in (0, 1))
    print(f"{args.calls} all_reduces of 1 KiB each way, 2 gloo ranks, in blocks of {BLOCK}; {args.repeat} runs:")
    print(f"  without the recorder  {1e6 * plain:.1f} us a call (the median block's)")
    print(f"  with the recorder     {1e6 * recorded:.1f} us a call")
    print(f"  throughput ratio      {ratio:.3f}  (runs: {', '.join(f'{r:.3f}' for r in ratios)}; goal >= {GOAL})  "
          f"{'ok' if ratio >= GOAL else 'MISSED'}")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
