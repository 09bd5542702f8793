"""Benchmark: the doctor's all-pairs check makes every connection at once.

N local hosts (``ansible_connection: local``, over loopback), each connection held back
by an artificial delay (``LAB_PROBE_CONNECT_DELAY``, which only benchmarks set). The
mesh phase of :func:`lab.doctor.diagnose` should take about one delay (the slowest
pair), not the sum. In the same run, the same N*(N-1) connections are made one after
the other with the probe's own :func:`lab.rank.probe.check_link` against the probe's own
listeners: the sequential baseline, next to the computed N*(N-1)*delay. The mesh phase
without any delay is measured too: the fixed cost (threads, handshakes, the controller's
round trip).

    python benchmarks/doctor_mesh.py [--hosts 8] [--delay 0.25] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.doctor.run import diagnose
from lab.inventory.hosts import load_inventory
from lab.rank.netfacts import Target
from lab.rank.probe import DELAY_VAR, Listener, check_link

TIMEOUT = 5.0


def parallel_mesh(hosts: int, delay: float, repeat: int) -> list[float]:
    """The mesh phase of diagnose() on ``hosts`` local hosts, ``repeat`` times (seconds each)."""
    with tempfile.TemporaryDirectory() as directory:
        inventory = Path(directory, "inventory.yaml")
        inventory.write_text("all:\n  vars: {ansible_connection: local}\n  hosts:\n"
                             + "".join(f"    h{i}: {{}}\n" for i in range(1, hosts + 1)))
        os.environ[DELAY_VAR] = str(delay)
        try:
            times = []
            for _ in range(repeat):
                diagnosis = diagnose(load_inventory(inventory), timeout=TIMEOUT)
                mesh = diagnosis.mesh()
                assert diagnosis.ok and len(mesh) == hosts * (hosts - 1), diagnosis.findings
                assert all(link.ok for link in mesh.values())
                times.append(diagnosis.seconds["mesh"])
            return times
        finally:
            del os.environ[DELAY_VAR]


def sequential_mesh(hosts: int, delay: float) -> float:
    """The same pairs, one connection after the other, against the probe's listeners."""
    token = secrets.token_hex(6)
    names = [f"h{i}" for i in range(1, hosts + 1)]
    listeners = {name: Listener(name, token, 0, TIMEOUT) for name in names}
    try:
        started = time.monotonic()
        for source in names:
            for peer in names:
                if peer != source:
                    link = check_link(Target("mesh", peer, "127.0.0.1", listeners[peer].port), source, token,
                                      TIMEOUT, delay)
                    assert link.ok, link
        return time.monotonic() - started
    finally:
        for listener in listeners.values():
            listener.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.25, help="seconds each connection waits first")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.hosts < 2 or args.delay <= 0 or args.repeat < 1:
        parser.error("needs --hosts >= 2, --delay > 0 and --repeat >= 1")
    pairs = args.hosts * (args.hosts - 1)
    fixed = statistics.median(parallel_mesh(args.hosts, 0.0, args.repeat))
    parallel = parallel_mesh(args.hosts, args.delay, args.repeat)
    sequential = sequential_mesh(args.hosts, args.delay)
    median = statistics.median(parallel)
    print(f"hosts {args.hosts}, pairs {pairs}, delay {args.delay:g}s per connection")
    print(f"sequential baseline: computed {pairs * args.delay:.2f}s (n*(n-1)*delay), measured {sequential:.2f}s")
    print(f"doctor mesh phase:   {', '.join(f'{t:.2f}s' for t in parallel)} (median {median:.2f}s = "
          f"{median / args.delay:.2f}x the delay; {fixed:.2f}s without a delay)")
    print(f"speed-up: {sequential / median:.1f}x (sequential measured / parallel median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
