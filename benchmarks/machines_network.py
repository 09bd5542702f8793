"""Benchmark: a lab across Docker machines, overlay network against host network.

Two lab hosts on two different machines exchange a tensor with gloo (point to point,
send then recv, as the ring exercises do) and a 4-byte ping-pong, once over the lab's
overlay network (VXLAN between the machines) and once with `--network host` (each host on
its machine's own address: the baseline, what real multi-node training runs on). Each
figure is the median of --repeat rounds, alternating the two labs; the ratios are overlay /
host (1.0 for both: the overlay costs nothing; below 1 for bandwidth and above 1 for
latency: what it costs).

    python benchmarks/machines_network.py [--machines FILE] [--repeat 5] [--mib 64]

With no --machines it starts two stand-in machines on this one, as the tests do
(tests/machines.py: containers each running their own dockerd and sshd), and removes them
afterwards. Needs the Docker engine and the lab image (`make lab-up` builds it).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import docker

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.labcli import lab, lab_down, measure  # noqa: E402
from lab.containerlab import state  # noqa: E402
from tests import machines  # noqa: E402

PREFIX = "lab-bench-machine"
LABS = {"overlay": "bench-overlay", "host": "bench-host"}
SCRIPT = """\
import statistics, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, peer = dist.get_rank(), 1 - dist.get_rank()
def exchange(t):
    if rank == 0:
        dist.send(t, peer); dist.recv(t, peer)
    else:
        dist.recv(t, peer); dist.send(t, peer)
big, small = torch.ones(int(sys.argv[1]) << 18), torch.ones(1)
for _ in range(2):
    exchange(big)
times = []
for _ in range(5):
    start = time.perf_counter(); exchange(big); times.append(time.perf_counter() - start)
pings = []
for _ in range(200):
    start = time.perf_counter(); exchange(small); pings.append(time.perf_counter() - start)
if rank == 0:
    print(f"BENCH {2 * big.numel() * 4 / min(times) / 1e9:.4f} GB/s {statistics.median(pings) * 1e6:.1f} us")
"""
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", help="machines.yaml of two machines (default: two stand-ins on this one)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64, help="tensor size for the bandwidth (default 64 MiB)")
    args = parser.parse_args()
    client = docker.from_env()
    work = Path(tempfile.mkdtemp(prefix="lab-bench-machines-"))
    stand_ins = args.machines is None
    try:
        if stand_ins:
            print("starting two stand-in machines (tests/machines.py)")
            machines.remove(client, PREFIX)
            file = machines.start(client, machines.build(client, state.home()), PREFIX, 2, work).file
        else:
            file = Path(args.machines)
        inventories = {mode: work / f"{name}.inventory.yaml" for mode, name in LABS.items()}
        for mode, name in LABS.items():
            print(f"lab up --network {mode} ({name})")
            lab("up", "--machines", str(file), "--name", name, "--network", mode, "--inventory",
                str(inventories[mode]), "--no-smoke", *(["--hosts", "2"] if mode == "overlay" else []))
        script = work / "exchange.py"
        script.write_text(SCRIPT)
        results: dict[str, list[tuple[float, float]]] = {mode: [] for mode in LABS}
        for round_ in range(args.repeat):
            for mode in LABS:
                results[mode].append(measure(inventories[mode], script, args.mib))
            print(f"round {round_ + 1}: " + ", ".join(f"{m} {r[-1][0]:.3f} GB/s {r[-1][1]:.0f} us"
                                                      for m, r in results.items()))
        bandwidth = {m: statistics.median(b for b, _ in r) for m, r in results.items()}
        latency = {m: statistics.median(u for _, u in r) for m, r in results.items()}
        print(f"\ngloo send/recv of {args.mib} MiB between hosts on two machines (median of {args.repeat}):")
        for mode in LABS:
            print(f"  {mode:8} {bandwidth[mode]:7.3f} GB/s   ping-pong {latency[mode]:7.0f} us")
        print(f"  overlay / host: bandwidth {bandwidth['overlay'] / bandwidth['host']:.2f}x, "
              f"latency {latency['overlay'] / latency['host']:.2f}x")
    finally:
        for name in LABS.values():
            lab_down(name)
        if stand_ins:
            machines.remove(client, PREFIX)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
