"""The checkers on synthetic results: no torch, no processes.

Each correct result is built the way the reference program reports it; each wrong one
changes one thing, and the verdict must fail on the right rank with a reason that says
what was expected and what came instead.
"""
from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from lab.core import launchers
from lab.core.random_inputs import draw, new_seed, values
from lab.suite.check import Launched, Mismatch, Verdict, World, distinct
from lab.suite.checks import backends, basics, collectives, dsgd, p2p, ring
from lab.suite.exercises import dsgd_settings, ring_cases

Results = dict[int, Any]
SIZES = [2, 3, 4]


def processes_ok(n: int) -> Results:
    return {r: {"pid": 100 + r, "reports": [[m, i, 1000 + 10 * r + 2 * k + i]
                                            for k, m in enumerate(("Process", "spawn")) for i in range(2)]}
            for r in range(n)}


def groups_ok(n: int) -> Results:
    members = list(range(0, n, 2))
    total = float(sum(m + 1 for m in members))
    return {r: {"rank": r, "world_size": n, "members": members,
                "group_rank": members.index(r) if r in members else -1,
                "group_size": len(members) if r in members else -1,
                "value": total if r in members else float(r + 1)} for r in range(n)}


def launchers_ok(n: int, hosts: tuple[str, ...] | None = None, launched: Launched = Launched()) -> Results:
    """What each rank reports when its launcher numbered it right, ``hosts[rank]`` its host."""
    hosts = hosts or ("local",) * n
    results = {}
    for r in range(n):
        mates = [m for m in range(n) if hosts[m] == hosts[r]]
        env = {"RANK": str(r), "LOCAL_RANK": str(mates.index(r)), "WORLD_SIZE": str(n),
               "LOCAL_WORLD_SIZE": str(len(mates)), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
               "GROUP_RANK": str(sorted(set(hosts), key=hosts.index).index(hosts[r]))
               if launched.sets_group_rank else None}
        results[r] = {"rank": r, "world_size": n, "env": env, "pid": 100 + r, "parent": 50 + mates[0]}
    return results


def init_ok(n: int, method: str = "tcp://10.0.0.1:29500") -> Results:
    results = {r: {"init_method": method, "rank": r, "world_size": n, "sum": n * (n + 1) / 2} for r in range(n)}
    if method == "env://":
        for r, result in results.items():
            result["env"] = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": str(r), "WORLD_SIZE": str(n)}
    return results


def p2p_ok(n: int) -> Results:
    return {r: {"pair": 1.0 if r < 2 else 0.0, "ring": float((r - 1) % n)} for r in range(n)}


def broadcast_ok(n: int) -> Results:
    return {r: {f"from_{s}": [1.0 + 100 * s, 2.0 + 100 * s, 3.0 + 100 * s] for s in (0, n - 1)} for r in range(n)}


def filled(v: float) -> list[list[float]]:
    return [[v, v], [v, v]]


FACTORIAL = {2: 2, 3: 6, 4: 24}


def reductions(n: int) -> dict[str, list[list[float]]]:
    return {"SUM": filled(n * (n + 1) / 2), "PRODUCT": filled(FACTORIAL[n]), "MAX": filled(n), "MIN": filled(1)}


def reduce_ok(n: int) -> Results:
    return {r: reductions(n) if r == 0 else {} for r in range(n)}


def all_reduce_ok(n: int) -> Results:
    return {r: reductions(n) for r in range(n)}


def scatter_ok(n: int) -> Results:
    return {r: {"received": [10.0 * (r + 1)]} for r in range(n)}


def gather_ok(n: int) -> Results:
    return {r: {"gathered": [[float(i)] for i in range(n)]} if r == 0 else {} for r in range(n)}


def all_gather_ok(n: int) -> Results:
    return {r: {"gathered": [[float(i)] for i in range(n)]} for r in range(n)}


def reduce_scatter_ok(n: int) -> Results:
    return {r: {"received": [10 ** r * n * (n - 1) // 2]} for r in range(n)}


def barrier_ok(n: int) -> Results:
    last = 1000.0 + 0.2 * (n - 1)
    return {r: {"arrived": 1000.0 + 0.2 * r, "left": last + 0.001 * r} for r in range(n)}


@cache
def ring_inputs(n: int) -> dict[int, tuple[int, ...]]:
    """A draw of every rank's inputs, as the controller makes one (lab.core.random_inputs), fixed per world size."""
    generator = random.Random(n)
    return {r: tuple(generator.randint(-2 ** 15, 2 ** 15 - 1) for _ in range(ring_cases.DRAWN)) for r in range(n)}


def ring_world(n: int) -> World:
    return replace(World.local(n), inputs=ring_inputs(n))


def ring_sum(n: int, shape: tuple[int, ...], position: int, function: str = "ring_allreduce") -> int:
    """The SUM over the ranks of their inputs at ``position`` of ``shape``'s case of ``function``."""
    at = ring_cases.starts(function)[shape] + position
    return sum(values[at] for values in ring_inputs(n).values())


def ring_input(n: int, rank: int, shape: tuple[int, ...], position: int, function: str = "ring_allreduce") -> int:
    return ring_inputs(n)[rank][ring_cases.starts(function)[shape] + position]


def inputs_there(n: int, shape: tuple[int, ...], positions: tuple[int, ...], function: str = "ring_allreduce") -> str:
    """How a reason shows the ranks' inputs at the wrong positions."""
    return "(the inputs there: " + "; ".join(f"rank {r} {[ring_input(n, r, shape, i, function) for i in positions]}"
                                            for r in range(n)) + ")"


@cache
def _ring_cases(n: int, function: str) -> dict[str, dict]:
    """Every case's correct report of ``function``, as the rank program makes it (floats for float dtypes)."""
    cases = {}
    for shape in ring_cases.SHAPES:
        want = ring_cases.digest([ring_sum(n, shape, i, function) for i in range(ring_cases.numel(shape))], n)
        for dtype in ring_cases.DTYPES:
            as_dtype = float if dtype.startswith("float") else int
            case: dict[str, Any] = {"shape": list(shape), "dtype": dtype}
            if "values" in want:
                case["values"] = [as_dtype(v) for v in want["values"]]
            else:
                case.update(numel=want["numel"], samples=[[p, as_dtype(v)] for p, v in want["samples"]],
                            sum=as_dtype(want["sum"]), weighted=as_dtype(want["weighted"]))
            cases[ring_cases.case_name(shape, dtype)] = case
    return cases


def ring_ok(n: int) -> Results:
    return {r: {function: copy.deepcopy(_ring_cases(n, function)) for function in ring_cases.FUNCTIONS}
            for r in range(n)}


DSGD_NAMES = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
DSGD_SIZES = [32, 8, 16, 2]


def dsgd_model(n: int, scale: float = 1.0) -> dict[str, Any]:
    """One model's report: digests that change every step, a first step of ``scale`` times
    one process's, the losses of the epochs."""
    steps = dsgd_settings.EPOCHS * dsgd_settings.steps_per_epoch(n)
    initial = [0.01 * i for i in range(dsgd_settings.PARAMETERS)]
    return {"losses": [0.7, 0.6, 0.5],
            "steps": [[0.1 * k + j for j in range(4)] + [1.0 + k] for k in range(steps)],
            "first": [x + 0.001 * scale * (1 + i % 3) for i, x in enumerate(initial)],
            "final": [x + 0.5 for x in initial]}


def dsgd_ok(n: int) -> Results:
    return {r: {"batch_per_rank": dsgd_settings.GLOBAL_BATCH // n,
                "samples_per_rank": int(1.0 / n * dsgd_settings.SAMPLES),
                "names": list(DSGD_NAMES), "sizes": list(DSGD_SIZES),
                "initial": [0.01 * i for i in range(dsgd_settings.PARAMETERS)],
                "dsgd": dsgd_model(n), "reference": dsgd_model(n), "ddp": dsgd_model(n)} for r in range(n)}


def backends_ok(n: int) -> Results:
    last = n - 1
    return {r: {"hostname": "vm", "available": {"gloo": True, "nccl": False, "mpi": False}, "gpus": 0,
                "backend": "gloo", "device": "cpu", "local_rank": r, "all_reduce": n * (n + 1) / 2,
                "broadcast": [100.0 * last + 1, 100.0 * last + 2], "all_gather": [float(i) for i in range(n)],
                "gloo_cpu_all_reduce": float(sum(i * i for i in range(n)))} for r in range(n)}


CHECKS: dict[str, tuple[Callable[[dict[int, dict], World], Verdict], Callable[[int], Results]]] = {
    "processes": (basics.check_processes, processes_ok),
    "groups": (basics.check_groups, groups_ok),
    "init": (basics.check_init, init_ok),
    "launchers": (basics.check_launchers, launchers_ok),
    "p2p": (p2p.check_p2p, p2p_ok),
    "p2p-async": (p2p.check_p2p_async, p2p_ok),
    "broadcast": (collectives.check_broadcast, broadcast_ok),
    "reduce": (collectives.check_reduce, reduce_ok),
    "all-reduce": (collectives.check_all_reduce, all_reduce_ok),
    "scatter": (collectives.check_scatter, scatter_ok),
    "gather": (collectives.check_gather, gather_ok),
    "all-gather": (collectives.check_all_gather, all_gather_ok),
    "reduce-scatter": (collectives.check_reduce_scatter, reduce_scatter_ok),
    "barrier": (collectives.check_barrier, barrier_ok),
    "ring-allreduce": (ring.check_ring_allreduce, ring_ok),
    "dsgd": (dsgd.check_dsgd, dsgd_ok),
    "backends": (backends.check_backends, backends_ok),
}


def verdict(name: str, results: Results, n: int) -> Verdict:
    return CHECKS[name][0](results, ring_world(n) if name == "ring-allreduce" else World.local(n))


def assert_fails(v: Verdict, rank: int, reason_start: str) -> None:
    assert not v.passed
    assert rank in v.failed_ranks
    assert v.reason.startswith(reason_start), v.reason


# --- every checker: the correct result passes, a missing or malformed one fails ---

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", CHECKS)
def test_correct_results_pass(name: str, n: int) -> None:
    v = verdict(name, CHECKS[name][1](n), n)
    assert v.passed and v.reason == "" and v.mismatches == (), v.reason


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", CHECKS)
def test_a_rank_without_a_result_fails_naming_it(name: str, n: int) -> None:
    results = CHECKS[name][1](n)
    del results[n - 1]
    v = verdict(name, results, n)
    assert_fails(v, n - 1, f"rank {n - 1}: result: expected 'a result', got 'nothing'")


@pytest.mark.parametrize("name", CHECKS)
def test_a_result_that_is_not_a_dict_fails_without_crashing(name: str) -> None:
    results = CHECKS[name][1](3)
    results[0] = [1, 2, 3]
    assert_fails(verdict(name, results, 3), 0, "rank 0: result: expected 'a dict', got [1, 2, 3]")


@pytest.mark.parametrize("name", CHECKS)
def test_a_result_with_missing_keys_fails_without_crashing(name: str) -> None:
    results = CHECKS[name][1](3)
    results[0] = {"unexpected": True}
    assert_fails(verdict(name, results, 3), 0, "rank 0: ")


# --- launchers: the variables as each launcher sets them, from where each rank ran ---

TWO_HOSTS = ("a", "a", "b", "b")


@pytest.mark.parametrize("launcher", launchers.NAMES)
def test_launchers_right_numbers_on_two_hosts_pass(launcher: str) -> None:
    launched = launchers.find(launcher).launched
    world = World(4, "gloo", TWO_HOSTS, (0, 1, 0, 1), launched)
    v = basics.check_launchers(launchers_ok(4, TWO_HOSTS, launched), world)
    assert v.passed, v.reason


def test_launchers_local_rank_counted_over_the_job_not_the_host() -> None:
    results = launchers_ok(4, TWO_HOSTS)
    results[2]["env"]["LOCAL_RANK"] = "2"  # the global rank: cuda:2 on a host of two GPUs
    v = basics.check_launchers(results, World(4, "gloo", TWO_HOSTS, (0, 1, 0, 1)))
    assert_fails(v, 2, "rank 2: LOCAL_RANK (its place among the ranks on b): expected '0', got '2'")


def test_launchers_local_world_size_and_rank_mismatch() -> None:
    results = launchers_ok(4, TWO_HOSTS)
    results[0]["env"]["LOCAL_WORLD_SIZE"] = "4"
    results[3]["env"]["RANK"] = "2"
    v = basics.check_launchers(results, World(4, "gloo", TWO_HOSTS, (0, 1, 0, 1)))
    assert v.failed_ranks == (0, 3)
    assert "rank 0: LOCAL_WORLD_SIZE (the ranks on a): expected '2', got '4'" in map(str, v.mismatches)
    assert "rank 3: RANK: expected '3', got '2'" in map(str, v.mismatches)


def test_launchers_a_hosts_ranks_must_be_consecutive() -> None:
    hosts = ("a", "b", "a", "b")  # round robin: not what torchrun or the lab does
    v = basics.check_launchers(launchers_ok(4, hosts), World(4, "gloo", hosts, (0, 0, 1, 1)))
    assert_fails(v, 0, "rank 0: the ranks on a: expected 'consecutive', got [0, 2]")


def test_launchers_one_launcher_process_per_host_and_torchrun_group_ranks() -> None:
    torchrun = launchers.find("torchrun").launched
    results = launchers_ok(4, TWO_HOSTS, torchrun)
    results[3]["parent"] = 999  # started by another process than its host's torchrun
    results[2]["env"]["GROUP_RANK"] = "0"
    v = basics.check_launchers(results, World(4, "gloo", TWO_HOSTS, (0, 1, 0, 1), torchrun))
    assert v.failed_ranks == (2, 3)
    said = list(map(str, v.mismatches))
    assert "rank 3: the process that started it (the torchrun agent of b): expected 52, got 999" in said
    assert "rank 2: GROUP_RANK (the number the launcher gave b): expected '1', got '0'" in said
    # The lab starts every rank itself: their parents may differ.
    assert basics.check_launchers(results | {2: launchers_ok(4, TWO_HOSTS)[2]},
                                  World(4, "gloo", TWO_HOSTS, (0, 1, 0, 1), launchers.find("lab").launched)).passed


# --- the tutorials' own numbers (4 ranks) ---

def test_tutorial_values_for_four_ranks() -> None:
    assert verdict("reduce-scatter", {r: {"received": [v]} for r, v in enumerate([6, 60, 600, 6000])}, 4).passed
    assert verdict("scatter", {r: {"received": [v]} for r, v in enumerate([10.0, 20.0, 30.0, 40.0])}, 4).passed
    assert verdict("all-gather", {r: {"gathered": [[0.0], [1.0], [2.0], [3.0]]} for r in range(4)}, 4).passed
    ops = {"SUM": filled(10.0), "PRODUCT": filled(24.0), "MAX": filled(4.0), "MIN": filled(1.0)}
    assert verdict("all-reduce", {r: ops for r in range(4)}, 4).passed
    assert verdict("init", {r: {"init_method": "file:///tmp/x", "rank": r, "world_size": 4, "sum": 10.0}
                            for r in range(4)}, 4).passed


# --- processes ---

def test_processes_child_reporting_twice_or_never() -> None:
    results = processes_ok(2)
    results[1]["reports"][3] = ["spawn", 0, 5555]  # spawn child 1 silent, child 0 twice
    v = verdict("processes", results, 2)
    assert_fails(v, 1, "rank 1: reports from spawn child 0: expected 1, got 2")
    assert "rank 1: reports from spawn child 1: expected 1, got 0" in map(str, v.mismatches)


def test_processes_pids_must_differ_from_each_other_and_the_rank() -> None:
    results = processes_ok(2)
    results[0]["reports"][1][2] = results[0]["reports"][0][2]
    assert_fails(verdict("processes", results, 2), 0, "rank 0: child pids: expected 'all different'")
    results = processes_ok(2)
    results[1]["reports"][2][2] = results[1]["pid"]
    assert_fails(verdict("processes", results, 2), 1, "rank 1: child pids: expected \"none equal to the rank's pid")


def test_processes_extra_or_malformed_reports() -> None:
    results = processes_ok(2)
    results[0]["reports"].append(["thread", 0, 4242])
    assert_fails(verdict("processes", results, 2), 0, "rank 0: number of reports: expected 4, got 5")
    results = processes_ok(2)
    results[1]["reports"] = [["Process", 0]]
    assert_fails(verdict("processes", results, 2), 1,
                 "rank 1: reports: expected 'a list of [method, child index, pid]'")


# --- groups ---

@pytest.mark.parametrize("n", SIZES)
def test_groups_non_member_must_see_minus_one(n: int) -> None:
    results = groups_ok(n)
    results[1]["group_rank"] = 0
    assert_fails(verdict("groups", results, n), 1, "rank 1: get_rank(group) outside the group: expected -1, got 0")


def test_groups_tutorial_subset_instead_of_even_ranks() -> None:
    results = groups_ok(4)
    for r in range(4):
        results[r]["members"] = [0, 1]
    assert_fails(verdict("groups", results, 4), 0,
                 "rank 0: new_group members (the even ranks): expected [0, 2], got [0, 1]")


def test_groups_sum_inside_and_untouched_outside() -> None:
    results = groups_ok(4)
    results[2]["value"] = 10.0
    results[3]["value"] = 4.0 + 1
    v = verdict("groups", results, 4)
    assert_fails(v, 2, "rank 2: all_reduce SUM of rank + 1 in the group: expected 4.0, got 10.0")
    assert v.failed_ranks == (2, 3)


# --- init ---

@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("method", ["env://", "tcp://h:1", "file:///shared/rdzv"])
def test_init_each_method_passes(n: int, method: str) -> None:
    assert verdict("init", init_ok(n, method), n).passed


def test_init_wrong_rank_sum_and_method() -> None:
    results = init_ok(3)
    results[2]["rank"] = 0
    results[1]["sum"] = 5.0
    v = verdict("init", results, 3)
    assert_fails(v, 1, "rank 1: all_reduce SUM of rank + 1: expected 6.0, got 5.0")
    assert "rank 2: get_rank(): expected 2, got 0" in map(str, v.mismatches)
    results = init_ok(3)
    results[2]["init_method"] = "tcp://other:2"
    assert_fails(verdict("init", results, 3), 2,
                 "rank 2: init_method (the same as rank 0's): expected 'tcp://10.0.0.1:29500'")
    results = init_ok(2)
    results[0]["init_method"] = "nccl"
    assert_fails(verdict("init", results, 2), 0, "rank 0: init_method: expected 'env://, tcp://ADDR:PORT")


def test_init_env_must_show_what_was_read() -> None:
    results = init_ok(2, "env://")
    results[1]["env"]["RANK"] = "0"
    assert_fails(verdict("init", results, 2), 1, "rank 1: RANK in the environment: expected '1', got '0'")
    results = init_ok(2, "env://")
    results[1]["env"]["MASTER_PORT"] = "1"
    assert_fails(verdict("init", results, 2), 1, "rank 1: MASTER_PORT (the same for every rank): expected '29500'")
    results = init_ok(2, "env://")
    del results[0]["env"]
    assert_fails(verdict("init", results, 2), 0, "rank 0: environment read for env://")


# --- p2p ---

@pytest.mark.parametrize("n", SIZES)
def test_p2p_ring_off_by_one(n: int) -> None:
    results = p2p_ok(n)
    for r in range(n):
        results[r]["ring"] = float(r)  # what a rank gets when everyone sends its right neighbour's rank
    assert_fails(verdict("p2p", results, n), 0, f"rank 0: send/recv ring: value received from rank {n - 1} "
                 f"(its rank): expected {float(n - 1)}, got 0.0")


def test_p2p_pair_not_received_and_async_label() -> None:
    results = p2p_ok(3)
    results[1]["pair"] = 0.0
    assert_fails(verdict("p2p", results, 3), 1, "rank 1: send/recv 0 -> 1: tensor: expected 1.0, got 0.0")
    assert_fails(verdict("p2p-async", results, 3), 1, "rank 1: isend/irecv 0 -> 1: tensor: expected 1.0, got 0.0")
    results = p2p_ok(3)
    results[2]["ring"] = -1.0  # nothing arrived
    assert_fails(verdict("p2p-async", results, 3), 2, "rank 2: isend/irecv ring: value received from rank 1")


# --- collectives ---

def test_broadcast_from_the_last_rank_not_received() -> None:
    results = broadcast_ok(4)
    results[1]["from_3"] = [0.0, 0.0, 0.0]
    assert_fails(verdict("broadcast", results, 4), 1,
                 "rank 1: broadcast from rank 3: expected [301.0, 302.0, 303.0], got [0.0, 0.0, 0.0]")


def test_reduce_checks_dst_only() -> None:
    results = reduce_ok(4)
    results[2] = {"SUM": "anything"}  # not dst: its tensor is undefined
    assert verdict("reduce", results, 4).passed
    results[0]["PRODUCT"] = filled(10.0)
    assert_fails(verdict("reduce", results, 4), 0, "rank 0: reduce PRODUCT to rank 0: "
                 "expected [[24.0, 24.0], [24.0, 24.0]], got [[10.0, 10.0], [10.0, 10.0]]")


@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_max_for_sum(n: int) -> None:
    results = all_reduce_ok(n)
    for r in range(n):
        results[r]["SUM"] = filled(float(n))
    v = verdict("all-reduce", results, n)
    s = float(n * (n + 1) // 2)
    assert v.reason == (f"rank 0: all_reduce SUM: expected {filled(s)}, got {filled(float(n))} (and {n - 1} more)")
    assert v.failed_ranks == tuple(range(n))


def test_scatter_wrong_piece_and_unsupported_note() -> None:
    results = scatter_ok(3)
    results[2]["received"] = [10.0]
    assert_fails(verdict("scatter", results, 3), 2,
                 "rank 2: scatter from rank 0: piece received: expected [30.0], got [10.0]")
    results = scatter_ok(3)
    for r in range(3):
        results[r].update(unsupported="scatter on nccl: Backend nccl does not\nsupport scatter",
                          workaround="broadcast, keep own piece")
    v = verdict("scatter", results, 3)
    assert v.passed
    assert v.notes == ("scatter on nccl: Backend nccl does not support scatter; "
                       "the tutorial's workaround was used: broadcast, keep own piece",)


def test_gather_checks_dst_only() -> None:
    results = gather_ok(4)
    results[3] = {"gathered": "garbage"}
    assert verdict("gather", results, 4).passed
    results[0]["gathered"][2] = [-1.0]
    assert_fails(verdict("gather", results, 4), 0,
                 "rank 0: gather to rank 0: expected [[0.0], [1.0], [2.0], [3.0]], got [[0.0], [1.0], [-1.0], [3.0]]")


def test_all_gather_wrong_order_on_one_rank() -> None:
    results = all_gather_ok(3)
    results[1]["gathered"] = [[1.0], [0.0], [2.0]]
    v = verdict("all-gather", results, 3)
    assert_fails(v, 1, "rank 1: all_gather: expected [[0.0], [1.0], [2.0]], got [[1.0], [0.0], [2.0]]")
    assert v.failed_ranks == (1,)


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_swapped(n: int) -> None:
    good = reduce_scatter_ok(n)
    results = {r: good[n - 1 - r] for r in range(n)}
    v = verdict("reduce-scatter", results, n)
    first = n * (n - 1) // 2
    assert_fails(v, 0, f"rank 0: reduce_scatter SUM: piece received: expected [{first}], got [{10 ** (n - 1) * first}]")


# --- barrier ---

@pytest.mark.parametrize("n", SIZES)
def test_barrier_rank_leaving_before_the_last_arrives(n: int) -> None:
    results = barrier_ok(n)
    results[0]["left"] = results[0]["arrived"]
    assert_fails(verdict("barrier", results, n), 0,
                 f"rank 0: left the barrier before rank {n - 1} arrived (s after the first arrival): "
                 f"expected '>= {0.2 * (n - 1):.3f}', got '0.000'")


def test_barrier_tolerates_small_clock_skew_only() -> None:
    results = barrier_ok(3)
    results[1]["left"] = results[2]["arrived"] - 0.03
    assert verdict("barrier", results, 3).passed
    results[1]["left"] = results[2]["arrived"] - 0.08
    assert_fails(verdict("barrier", results, 3), 1, "rank 1: left the barrier before rank 2 arrived")


def test_barrier_times_must_be_numbers_and_hosts_are_noted() -> None:
    results = barrier_ok(2)
    results[1]["left"] = "later"
    assert_fails(verdict("barrier", results, 2), 1, "rank 1: arrived and left (time.time()): expected 'two numbers'")
    world = World(2, "gloo", ("a", "b"), (0, 0))
    v = collectives.check_barrier(barrier_ok(2), world)
    assert v.passed
    assert v.notes == ("the ranks ran on 2 hosts: the barrier check assumes their clocks agree within 50 ms",)


# --- ring all-reduce ---

def test_the_ring_s_inputs_are_drawn_afresh_and_the_check_expects_their_sum() -> None:
    """Each run draws every rank's values anew (lab.core.random_inputs); the checker sums the draw it was given,
    so a result right for another draw fails, and a run that drew nothing is not checked at all."""
    seed = new_seed()
    first, second = draw(ring_cases.DRAWN, seed, 0), draw(ring_cases.DRAWN, new_seed(), 0)
    assert first != second and len(values(first)) == ring_cases.DRAWN
    assert draw(ring_cases.DRAWN, seed, 0) == first != draw(ring_cases.DRAWN, seed, 1)  # a replay; per rank
    assert all(-2 ** 15 <= v < 2 ** 15 for v in values(first))  # sums exact in float32 up to 512 ranks
    assert verdict("ring-allreduce", ring_ok(3), 3).passed
    other = replace(World.local(3), inputs={r: values(draw(ring_cases.DRAWN, new_seed(), r))
                                            for r in range(3)})
    v = ring.check_ring_allreduce(ring_ok(3), other)
    assert not v.passed and v.failed_ranks == (0, 1, 2)
    v = ring.check_ring_allreduce(ring_ok(3), World.local(3))
    assert (v.passed, v.reason) == (False, "no inputs were drawn for the ranks: nothing to check the sums against")


@pytest.mark.parametrize("count", [0, 1, 12, 13, 14, 65, 4099, 65537])
def test_the_ring_digests_weighted_sum_weighs_every_position_and_tells_a_permutation(count: int) -> None:
    values = [ring_sum(5, (65537,), i) for i in range(count)]
    by_definition = sum(v * (i % 13 + 1) for i, v in enumerate(values))
    assert ring_cases.weighted_sum(values) == by_definition
    assert ring_cases.weighted_sum([float(v) for v in values]) == float(by_definition)  # (exact in float64)
    if count > 1:
        swapped = [values[1], values[0], *values[2:]]
        assert (ring_cases.weighted_sum(swapped) == by_definition) == (values[0] == values[1])


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_samples_cover_both_ends_and_every_piece_boundary(n: int) -> None:
    count = 4099
    positions = ring_cases.sample_positions(count, n)
    assert {0, 1, 2, 3, count - 4, count - 3, count - 2, count - 1} <= set(positions)
    chunk = -(-count // n)
    assert {k * chunk for k in range(n)} <= set(positions)  # where torch.chunk's pieces start
    assert positions == sorted(set(positions)) and all(0 <= p < count for p in positions)


def test_ring_passes_with_five_ranks() -> None:
    assert verdict("ring-allreduce", ring_ok(5), 5).passed


def test_ring_lost_remainder_names_rank_case_positions_expected_and_got() -> None:
    results = ring_ok(4)
    case = results[2]["ring_allreduce"]["size 4099 int64"]
    for sample in case["samples"]:
        if sample[0] >= 4096:
            sample[1] = ring_input(4, 2, (4099,), sample[0])  # the rank's own input: never reduced
    v = verdict("ring-allreduce", results, 4)
    tail = (4096, 4097, 4098)
    want, got = [ring_sum(4, (4099,), i) for i in tail], [ring_input(4, 2, (4099,), i) for i in tail]
    assert_fails(v, 2, f"rank 2: ring_allreduce(tensor), size 4099 int64: positions [4096, 4097, 4098] "
                 f"{inputs_there(4, (4099,), tail)}: expected {want}, got {got}")
    assert v.failed_ranks == (2,)


def test_ring_small_case_compares_every_value_and_shows_floats_as_floats() -> None:
    results = ring_ok(3)
    results[0]["allreduce"]["size 5 float32"]["values"][4] = 0.0
    results[0]["allreduce"]["size 3x7 float64"]["values"][20] = 1.0
    v = verdict("ring-allreduce", results, 3)
    want_5, want_21 = float(ring_sum(3, (5,), 4, "allreduce")), float(ring_sum(3, (3, 7), 20, "allreduce"))
    assert_fails(v, 0, f"rank 0: allreduce(send, recv), size 5 float32: positions [4] "
                       f"{inputs_there(3, (5,), (4,), 'allreduce')}: expected [{want_5}], got [0.0]")
    assert (f"rank 0: allreduce(send, recv), size 3x7 float64: positions (flattened) [20] "
            f"{inputs_there(3, (3, 7), (20,), 'allreduce')}: expected [{want_21}], got [1.0]") \
        in map(str, v.mismatches)


def test_ring_wrong_between_the_samples_shows_in_the_sums() -> None:
    results = ring_ok(2)
    case = results[1]["ring_allreduce"]["size 1000 float64"]
    case["sum"] += 1.0
    v = verdict("ring-allreduce", results, 2)
    assert_fails(v, 1, "rank 1: ring_allreduce(tensor), size 1000 float64: sum of all 1000 values: expected ")
    results = ring_ok(2)
    results[1]["ring_allreduce"]["size 65537 int32"]["weighted"] -= 13
    assert_fails(verdict("ring-allreduce", results, 2), 1,
                 "rank 1: ring_allreduce(tensor), size 65537 int32: weighted sum (position i weighs i % 13 + 1)")


def test_ring_shape_dtype_and_missing_cases() -> None:
    results = ring_ok(3)
    results[1]["ring_allreduce"]["size 7 int32"]["dtype"] = "float32"
    results[2]["allreduce"]["size 3x7 int64"]["shape"] = [21]
    del results[0]["ring_allreduce"]["size 0 float64"]
    v = verdict("ring-allreduce", results, 3)
    strs = list(map(str, v.mismatches))
    assert "rank 1: ring_allreduce(tensor), size 7 int32: dtype: expected 'int32', got 'float32'" in strs
    assert "rank 2: allreduce(send, recv), size 3x7 int64: shape: expected [3, 7], got [21]" in strs
    assert "rank 0: ring_allreduce(tensor), size 0 float64: expected 'a result', got None" in strs
    results = ring_ok(2)
    results[0]["ring_allreduce"]["size 4099 float32"]["samples"] = results[0]["ring_allreduce"][
        "size 4099 float32"]["samples"][1:]
    assert_fails(verdict("ring-allreduce", results, 2), 0, "rank 0: ring_allreduce(tensor), size 4099 float32: samples")


def test_ring_a_rank_counted_twice_fails_everywhere() -> None:
    """What a ring that adds its own input twice (once more for each lap) reports."""
    n = 3
    results = ring_ok(n)
    for r in range(n):
        values = results[r]["allreduce"]["size 2 int64"]["values"]
        for i in range(2):
            values[i] += ring_input(n, r, (2,), i, "allreduce")
    v = verdict("ring-allreduce", results, n)
    assert v.failed_ranks == (0, 1, 2)
    want = [ring_sum(n, (2,), i, "allreduce") for i in range(2)]
    got = [w + ring_input(n, 0, (2,), i, "allreduce") for i, w in enumerate(want)]
    assert v.reason.startswith(f"rank 0: allreduce(send, recv), size 2 int64: positions [0, 1] "
                               f"{inputs_there(n, (2,), (0, 1), 'allreduce')}: expected {want}, got {got}")


# --- dsgd ---

@pytest.mark.parametrize("n", [1, 5])
def test_dsgd_passes_with_one_and_five_ranks(n: int) -> None:
    assert verdict("dsgd", dsgd_ok(n), n).passed


def test_dsgd_batches_the_tutorial_way() -> None:
    assert [dsgd_settings.batch_per_rank(n) for n in (1, 2, 3, 4, 5)] == [32, 16, 10, 8, 6]
    assert [dsgd_settings.samples_per_rank(n) for n in (1, 2, 3, 4, 5)] == [240, 120, 80, 60, 48]
    results = dsgd_ok(3)
    results[0]["batch_per_rank"] = 32 / 3
    assert_fails(verdict("dsgd", results, 3), 0,
                 "rank 0: batch per rank (global batch // world size): expected 10, got 10.666")


def test_dsgd_ranks_that_drift_apart() -> None:
    results = dsgd_ok(4)
    results[1]["dsgd"]["steps"][2][1] += 0.01  # fc1.bias after step 3
    v = verdict("dsgd", results, 4)
    assert_fails(v, 1, "rank 1: dsgd parameters after step 3 (epoch 0, batch 3) as on rank 0: fc1.bias sum: "
                 "expected 1.2, got 1.21")
    assert ("rank 1: dsgd parameters after step 3 (epoch 0, batch 3) as one process on the batch of 32: "
            "fc1.bias sum: expected 1.2, got 1.21") in map(str, v.mismatches)
    assert v.failed_ranks == (1,)
    assert v.notes == ()
    results = dsgd_ok(4)
    results[3]["dsgd"]["steps"][0][0] -= 0.5  # apart from the first step on: never averaged
    v = verdict("dsgd", results, 4)
    assert_fails(v, 3, "rank 3: dsgd parameters after step 1 (epoch 0, batch 1) as on rank 0: fc1.weight sum: "
                 "expected 0.0, got -0.5")
    assert v.notes == ("the ranks' parameters differ from the first step on: average_gradients did not leave "
                       "the same gradient on every rank",)


def test_dsgd_tolerates_float32_rounding_only() -> None:
    results = dsgd_ok(2)
    results[1]["dsgd"]["steps"][5][0] += 1e-7
    results[0]["ddp"]["final"][7] += 2e-5
    assert verdict("dsgd", results, 2).passed
    results[0]["ddp"]["final"][7] += 1e-3
    assert_fails(verdict("dsgd", results, 2), 0,
                 "rank 0: DistributedDataParallel parameters after training as one process's: "
                 "fc1.weight[7] (flattened) (1 of 58 differ): expected 0.57")


def test_dsgd_gradients_summed_not_averaged() -> None:
    n = 4
    results = dsgd_ok(n)
    for r in range(n):
        results[r]["dsgd"]["first"] = dsgd_model(n, scale=n)["first"]
        results[r]["dsgd"]["steps"][0][3] *= 2
    v = verdict("dsgd", results, n)
    assert_fails(v, 0, "rank 0: dsgd's first step, in units of one process's step on the full batch: "
                 "expected 1.0, got 4.0")
    assert v.failed_ranks == (0, 1, 2, 3)
    assert v.notes == ("the first step was 4x one process's: the gradients were summed over the 4 ranks "
                       "but not divided by the world size",)


def test_dsgd_final_parameter_named_and_epoch_loss_mean() -> None:
    results = dsgd_ok(2)
    results[0]["dsgd"]["final"][41] = 9.0  # fc2.weight[1]
    assert_fails(verdict("dsgd", results, 2), 0, "rank 0: dsgd parameters after training as one process's: "
                 "fc2.weight[1] (flattened) (1 of 58 differ): expected 0.91, got 9.0")
    results = dsgd_ok(2)
    results[0]["dsgd"]["losses"][2] = 0.7  # mean 0.6, one process 0.5
    v = verdict("dsgd", results, 2)
    assert not v.passed
    assert v.reason == ("all ranks: dsgd loss of epoch 2, the mean over the ranks (= one process's): "
                        "expected 0.5, got 0.6")


def test_dsgd_malformed_reports_fail_without_crashing() -> None:
    results = dsgd_ok(3)
    results[2]["ddp"]["steps"] = results[2]["ddp"]["steps"][:-1]
    results[1]["reference"] = None
    v = verdict("dsgd", results, 3)
    strs = list(map(str, v.mismatches))
    assert "rank 1: one process: report: expected 'a dict', got None" in strs
    steps = dsgd_settings.EPOCHS * dsgd_settings.steps_per_epoch(3)
    assert f"rank 2: DistributedDataParallel: number of steps (3 epochs): expected {steps}, got {steps - 1}" in strs
    results = dsgd_ok(2)
    results[0]["initial"] = results[0]["initial"][:10]
    assert_fails(verdict("dsgd", results, 2), 0, "rank 0: initial parameters: expected '58 numbers'")


def test_dsgd_different_initial_parameters() -> None:
    results = dsgd_ok(2)
    results[1]["initial"] = [x + 1 for x in results[1]["initial"]]
    results[1]["dsgd"]["first"] = [x + 1 for x in results[1]["dsgd"]["first"]]
    results[1]["reference"]["first"] = [x + 1 for x in results[1]["reference"]["first"]]
    results[1]["ddp"]["first"] = [x + 1 for x in results[1]["ddp"]["first"]]
    assert_fails(verdict("dsgd", results, 2), 1, "rank 1: initial parameters (as rank 0's: the same seed)")


# --- backends ---

def test_backends_note_no_gpu() -> None:
    v = verdict("backends", backends_ok(3), 3)
    assert v.passed
    assert v.notes == ("no rank has a GPU: the collectives ran with gloo on CPU tensors "
                       "(with a GPU per rank the lab picks nccl)",)


def test_backends_ranks_on_one_host_must_agree() -> None:
    results = backends_ok(3)
    results[1]["available"]["mpi"] = True
    results[2]["gpus"] = 1
    v = verdict("backends", results, 3)
    assert_fails(v, 1, "rank 1: available backends (as rank 0 on the same host local): expected ")
    assert "rank 2: GPUs (as rank 0 on the same host local): expected 0, got 1" in map(str, v.mismatches)
    # On different hosts they may differ.
    world = World(2, "gloo", ("a", "b"), (0, 0))
    results = backends_ok(2)
    results[1].update(available={"gloo": True, "nccl": True, "mpi": False}, gpus=1)
    v = backends.check_backends(results, world)
    assert v.passed
    assert v.notes == ("host(s) a have fewer GPUs than ranks: nccl needs one GPU per rank, so the collectives "
                       "ran with gloo",)


def test_backends_values_and_backend() -> None:
    results = backends_ok(4)
    results[3]["all_reduce"] = 4.0
    results[0]["backend"] = "nccl"
    results[2]["broadcast"] = [1.0, 2.0]
    v = verdict("backends", results, 4)
    strs = list(map(str, v.mismatches))
    assert v.reason.startswith("rank 0: dist.get_backend() (the run's backend): expected 'gloo', got 'nccl'")
    assert "rank 3: all_reduce SUM of rank + 1: expected 10.0, got 4.0" in strs
    assert "rank 2: broadcast from rank 3: expected [301.0, 302.0], got [1.0, 2.0]" in strs


def test_backends_nccl_needs_each_rank_on_its_own_gpu() -> None:
    world = World(4, "nccl", ("a", "a", "b", "b"), (0, 1, 0, 1))
    results = backends_ok(4)
    for r, result in results.items():
        result.update(available={"gloo": True, "nccl": True, "mpi": False}, gpus=2, backend="nccl",
                      device=f"cuda:{world.local_ranks[r]}")
    v = backends.check_backends(results, world)
    assert v.passed and v.notes == ()
    results[3]["device"] = "cuda:0"
    results[2]["available"] = {"gloo": True, "nccl": False, "mpi": False}
    results[3]["available"] = {"gloo": True, "nccl": False, "mpi": False}
    v = backends.check_backends(results, world)
    strs = list(map(str, v.mismatches))
    assert "rank 3: device (nccl: the GPU of the rank's local rank): expected 'cuda:1', got 'cuda:0'" in strs
    assert "rank 2: nccl available (the run's backend): expected True, got False" in strs


def test_backends_every_rank_with_a_gpu_but_gloo_is_noted() -> None:
    results = backends_ok(2)
    for result in results.values():
        result.update(available={"gloo": True, "nccl": True, "mpi": False}, gpus=2)
    v = verdict("backends", results, 2)
    assert v.passed
    assert v.notes == ("every rank has a GPU of its own: --backend nccl would run the collectives with nccl "
                       "(this run used gloo)",)


def test_mismatches_are_shown_as_distinct_errors_each_functions_first_before_any_seconds() -> None:
    """One bug over four dtypes is one line naming them; ring_allreduce's many errors do not hide
    allreduce's."""
    wrong = [Mismatch(0, f"ring_allreduce(tensor), size {n} {dtype}: positions [0]", [5.0 if "float" in dtype else 5],
                      [3.0 if "float" in dtype else 3]) for n in (1, 2, 3) for dtype in ("float32", "int64")]
    wrong.append(Mismatch(0, "allreduce(send, recv), size 1 float32: positions [0]", [5.0], [1.0]))
    assert distinct(wrong) == [
        "rank 0: ring_allreduce(tensor), size 1 (float32, int64): positions [0]: expected [5.0], got [3.0]",
        "rank 0: allreduce(send, recv), size 1 float32: positions [0]: expected [5.0], got [1.0]",
        "rank 0: ring_allreduce(tensor), size 2 (float32, int64): positions [0]: expected [5.0], got [3.0]",
        "rank 0: ring_allreduce(tensor), size 3 (float32, int64): positions [0]: expected [5.0], got [3.0]"]
    other = [Mismatch(0, "x(t), size 1 float32: positions [0]", [1.0], [2.0]),
             Mismatch(0, "x(t), size 1 int64: positions [0]", [1], [9])]  # (other values: two errors)
    assert len(distinct(other)) == 2
