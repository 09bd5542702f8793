"""Checker of the backends exercise: what each host has, and the collectives' values."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.suite.check import Expect, Results, Verdict, World
from lab.suite.checks import is_number, reported

BACKEND_NAMES = ("gloo", "nccl", "mpi")


def check_backends(results: Results, world: World) -> Verdict:
    """The run's backend on every rank, on the device it implies; ranks on one host report
    the same availability and GPU count; the collectives' values are right."""
    e = Expect()
    n = world.world_size
    ranks = reported(e, results, world)
    first_on_host: dict[str, int] = {}
    for rank, result in ranks.items():
        host = world.hosts[rank]
        available: Any = result.get("available")  # untrusted: checked below
        gpus: Any = result.get("gpus")
        well_formed = e.true(rank, "available backends", _is_availability(available),
                             expected="{gloo, nccl, mpi: true/false}", got=available)
        well_formed &= e.true(rank, "torch.cuda.device_count()", isinstance(gpus, int) and not isinstance(gpus, bool)
                              and gpus >= 0, expected="a count", got=gpus)
        e.equal(rank, "dist.get_backend() (the run's backend)", world.backend, result.get("backend"))
        if well_formed:
            first = first_on_host.setdefault(host, rank)
            if first != rank:
                e.equal(rank, f"available backends (as rank {first} on the same host {host})",
                        ranks[first].get("available"), available)
                e.equal(rank, f"GPUs (as rank {first} on the same host {host})", ranks[first].get("gpus"), gpus)
            e.equal(rank, "gloo available (it ships with every PyTorch binary)", True, available["gloo"])
            _check_device(e, rank, world, result, available, gpus)
        e.equal(rank, "all_reduce SUM of rank + 1", float(n * (n + 1) // 2), result.get("all_reduce"))
        e.equal(rank, f"broadcast from rank {n - 1}", [100.0 * (n - 1) + 1, 100.0 * (n - 1) + 2],
                result.get("broadcast"))
        e.equal(rank, "all_gather of the ranks", [float(r) for r in range(n)], result.get("all_gather"))
        e.equal(rank, "all_reduce SUM of rank * rank on a gloo group of CPU tensors",
                float(sum(r * r for r in range(n))), result.get("gloo_cpu_all_reduce"))
    _note_gpus(e, world, ranks)
    return e.verdict()


def _check_device(e: Expect, rank: int, world: World, result: Mapping[str, Any], available: Mapping[str, bool],
                  gpus: int) -> None:
    local = world.local_ranks[rank]
    if world.backend == "nccl":
        e.equal(rank, "nccl available (the run's backend)", True, available["nccl"])
        e.equal(rank, "device (nccl: the GPU of the rank's local rank)", f"cuda:{local}", result.get("device"))
        e.true(rank, "GPUs on the host (nccl: one per rank)", gpus > local, expected=f"more than {local}", got=gpus)
    else:
        e.equal(rank, f"device ({world.backend}: CPU tensors)", "cpu", result.get("device"))


def _note_gpus(e: Expect, world: World, ranks: Mapping[int, Mapping[str, Any]]) -> None:
    if world.backend == "nccl" or len(ranks) < world.world_size:
        return
    slots = {h: world.hosts.count(h) for h in world.hosts}
    gpus: dict[str, Any] = {world.hosts[r]: result.get("gpus") for r, result in ranks.items()}
    if not any(is_number(g) and g > 0 for g in gpus.values()):
        e.note("no rank has a GPU: the collectives ran with gloo on CPU tensors "
               "(with a GPU per rank the lab picks nccl)")
    elif all(is_number(gpus[h]) and gpus[h] >= slots[h] for h in slots):
        e.note(f"every rank has a GPU of its own: --backend nccl would run the collectives with nccl "
               f"(this run used {world.backend})")
    else:
        short = sorted(h for h in slots if not (is_number(gpus[h]) and gpus[h] >= slots[h]))
        e.note(f"host(s) {', '.join(short)} have fewer GPUs than ranks: nccl needs one GPU per rank, "
               f"so the collectives ran with {world.backend}")


def _is_availability(value: Any) -> bool:
    return (isinstance(value, Mapping) and set(value) == set(BACKEND_NAMES)
            and all(isinstance(v, bool) for v in value.values()))
