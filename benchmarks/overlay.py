"""Benchmark: across two VPCs, the lab's WireGuard overlay against the peered direct path.

A cross-VPC lab of two hosts, one in each VPC, with peering on (the baseline: the ranks' own
private addresses, routed between the VPCs) and the overlay up at the same time (`lab net overlay
up`: WireGuard through the NAT, userspace wireguard-go beside each host). Each round, on each path
in turn, two ranks time a 64 MiB all_reduce (busbw, as nccl-tests reports it: for 2 ranks the
algorithm bandwidth) and a 4-byte round trip (send then recv, the median of 200). Figures are the
medians of --repeat rounds; the ratios are overlay / peered (below 1 for bandwidth and above 1
for latency: what the overlay costs).

    python benchmarks/overlay.py [--repeat 5] [--mib 64]

Needs the Docker engine; builds the lab image when it is missing (`make lab-up` does too).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.labcli import lab, lab_down, measure

LAB = "bench-xvpc"
SCRIPT = """\
import statistics, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
big, small = torch.ones(int(sys.argv[1]) << 18), torch.ones(1)
for _ in range(2):
    dist.all_reduce(big)
times = []
for _ in range(5):
    dist.barrier(); start = time.perf_counter(); dist.all_reduce(big); times.append(time.perf_counter() - start)
pings = []
for _ in range(200):
    start = time.perf_counter()
    if rank == 0:
        dist.send(small, 1); dist.recv(small, 1)
    elif rank == 1:
        dist.recv(small, 0); dist.send(small, 0)
    pings.append(time.perf_counter() - start)
if rank == 0:
    busbw = big.numel() * 4 / min(times) * 2 * (size - 1) / size / 1e9
    print(f"BENCH {busbw:.4f} GB/s {statistics.median(pings) * 1e6:.1f} us")
"""
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--mib", type=int, default=64, help="the all_reduce's tensor (default 64 MiB)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lab-bench-overlay-"))
    paths = {"peered": work / f"{LAB}.inventory.yaml", "overlay": work / f"{LAB}.overlay.inventory.yaml"}
    try:
        print(f"lab up --topology cross-vpc --hosts 2 --peering ({LAB})")
        lab("up", "--name", LAB, "--topology", "cross-vpc", "--hosts", "2", "--peering", "--no-smoke",
            "--inventory", str(paths["peered"]))
        print(lab("net", "--name", LAB, "overlay", "up", "--inventory", str(paths["overlay"])))
        script = work / "bench.py"
        script.write_text(SCRIPT)
        results: dict[str, list[tuple[float, float]]] = {path: [] for path in paths}
        for round_ in range(args.repeat):
            for path, inventory in paths.items():
                results[path].append(measure(inventory, script, args.mib))
            print(f"round {round_ + 1}: " + ", ".join(f"{p} {r[-1][0]:.3f} GB/s {r[-1][1]:.0f} us"
                                                      for p, r in results.items()))
        bandwidth = {p: statistics.median(b for b, _ in r) for p, r in results.items()}
        latency = {p: statistics.median(u for _, u in r) for p, r in results.items()}
        print(f"\nacross two VPCs, 2 ranks: all_reduce of {args.mib} MiB (busbw) and a 4-byte round trip "
              f"(median of {args.repeat}):")
        for path in paths:
            print(f"  {path:8} {bandwidth[path]:7.3f} GB/s   round trip {latency[path]:7.0f} us")
        print(f"  overlay / peered: busbw {bandwidth['overlay'] / bandwidth['peered']:.2f}x, "
              f"round trip {latency['overlay'] / latency['peered']:.2f}x")
    finally:
        lab_down(LAB)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
