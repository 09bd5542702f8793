"""Checkers of the set-up exercises: processes, groups and the three init methods."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from lab.suite.check import Expect, Results, Verdict, World
from lab.suite.checks import is_number, reported

METHODS = ("Process", "spawn")  # how the processes exercise starts its children
CHILDREN = 2  # children per method
ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def check_processes(results: Results, world: World) -> Verdict:
    """Each rank's children, per method, reported exactly once, with pids of their own."""
    e = Expect()
    for rank, result in reported(e, results, world).items():
        reports = result.get("reports")
        if not _are_reports(reports):
            e.true(rank, "reports", False, expected="a list of [method, child index, pid]", got=reports)
            continue
        for method in METHODS:
            for index in range(CHILDREN):
                count = sum(1 for m, i, _ in reports if m == method and i == index)
                e.equal(rank, f"reports from {method} child {index}", 1, count)
        e.equal(rank, "number of reports", len(METHODS) * CHILDREN, len(reports))
        pids = [pid for _, _, pid in reports]
        e.true(rank, "child pids", len(set(pids)) == len(pids), expected="all different", got=pids)
        own = result.get("pid")
        if e.true(rank, "the rank's own pid", is_number(own), expected="a pid", got=own):
            e.true(rank, "child pids", own not in pids, expected=f"none equal to the rank's pid {own}", got=pids)
    return e.verdict()


def _are_reports(value: Any) -> TypeGuard[list[list[Any]]]:
    return isinstance(value, list) and all(
        isinstance(r, list) and len(r) == 3 and isinstance(r[0], str) and is_number(r[1]) and is_number(r[2])
        for r in value)


def check_groups(results: Results, world: World) -> Verdict:
    """Rank and size in the world; in new_group(even ranks): the members' sum, -1 outside."""
    e = Expect()
    n = world.world_size
    members = list(range(0, n, 2))
    for rank, result in reported(e, results, world).items():
        e.equal(rank, "get_rank()", rank, result.get("rank"))
        e.equal(rank, "get_world_size()", n, result.get("world_size"))
        e.equal(rank, "new_group members (the even ranks)", members, result.get("members"))
        if rank in members:
            e.equal(rank, "get_rank(group)", members.index(rank), result.get("group_rank"))
            e.equal(rank, "get_world_size(group)", len(members), result.get("group_size"))
            e.equal(rank, "all_reduce SUM of rank + 1 in the group", float(sum(m + 1 for m in members)),
                    result.get("value"))
        else:
            e.equal(rank, "get_rank(group) outside the group", -1, result.get("group_rank"))
            e.equal(rank, "get_world_size(group) outside the group", -1, result.get("group_size"))
            e.equal(rank, "tensor of a rank outside the group (it takes no part)", float(rank + 1),
                    result.get("value"))
    return e.verdict()


def check_init(results: Results, world: World) -> Verdict:
    """The group formed with the init method: ranks, size, an all_reduce, one method for all."""
    e = Expect()
    n = world.world_size
    ranks = reported(e, results, world)
    first = ranks[min(ranks)] if ranks else {}
    for rank, result in ranks.items():
        e.equal(rank, "get_rank()", rank, result.get("rank"))
        e.equal(rank, "get_world_size()", n, result.get("world_size"))
        e.equal(rank, "all_reduce SUM of rank + 1", float(sum(range(1, n + 1))), result.get("sum"))
        method = result.get("init_method")
        if e.true(rank, "init_method", isinstance(method, str) and method.split("://")[0] in ("env", "tcp", "file"),
                  expected="env://, tcp://ADDR:PORT or file:///PATH", got=method):
            e.equal(rank, f"init_method (the same as rank {min(ranks)}'s)", first.get("init_method"), method)
        if method == "env://":
            _check_env(e, rank, n, result.get("env"), first.get("env"))
    return e.verdict()


def _check_env(e: Expect, rank: int, n: int, env: Any, first: Any) -> None:
    """env:// read RANK and WORLD_SIZE of this rank, and the master address every rank shares."""
    if not e.true(rank, "environment read for env://", isinstance(env, Mapping) and set(ENV_VARS) <= env.keys(),
                  expected=f"a dict of {', '.join(ENV_VARS)}", got=env):
        return
    e.equal(rank, "RANK in the environment", str(rank), env["RANK"])
    e.equal(rank, "WORLD_SIZE in the environment", str(n), env["WORLD_SIZE"])
    if isinstance(first, Mapping):
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            e.equal(rank, f"{name} (the same for every rank)", first.get(name), env[name])


def check_cross_vpc(results: Results, world: World) -> Verdict:
    """The job across VPCs: the mesh formed, the all_reduce is right, one master for all."""
    e = Expect()
    n = world.world_size
    ranks = reported(e, results, world)
    masters = {r.get("master") for r in ranks.values()}
    e.true(None, "MASTER_ADDR (one for every rank)", len(masters) == 1, expected="one address",
           got=sorted(map(str, masters)))
    for rank, result in ranks.items():
        e.equal(rank, "all_reduce SUM of rank + 1", float(sum(range(1, n + 1))), result.get("sum"))
    return e.verdict()


def check_launchers(results: Results, world: World) -> Verdict:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE as every launcher must set them, from where
    each rank ran: a host's ranks are consecutive, numbered from 0 on the host; where the launcher starts
    a host's ranks from one process (torchrun's agent, mp.spawn's parent), that one is the parent of
    each; where it sets GROUP_RANK (torchrun, srun), it numbers the hosts."""
    e = Expect()
    n = world.world_size
    ranks = reported(e, results, world)
    on_host = {host: [r for r in range(n) if world.hosts[r] == host] for host in world.hosts}
    first = ranks[min(ranks)] if ranks else {}
    for rank, result in ranks.items():
        env: Any = result.get("env")  # untrusted: checked below
        if not e.true(rank, "environment", isinstance(env, Mapping), expected="a dict of the variables", got=env):
            continue
        mates = on_host[world.hosts[rank]]
        e.equal(rank, "get_rank()", rank, result.get("rank"))
        e.equal(rank, "get_world_size()", n, result.get("world_size"))
        e.equal(rank, "RANK", str(rank), env.get("RANK"))
        e.equal(rank, "WORLD_SIZE", str(n), env.get("WORLD_SIZE"))
        e.equal(rank, f"LOCAL_RANK (its place among the ranks on {world.hosts[rank]})", str(mates.index(rank)),
                env.get("LOCAL_RANK"))
        e.equal(rank, f"LOCAL_WORLD_SIZE (the ranks on {world.hosts[rank]})", str(len(mates)),
                env.get("LOCAL_WORLD_SIZE"))
        e.true(rank, f"the ranks on {world.hosts[rank]}", mates == list(range(mates[0], mates[0] + len(mates))),
               expected="consecutive", got=mates)
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            e.equal(rank, f"{name} (the same for every rank)", (first.get("env") or {}).get(name), env.get(name))
        starter = world.launched.rank_parent
        if starter and mates[0] in ranks:
            e.equal(rank, f"the process that started it (the {starter} of {world.hosts[rank]})",
                    ranks[mates[0]].get("parent"), result.get("parent"))
    if world.launched.sets_group_rank:
        _check_group_ranks(e, ranks, world, on_host)
    return e.verdict()


def _check_group_ranks(e: Expect, ranks: Mapping[int, Mapping[str, Any]], world: World,
                       on_host: dict[str, list[int]]) -> None:
    """GROUP_RANK: one number per host, the hosts numbered 0.. in the order of their ranks."""
    order = sorted(on_host.values(), key=min)
    for number, mates in enumerate(order):
        for rank in mates:
            if rank in ranks and isinstance(env := ranks[rank].get("env"), Mapping):
                e.equal(rank, f"GROUP_RANK (the number the launcher gave {world.hosts[rank]})", str(number),
                        env.get("GROUP_RANK"))
