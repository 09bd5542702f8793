"""The plan is pure data: checked here without torch, processes or a network."""
from __future__ import annotations

import argparse
import json

import pytest
import yaml

from lab.cli.common import launcher_option
from lab.core.launchers import LAUNCHERS
from lab.core.plan import RUN_DIR, Launch, Options, bind_macros, default_backend, port_macro, public_id
from lab.core.planner import build_launch_plan, build_plan
from lab.errors import UsageError
from lab.inventory.hosts import local_inventory
from lab.inventory.model import Host, Inventory
from lab.rank.isolation import USERS_VAR
from lab.suite import registry

TOKEN = "t0k3n"
P0, P1, P2 = (port_macro(i) for i in range(3))


def opts(*names: str, **kw: object) -> Options:
    return Options(tuple(registry.select(list(names) or ["all"])), **kw)  # type: ignore[arg-type]


def inv(*hosts: Host) -> Inventory:
    return Inventory("inventory.yaml", hosts)


def test_local_cluster_lays_out_ranks_on_loopback() -> None:
    plan = build_plan(local_inventory(4), opts("p2p"), TOKEN)
    assert plan.world_size == 4 and plan.backend == "gloo"
    assert [(r.rank, r.local_rank, r.device) for r in plan.ranks] == [(i, i, "cpu") for i in range(4)]
    env = plan.ranks[2].env
    assert env == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": P0, "RANK": "2", "WORLD_SIZE": "4",
                   "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}


def test_slots_over_hosts_give_local_ranks_per_host() -> None:
    a = Host("a", "10.0.0.1", slots=2, data_address="192.168.0.1", network_interface="eth1")
    b = Host("b", "10.0.0.2", slots=2)
    plan = build_plan(inv(a, b), opts("p2p"), TOKEN)
    assert [(r.host, r.rank, r.local_rank) for r in plan.ranks] == [
        ("a", 0, 0), ("a", 1, 1), ("b", 2, 0), ("b", 3, 1)]
    assert all(r.env["LOCAL_WORLD_SIZE"] == "2" for r in plan.ranks)
    # MASTER_ADDR is rank 0's data-plane address, not the address SSH uses.
    assert plan.master_addr == "192.168.0.1"
    assert plan.ranks[0].env["GLOO_SOCKET_IFNAME"] == "eth1" == plan.ranks[0].env["NCCL_SOCKET_IFNAME"]
    assert "GLOO_SOCKET_IFNAME" not in plan.ranks[2].env


def test_backend_defaults_to_nccl_only_when_every_rank_has_a_gpu() -> None:
    assert default_backend([Host("a", "x", slots=2, gpus=2)]) == "nccl"
    assert default_backend([Host("a", "x", slots=2, gpus=2), Host("b", "y", slots=2, gpus=1)]) == "gloo"
    plan = build_plan(inv(Host("a", "x", slots=2, gpus=2)), opts("p2p"), TOKEN)
    assert plan.backend == "nccl" and [r.device for r in plan.ranks] == ["cuda:0", "cuda:1"]


def test_nccl_with_too_few_gpus_names_the_host() -> None:
    with pytest.raises(UsageError, match="host b: nccl needs one GPU per rank"):
        build_plan(inv(Host("a", "x", gpus=1), Host("b", "y", slots=2, gpus=1)), opts("p2p", backend="nccl"), TOKEN)


def test_run_all_shares_one_group_and_gives_each_init_exercise_its_own() -> None:
    plan = build_plan(local_inventory(2), opts("all"), TOKEN)
    assert plan.port_count == 3  # shared env group, init-env, init-tcp
    kinds = [(s.rendezvous, s.init_method) for s in plan.stages]
    assert kinds == [("none", None), ("shared", "env://"), ("env", "env://"),
                     ("tcp", f"tcp://127.0.0.1:{P2}"), ("file", f"file://{RUN_DIR}/rendezvous-init-file")]
    assert [s.port for s in plan.stages] == [None, P0, P1, P2, None]
    shared = plan.stages[1].exercises
    assert [e["name"] for e in shared][:3] == ["launchers", "groups", "p2p"]
    in_all = {name for name, e in registry.EXERCISES.items() if e.in_all}
    assert len(shared) == len(in_all) - 4
    assert set(plan.exercise_names) == in_all
    assert "cross-vpc" not in in_all  # it needs the cross-VPC lab: only by name


@pytest.mark.parametrize("init, method", [
    ("tcp", f"tcp://127.0.0.1:{P0}"), ("file", f"file://{RUN_DIR}/rendezvous-shared")])
def test_init_option_chooses_the_shared_groups_method(init: str, method: str) -> None:
    plan = build_plan(local_inventory(3), opts("p2p", "broadcast", init=init), TOKEN)
    assert plan.port_count == (1 if init == "tcp" else 0)
    assert [(s.rendezvous, s.init_method) for s in plan.stages] == [("shared", method)]


def test_ipv6_master_is_bracketed_in_tcp_urls() -> None:
    plan = build_plan(inv(Host("a", "fd00::1")), opts("broadcast", init="tcp"), TOKEN)
    assert plan.stages[0].init_method == f"tcp://[fd00::1]:{P0}"


def test_solution_replaces_the_program_and_needs_one_exercise() -> None:
    plan = build_plan(local_inventory(2), opts("p2p", solution="/home/s/mine.py"), TOKEN)
    # Every host runs its own copy, carried into the run directory.
    assert plan.stages[0].exercises == ({"name": "p2p", "program": f"{RUN_DIR}/solution/mine.py",
                                         "reference": "lab.suite.exercises.p2p"},)
    assert plan.uploads == {"solution/mine.py": "/home/s/mine.py"}
    with pytest.raises(UsageError, match="exactly one exercise"):
        build_plan(local_inventory(2), opts("p2p", "broadcast", solution="/x.py"), TOKEN)


def test_the_lab_launcher_forks_each_hosts_ranks_and_dry_run_data_is_plain_yaml() -> None:
    a, b = Host("a", "10.0.0.9", slots=2), Host("b", "10.0.0.10", slots=1, network_interface="eth1")
    plan = build_plan(inv(a, b), opts("all"), TOKEN)
    launches = plan.launches
    assert [(launch.host, launch.ranks, launch.args) for launch in launches] == [
        ("a", (0, 1), ("-m", "lab.rank.node", "fork", "--nprocs", "2", "--first-rank", "0", "-m", "lab.rank.worker")),
        ("b", (2,), ("-m", "lab.rank.node", "fork", "--nprocs", "1", "--first-rank", "2", "-m", "lab.rank.worker"))]
    env = launches[1].env
    rank_plan = json.loads(env["LAB_RANK_PLAN"])
    assert rank_plan["token"] == "t0k3n" and rank_plan["backend"] == "gloo"
    assert [s["rendezvous"] for s in rank_plan["stages"]] == ["none", "shared", "env", "tcp", "file"]
    # what every rank of the host shares; each forked rank sets its own RANK and LOCAL_RANK
    assert (env["MASTER_ADDR"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GLOO_SOCKET_IFNAME"]) == \
        ("10.0.0.9", "3", "1", "eth1")
    assert "RANK" not in env and "LOCAL_RANK" not in env and "LAB_TAG_OUTPUT" not in env  # (the zygote tags)
    assert env["PYTHONUNBUFFERED"] == "1" and env["PYTHONPATH"] == f"{RUN_DIR}/code"  # the run's own copy
    data = yaml.safe_load(yaml.safe_dump(plan.to_dict()))
    assert data["world_size"] == 3 and data["ranks"][2]["env"]["RANK"] == "2"
    assert data["launcher"] == "lab" and data["launches"][1]["command"][:4] == ["python", "-m", "lab.rank.node", "fork"]
    assert "LAB_RANK_PLAN" not in data["ranks"][1]["env"]


def test_torchrun_starts_one_agent_per_host_that_numbers_the_ranks_itself() -> None:
    a = Host("a", "10.0.0.9", slots=2, network_interface="eth1")
    b = Host("b", "10.0.0.10", slots=1)
    plan = build_plan(inv(a, b), opts("all", launcher="torchrun"), TOKEN)
    assert plan.port_count == 3  # the c10d rendezvous, init-env, init-tcp (the group is torchrun's)
    # c10d numbers the hosts in the sorted order of their addresses: "10.0.0.10" < "10.0.0.9"
    assert [h.name for h in plan.hosts] == ["b", "a"]
    assert [(r.host, r.rank, r.local_rank) for r in plan.ranks] == [("b", 0, 0), ("a", 1, 0), ("a", 2, 1)]
    assert plan.master_addr == "10.0.0.10" and plan.rdzv_endpoint == f"10.0.0.10:{P0}"
    shared = next(s for s in plan.stages if s.rendezvous == "shared")
    assert (shared.init_method, shared.addr, shared.port) == ("env://", None, None)  # torchrun's MASTER_*
    assert [s.port for s in plan.stages if s.rendezvous in ("env", "tcp")] == [P1, P2]
    launches = plan.launches
    assert [(launch.host, launch.ranks) for launch in launches] == [("b", (0,)), ("a", (1, 2))]
    assert launches[1].args == (
        "-m", "lab.rank.node", "torchrun", "--nnodes", "2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"10.0.0.10:{P0}", "--rdzv-id", public_id(TOKEN),
        "--max-restarts", "0", "--log-dir", f"{RUN_DIR}/torchelastic", "--node-rank", "1", "--local-addr", "10.0.0.9",
        "-m", "lab.rank.worker")
    env = launches[1].env
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT"} & env.keys()  # torchrun sets them
    assert env["LAB_TAG_OUTPUT"] == "1" and env["GLOO_SOCKET_IFNAME"] == "eth1"
    with pytest.raises(UsageError, match="torchrun forms the process group"):
        build_plan(inv(a, b), opts("p2p", launcher="torchrun", init="tcp"), TOKEN)


def test_spawn_starts_one_process_per_host_with_its_first_rank() -> None:
    a, b = Host("a", "10.0.0.9", slots=2), Host("b", "10.0.0.10", slots=2)
    plan = build_plan(inv(a, b), opts("p2p", launcher="spawn"), TOKEN)
    assert [h.name for h in plan.hosts] == ["a", "b"]  # the inventory's order: spawn numbers as told
    launches = plan.launches
    assert [(launch.host, launch.ranks) for launch in launches] == [("a", (0, 1)), ("b", (2, 3))]
    assert launches[1].args == ("-m", "lab.rank.node", "spawn", "--nprocs", "2", "--first-rank", "2",
                                "-m", "lab.rank.worker")
    env = launches[1].env
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == \
        ("10.0.0.9", P0, "4", "2")
    assert "RANK" not in env and "LOCAL_RANK" not in env  # each spawned rank sets its own
    with pytest.raises(UsageError, match="--launcher must be one of"):
        build_plan(inv(a, b), opts("p2p", launcher="mpirun"), TOKEN)


def test_srun_starts_one_job_from_the_first_host_whose_tasks_are_the_ranks() -> None:
    a, b = Host("node1", "10.0.0.9", slots=2), Host("node2", "10.0.0.10", slots=2)
    plan = build_plan(inv(a, b), opts("p2p", "init-tcp", launcher="srun", init="tcp", partition="gpu"), TOKEN)
    assert [h.name for h in plan.hosts] == ["node1", "node2"]  # srun numbers the tasks node by node
    (launch,) = plan.launches
    assert (launch.host, launch.ranks) == ("node1", (0, 1, 2, 3))
    assert launch.args == ("-m", "lab.rank.node", "srun", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2",
                           "--distribution=block", "--nodelist=node1,node2", f"--job-name=lab-{public_id(TOKEN)}",
                           "--immediate=58",  # (60 s less the time for srun's word to come: SRUN_SAYS)
                           "--partition=gpu", "--", "task", "-m", "lab.rank.worker")
    assert (launch.env["MASTER_ADDR"], launch.env["MASTER_PORT"]) == ("10.0.0.9", P0)
    assert "RANK" not in launch.env and "LAB_TAG_OUTPUT" not in launch.env  # Slurm's numbers; the zygote tags


def test_srun_torchrun_starts_one_torchrun_per_node_as_the_tutorial_does() -> None:
    a, b = Host("node2", "10.0.0.10", slots=2), Host("node1", "10.0.0.9", slots=2)
    plan = build_launch_plan(inv(a, b), "/x/broadcast.py", ["--n", "1"], 30.0, "srun-torchrun", TOKEN)
    assert [h.name for h in plan.hosts] == ["node1", "node2"]  # every agent's address is its host's name
    (launch,) = plan.launches
    assert launch.args == (
        "-m", "lab.rank.node", "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--distribution=block",
        "--nodelist=node1,node2",
        f"--job-name=lab-{public_id(TOKEN)}", "--immediate=28", "--", "torchrun", "--nnodes", "2",
        "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"10.0.0.9:{P0}",
        "--rdzv-id", public_id(TOKEN), "--max-restarts", "0", "--log-dir", f"{RUN_DIR}/torchelastic",
        "-m", "lab.rank.script", "${run_dir}/script/broadcast.py", "--n", "1")
    assert launch.env["LAB_TAG_OUTPUT"] == "1" and "MASTER_PORT" not in launch.env


@pytest.mark.parametrize(("launcher", "kw", "error"), [
    ("srun", {"partition": "gpu"}, None),
    ("srun", {"partition": "a b;rm"}, "not a Slurm partition's name"),
    ("torchrun", {"partition": "gpu"}, "a Slurm partition is for --launcher srun"),
    ("srun-torchrun", {"init": "tcp"}, "torchrun forms the process group"),
])
def test_slurm_options_are_checked(launcher: str, kw: dict[str, str], error: str | None) -> None:
    hosts = inv(Host("node1", "10.0.0.9", slots=2), Host("node2", "10.0.0.10", slots=2))
    if error is None:
        assert build_plan(hosts, opts("p2p", launcher=launcher, **kw), TOKEN).options.partition == kw["partition"]
        return
    with pytest.raises(UsageError, match=error):
        build_plan(hosts, opts("p2p", launcher=launcher, **kw), TOKEN)


def test_srun_needs_as_many_ranks_on_every_node() -> None:
    uneven = inv(Host("node1", "10.0.0.9", slots=2), Host("node2", "10.0.0.10", slots=1))
    with pytest.raises(UsageError, match="node1 2, node2 1 slots"):
        build_plan(uneven, opts("p2p", launcher="srun"), TOKEN)


def test_select_keeps_the_order_named_and_rejects_unknown_names() -> None:
    assert [e.name for e in registry.select(["barrier", "p2p", "barrier"])] == ["barrier", "p2p"]
    every = [e.name for e in registry.select(["all"])]  # (all: the suite's order, where it stands)
    assert [e.name for e in registry.select(["barrier", "all"])] == ["barrier", *(n for n in every if n != "barrier")]
    with pytest.raises(KeyError):
        registry.select(["p2p", "nope"])


def test_a_launch_is_bound_to_its_hosts_run_dir_and_the_held_ports() -> None:
    assert bind_macros("${run_dir}/code tcp://a:${port1} ${port10}", "/tmp/x", list(range(100, 111))) == \
        "/tmp/x/code tcp://a:101 110"
    plan = build_plan(local_inventory(2), opts("all"), TOKEN)
    launch = plan.launches[0].bound(f"/var/tmp/lab-run-{public_id(TOKEN)}", (41000, 41001, 41002))
    assert isinstance(launch, Launch) and launch.env["PYTHONPATH"] == f"/var/tmp/lab-run-{public_id(TOKEN)}/code"
    assert launch.env["MASTER_PORT"] == "41000" and "$" not in launch.env["LAB_RANK_PLAN"]
    stages = json.loads(launch.env["LAB_RANK_PLAN"])["stages"]
    assert [s["init_method"] for s in stages][2:4] == ["env://", "tcp://127.0.0.1:41002"]


def test_an_exercise_that_needs_more_ranks_than_the_cluster_has_is_refused() -> None:
    with pytest.raises(UsageError, match="p2p needs at least 2 ranks; this cluster has 1"):
        build_plan(local_inventory(1), opts("all"), TOKEN)
    assert build_plan(local_inventory(1), opts("broadcast"), TOKEN).world_size == 1


def test_file_rendezvous_goes_to_the_directory_every_host_shares() -> None:
    a, b = Host("a", "10.0.0.1", shared_dir="/shared"), Host("b", "10.0.0.2", shared_dir="/shared")
    plan = build_plan(inv(a, b), opts("init-file"), TOKEN)
    assert plan.shared_run_dir == f"/shared/lab-run-{public_id(TOKEN)}"
    assert plan.stages[0].init_method == f"file:///shared/lab-run-{public_id(TOKEN)}/rendezvous-init-file"
    # Hosts that share nothing: the path stays in the run directory and the rank-side
    # check reports that it is not shared.
    plan = build_plan(inv(a, Host("b", "10.0.0.2")), opts("init-file"), TOKEN)
    assert plan.shared_run_dir is None
    assert plan.stages[0].path == f"{RUN_DIR}/rendezvous-init-file"


# what each registered launcher starts for two hosts of two slots: how many processes, the host-side
# command (lab.rank.node's) and which ranks each carries as planned
STARTS = {
    "lab": [("a", "fork", (0, 1)), ("b", "fork", (2, 3))],
    "torchrun": [("a", "torchrun", (0, 1)), ("b", "torchrun", (2, 3))],
    "spawn": [("a", "spawn", (0, 1)), ("b", "spawn", (2, 3))],
    "srun": [("a", "srun", (0, 1, 2, 3))],
    "srun-torchrun": [("a", "srun", (0, 1, 2, 3))],
}


def test_every_launcher_makes_its_launches_as_data() -> None:
    """Every launcher of the registry (the names --launcher offers) plans a job of two hosts: the
    processes it starts, held by the plan; a rank's inputs go to its own host where the lab places
    the ranks, else to every host."""
    parser = argparse.ArgumentParser()
    launcher_option(parser)
    offered = next(a for a in parser._actions if a.dest == "launcher").choices
    assert tuple(LAUNCHERS) == tuple(offered) == tuple(STARTS)
    hosts = inv(Host("a", "10.0.0.1", slots=2), Host("b", "10.0.0.2", slots=2))
    for name, launcher in LAUNCHERS.items():
        plan = build_plan(hosts, opts("ring-allreduce", launcher=name), TOKEN)
        assert plan.launcher == name and [(launch.host, launch.args[2], launch.ranks) for launch in plan.launches] \
            == STARTS[name], name
        assert plan.launches[-1].args[-2:] == ("-m", "lab.rank.worker"), name
        assert launcher.inputs_for(plan, "b") == ((2, 3) if launcher.places_ranks else (0, 1, 2, 3)), name
        assert launcher.host_of(plan, "a", "b") == ("b" if name.startswith("srun") else "a"), name


def test_ranks_kept_apart_go_to_every_launcher_of_the_lab_and_no_other_launcher_may_have_them() -> None:
    """Options.rank_users reaches each host's launcher (lab.rank.isolation); a launcher that cannot keep
    ranks apart is refused rather than run them together."""
    plan = build_plan(inv(Host("a", "10.0.0.1", slots=2), Host("b", "10.0.0.2", slots=2)),
                      opts("p2p", rank_users=100_000), TOKEN)
    assert [launch.env.get(USERS_VAR) for launch in plan.launches] == ["100000", "100000"]
    assert all(USERS_VAR not in launch.env for launch in build_plan(local_inventory(2), opts("p2p"), TOKEN).launches)
    assert [name for name, each in LAUNCHERS.items() if each.isolates_ranks] == ["lab"]
    for launcher in ("torchrun", "spawn"):
        with pytest.raises(UsageError, match=f"ranks kept apart as users of their own need --launcher lab, "
                                             f"not --launcher {launcher}$"):
            build_plan(local_inventory(2), opts("p2p", rank_users=100_000, launcher=launcher), TOKEN)
