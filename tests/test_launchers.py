"""The three launchers on the local cluster, end to end: the lab's own processes, one torchrun per
host (c10d rendezvous), one mp.spawn per host. Two "hosts" of this machine with two slots each
stand for two machines: every launcher must number the ranks per host, and every rank's lines
and events must reach the right rank although a host's ranks share one process's streams."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from lab.suite import registry

from .conftest import WRONG, Lab
from .tutorials import assert_prints_as_shown, tutorial_scripts

pytestmark = pytest.mark.local
LAUNCHERS = ("lab", "torchrun", "spawn")


@pytest.fixture
def two_hosts(tmp_path: Path) -> Path:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  vars:\n    ansible_connection: local\n    slots: 2\n"
                         "  hosts:\n    alpha:\n    beta:\n")
    return inventory


def run_json(lab: Lab, *args: str) -> tuple[int, dict, str]:
    result = lab("run", *args, "--json")
    assert result.out.strip(), f"no JSON on stdout; stderr:\n{result.err[-3000:]}"
    return result.code, json.loads(result.out), result.err


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_each_launcher_numbers_the_ranks_per_host(lab: Lab, two_hosts: Path, launcher: str) -> None:
    code, report, streamed = run_json(lab, "launchers", "p2p", "all-reduce", "--hosts", str(two_hosts),
                                      "--launcher", launcher)
    assert code == 0, [(e["name"], e["reason"]) for e in report["exercises"]]
    assert report["plan"]["launcher"] == launcher
    hosts = {r["rank"]: r["host"] for r in report["ranks"]}
    # Two ranks on each host, consecutive (torchrun picks which host comes first).
    assert sorted(hosts.values()) == ["alpha", "alpha", "beta", "beta"]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3]
    for rank, host in hosts.items():  # each rank's own line, under its own name, with its numbers
        local = rank % 2
        assert re.search(rf"^\[{host} r{rank}\] rank {rank} of 4: RANK={rank} LOCAL_RANK={local} WORLD_SIZE=4 "
                         rf"LOCAL_WORLD_SIZE=2 ", streamed, re.M), streamed
    assert (" GROUP_RANK=" in streamed) == (launcher == "torchrun")
    assert lab.leftovers() == []


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_run_all_passes_under_each_host_launcher(lab: Lab, launcher: str) -> None:
    code, report, _ = run_json(lab, "all", "--nproc", "2", "--launcher", launcher)
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    assert {e["name"] for e in report["exercises"]} == {n for n, e in registry.EXERCISES.items() if e.in_all}
    assert lab.leftovers() == []


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
@pytest.mark.parametrize("solution, code, status, reason", [
    # The hung rank's stack dump came through its host's shared stream, tagged with its rank; the
    # hang finder stopped it (rank 0 waits in the barrier after p2p). The timeout is per step,
    # start-up included: under mp.spawn six processes import torch (about 2.5 s of CPU each) on this
    # 2-core machine before the ranks meet, so it leaves room for that.
    ("p2p_never_sends.py", 4, "timeout", r"rank 1 \(\w+\) hung in p2p at p2p_never_sends.py:\d+ in run: dist.recv"),
    ("p2p_crashes.py", 1, "fail", r"^rank 1 \(\w+\) exited with status 3 during p2p"),
])
def test_a_hang_or_crash_inside_a_host_launcher_is_pinned_on_its_rank(
        lab: Lab, two_hosts: Path, launcher: str, solution: str, code: int, status: str, reason: str) -> None:
    got, report, _ = run_json(lab, "p2p", "--hosts", str(two_hosts), "--launcher", launcher, "--timeout", "20",
                              "--solution", str(WRONG / solution))
    entry = report["exercises"][0]
    assert (got, entry["status"]) == (code, status), entry
    assert re.search(reason, entry["reason"]), entry["reason"]
    assert lab.leftovers() == []


@pytest.mark.cold
def test_sigint_under_torchrun_stops_the_agents_and_their_ranks(lab: Lab, two_hosts: Path) -> None:
    proc = lab.popen("run", "p2p", "--hosts", str(two_hosts), "--launcher", "torchrun", "--timeout", "120",
                     "--solution", str(WRONG / "p2p_never_sends.py"))
    code, out = lab.interrupt_when_running(proc, 7)  # the lab, 2 agents, 4 ranks (and their taggers)
    assert code == 130, out
    assert lab.leftovers() == []


def test_torchrun_takes_only_its_own_rendezvous(lab: Lab) -> None:
    result = lab("run", "p2p", "--nproc", "2", "--launcher", "torchrun", "--init", "tcp")
    assert result.code == 2
    assert result.err.strip().splitlines() == [
        "lab: error: with --launcher torchrun, torchrun forms the process group (env://): "
        "--init tcp and file need --launcher lab, spawn or srun"]


@pytest.mark.skipif(shutil.which("srun") is not None, reason="this machine is a Slurm login host")
def test_srun_where_there_is_none_is_one_line(lab: Lab) -> None:
    result = lab("run", "p2p", "--nproc", "2", "--launcher", "srun")
    assert result.code == 2, result.text
    assert result.err.strip().splitlines()[-1] == ("lab: error: host local: cannot run srun on this host (No such "
                                                   "file or directory): is it a Slurm cluster's login host?")
    assert lab.leftovers() == []


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_launch_runs_the_tutorials_torchrun_scripts_under_each_host_launcher(lab: Lab, tmp_path: Path,
                                                                             launcher: str) -> None:
    for script in tutorial_scripts(tmp_path):
        n = script.nproc
        inventory = tmp_path / f"hosts-{n}.yaml"  # the tutorial's 2 nodes
        inventory.write_text(f"all:\n  vars:\n    ansible_connection: local\n    slots: {max(1, n // 2)}\n"
                             "  hosts:\n    node1:\n    node2:\n")
        result = lab("launch", "--hosts", str(inventory), "--launcher", launcher, "--timeout", "120",
                     str(script.path))
        assert result.code == 0, result.text
        assert f"{script.name}: {n} of {n} ranks succeeded" in result.out
        assert_prints_as_shown(script, result.out)
    assert lab.leftovers() == []


FAILS_ON_RANK_1 = """\
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("boom on rank 1")
dist.barrier()
"""


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_launch_names_the_rank_that_failed_inside_a_host_launcher(lab: Lab, tmp_path: Path, launcher: str) -> None:
    script = tmp_path / "fails.py"
    script.write_text(FAILS_ON_RANK_1)
    result = lab("launch", "--nproc", "2", "--launcher", launcher, "--timeout", "60", str(script))
    assert result.code == 1, result.text
    assert "ValueError: boom on rank 1" in result.out
    assert "lab: Rank 1 (local) failed first: it raised ValueError: boom on rank 1 at fails.py:4" in result.out
    assert "fails.py: 0 of 2 ranks succeeded" in result.out
    if launcher == "torchrun":  # torchrun's own table says who failed first and who it stopped
        assert "Root Cause (first observed failure)" in result.out
        assert "ChildFailedError" not in result.out  # the table, not the agent's stack around it
    assert lab.leftovers() == []


FAILS_IN_ITS_FIRST_ATTEMPTS = """\
import os
import torch.distributed as dist
dist.init_process_group("gloo")
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if dist.get_rank() == 1 and attempt < int(os.environ["FAILING_ATTEMPTS"]):
    raise ValueError(f"boom in attempt {attempt}")
dist.barrier()
print("trained in attempt", attempt)
"""


def test_torchrun_restarts_the_ranks_up_to_max_restarts_and_each_restart_is_said(lab: Lab, tmp_path: Path) -> None:
    script = tmp_path / "flaky.py"
    script.write_text(FAILS_IN_ITS_FIRST_ATTEMPTS)
    launch = ("launch", "--nproc", "2", "--launcher", "torchrun", "--max-restarts", "1", "--timeout", "120")
    recovered = lab(*launch, "--env", "FAILING_ATTEMPTS=1", "--json", str(script))
    assert recovered.code == 0, recovered.text
    report = json.loads(recovered.out)
    [restart] = report["restarts"]  # rank 1 failed first; rank 0 then lost its connection to it
    assert restart["restart"] == 1 and restart["ended"][0] == "rank 1 (local) raised ValueError: boom in attempt 0 " \
                                                               "at flaky.py:6", restart
    assert report["attempts"] == 2 and 0 < restart["attempt_seconds"] < report["seconds"], report
    assert report["cause"] is None and report["succeeded"] == 2
    assert recovered.err.count("trained in attempt 1") == 2 and "trained in attempt 0" not in recovered.err
    failed = lab(*launch, "--env", "FAILING_ATTEMPTS=2", str(script))  # it fails again after its one restart
    assert failed.code == 1, failed.text
    assert re.search(r"torchrun restarted the ranks \(1 of --max-restarts 1\) after attempt 1 ran \d+\.\ds: rank 1 "
                     r"\(local\) raised ValueError: boom in attempt 0 at flaky.py:6 \(first; 1 more after it\)",
                     failed.out), failed.out
    assert "over 2 attempts" in failed.out, failed.out
    assert "Rank 1 (local) failed first: it raised ValueError: boom in attempt 1 at flaky.py:6" in failed.out
    refused = lab("launch", "--nproc", "2", "--max-restarts", "1", str(script))
    assert (refused.code, refused.err.strip()) == (2, "lab: error: --max-restarts 1: only torchrun's agent "
                                                      "restarts the ranks (--launcher torchrun or srun-torchrun), "
                                                      "not --launcher lab"), refused.text
    assert lab.leftovers() == []
