"""Benchmark: what the flight recorders cost a rank, as throughput ratios: the lab's (lab.rank.flight,
which reads torch's: lab.rank.torchcalls), and torch's own (TORCH_FR_BUFFER_SIZE: on, as the lab
leaves it, or 0: off).

Two workloads of two local gloo ranks, each run with torch's recorder on and off in turn (on, off,
off, on, ...: a shared machine drifts more over a run than the recorders cost):

* ``all_reduce``: CALLS all_reduces of 1 KiB with the lab's wrappers (lab.rank.calls.install: the
  method check and the flight recorder, its watcher's thread running, its events going to /dev/null)
  and CALLS without them (torch's own functions put back), in blocks of BLOCK calls taken in turn
  (ABBA) in the same processes. Ratio: calls per second with the lab's recorder / without.
* ``ddp``: STEPS training steps of a small DDP model (its gradient all_reduce issued by DDP's reducer
  from C++, which the lab reads from torch's recorder) with the lab's recorder and without it, in
  blocks of STEP_BLOCK steps taken in turn (ABBA) in the same processes: without, torch's functions
  are put back and the watcher's looks do nothing. Ratio: steps per second with / without.

And, for each workload, torch's recorder on / off: calls (steps) per second with it on / with it off,
the lab's recorder on in both. Each figure is the median of --repeat runs' medians. Goal: >= 0.97 for
the lab's recorder on the all_reduce loop; the others are reported (torch's recorder is torch's).

    python benchmarks/recorder_cost.py [--calls 10000] [--steps 300] [--repeat 3]
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
STEP_BLOCK = 10  # training steps timed at a time
FR_ON = "256"  # the buffer the lab gives torch's recorder where the environment does not say (lab.rank.torchfr)


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


def start_rank(rank: int, port: int) -> list[tuple[Any, str, Any, Any]]:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    import torch.distributed as dist

    from lab.rank import protocol
    from lab.rank.quiet import PROGRESS_EVERY
    from lab.rank.watcher import WATCHER, Watcher

    protocol.CHANNEL = protocol.Channel(os.open(os.devnull, os.O_WRONLY), "bench")
    wrapped = install()
    # (the watcher's looks, as an attribute of the watcher that a block without it replaces)
    wrapped.append((WATCHER, "_tick", lambda now: PROGRESS_EVERY, Watcher._tick.__get__(WATCHER)))
    WATCHER.watch(rank)
    dist.init_process_group("gloo")
    return wrapped


def use(wrapped: list[tuple[Any, str, Any, Any]], recorded: bool) -> None:
    for owner, name, own, wrapper in wrapped:
        setattr(owner, name, wrapper if recorded else own)


def all_reduces(rank: int, port: int, calls: int) -> list[list[float]]:
    """Seconds of each block of all_reduces, without the lab's wrappers and with them, in turns."""
    import torch
    import torch.distributed as dist

    wrapped = start_rank(rank, port)
    tensor = torch.ones(NUMEL)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for block in range(-2, 2 * (calls // BLOCK)):
        recorded = block % 4 in (0, 3)  # ABBA
        use(wrapped, recorded)
        started = time.perf_counter()
        for _ in range(BLOCK if block >= 0 else WARMUP):
            dist.all_reduce(tensor)
        if block >= 0:
            seconds[recorded].append(time.perf_counter() - started)
    dist.barrier()
    dist.destroy_process_group()
    return [[t / BLOCK for t in seconds[False]], [t / BLOCK for t in seconds[True]]]


def ddp_steps(rank: int, port: int, steps: int) -> list[list[float]]:
    """Seconds of each block of training steps of a small DDP model, without the lab's recorder and
    with it, in turns."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    wrapped = start_rank(rank, port)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                                        torch.nn.Linear(128, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for block in range(-2, 2 * (steps // STEP_BLOCK)):
        recorded = block % 4 in (0, 3)  # ABBA
        use(wrapped, recorded)
        started = time.perf_counter()
        for _ in range(STEP_BLOCK):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if block >= 0:
            seconds[recorded].append((time.perf_counter() - started) / STEP_BLOCK)
    use(wrapped, True)
    dist.barrier()
    dist.destroy_process_group()
    return [seconds[False], seconds[True]]


def run_pair(workload: str, count: int, torch_fr: bool) -> Any:
    """Run the two ranks; what rank 0 measured."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "TORCH_FR_BUFFER_SIZE": FR_ON if torch_fr else "0"}
    ranks = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--workload",
                               workload, "--count", str(count)],
                              stdout=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    outs = [p.communicate(timeout=900)[0] for p in ranks]
    if any(p.returncode for p in ranks):
        raise SystemExit(f"a rank failed: {[p.returncode for p in ranks]}")
    return json.loads(outs[0].splitlines()[-1])


def turns(repeat: int) -> list[bool]:
    """torch's recorder on and off in turns, ABBA: on, off, off, on, ..."""
    return [i % 4 in (0, 3) for i in range(2 * repeat)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        measured = (all_reduces if args.workload == "all_reduce" else ddp_steps)(args.rank, args.port, args.count)
        if args.rank == 0:
            print(json.dumps(measured))
        return 0
    median = statistics.median
    ratios: dict[str, float] = {}
    for workload, count, unit in (("all_reduce", args.calls, "call"), ("ddp", args.steps, "step")):
        lab_ratio: dict[bool, list[float]] = {True: [], False: []}
        with_lab: dict[bool, list[float]] = {True: [], False: []}
        for torch_fr in turns(args.repeat):
            without, recorded = run_pair(workload, count, torch_fr)
            lab_ratio[torch_fr].append(median(without) / median(recorded))
            with_lab[torch_fr].append(median(recorded))
        what = "all_reduces of 1 KiB" if workload == "all_reduce" else "training steps of a 64-128-4 MLP, batch 32"
        print(f"{workload}: {count} {what}, 2 gloo ranks, the lab's recorder on and off in turns; {args.repeat} "
              "runs with torch's recorder on and as many with it off:")
        for torch_fr in (True, False):
            print(f"  torch's recorder {'on ' if torch_fr else 'off'}: {1e6 * median(with_lab[torch_fr]):.1f} us a "
                  f"{unit} with the lab's; the lab's recorder's ratio {median(lab_ratio[torch_fr]):.3f} (runs: "
                  f"{', '.join(f'{r:.3f}' for r in lab_ratio[torch_fr])})")
        ratios[workload] = median(lab_ratio[True])
        print(f"  torch's recorder on / off (whole runs, the lab's on): "
              f"{median(with_lab[False]) / median(with_lab[True]):.3f}")
    ratio = min(ratios.values())
    print(f"the lab's recorder, torch's on: {ratios['all_reduce']:.3f} on the all_reduce loop, {ratios['ddp']:.3f} "
          f"on the DDP loop (goal >= {GOAL}) {'ok' if ratio >= GOAL else 'MISSED'}")
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
