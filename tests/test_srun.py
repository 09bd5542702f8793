"""What the lab makes of Slurm's streams and words, without a cluster (the real one is in
test_slurm): each task's lines put back together from srun's labelled pieces, Slurm's refusals
as one line, and the doctor's Slurm findings."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import get_args

import pytest

from lab.core import slurm
from lab.core.slurm import allocation_inventory, expand_nodelist
from lab.doctor import slurm as doctor_slurm
from lab.doctor.slurm import SlurmAnswers
from lab.errors import ExitCode, UsageError
from lab.inventory.model import Host
from lab.jobs import submit
from lab.rank import node, srun
from lab.rank.events import Exit, Step, parse_event
from lab.rank.node import per_node_counts
from lab.rank.output import HOLD
from lab.rank.protocol import event_line, rank_tag, report_exits

TOKEN = "t0k3n"


def pieces(task: int, data: bytes) -> list[bytes]:
    """``data`` (one task's lines) as ``srun --label`` passes it on: each line in pieces of at most
    SRUN_PIECE bytes, every piece labelled and ended."""
    out = []
    for line in data.splitlines(keepends=True):
        body = line.rstrip(b"\n")
        chunks = [body[i:i + srun.SRUN_PIECE] for i in range(0, len(body), srun.SRUN_PIECE)] or [b""]
        if len(chunks[-1]) == srun.SRUN_PIECE:  # (srun passes the newline on in a piece of its own)
            chunks.append(b"")
        out += [f"{task}: ".encode() + chunk + b"\n" for chunk in chunks]
    return out


def test_a_tasks_long_lines_come_back_whole_from_pieces_that_other_tasks_lines_came_between() -> None:
    big = event_line(TOKEN, "step", rank=0, step="x" * 3000).encode()
    exact = rank_tag(0) + b"y" * (srun.SRUN_PIECE - len(rank_tag(0))) + b"\n"  # a line exactly one piece long
    first, second = pieces(0, big + exact), pieces(1, rank_tag(1) + b"hi\n" + rank_tag(1) + b"z" * 2500 + b"\n")
    unlabel = srun.Unlabel()
    out = b"".join(unlabel.feed(line) for pair in zip(first, second) for line in pair)
    out += b"".join(unlabel.feed(line) for line in first[len(second):] + second[len(first):]) + unlabel.close()
    lines = out.splitlines(keepends=True)
    assert sorted(lines) == sorted([big, exact, rank_tag(1) + b"hi\n", rank_tag(1) + b"z" * 2500 + b"\n"])
    assert parse_event(big.decode().rstrip("\n"), TOKEN) == Step(rank=0, step="x" * 3000)


def test_srun_s_own_lines_go_on_as_they_are_and_what_a_task_left_unended_is_ended() -> None:
    unlabel = srun.Unlabel()
    assert unlabel.feed(b"srun: error: node2: task 1: Killed\n") == b"srun: error: node2: task 1: Killed\n"
    assert unlabel.feed(b"0: " + b"a" * srun.SRUN_PIECE + b"\n") == b""
    assert unlabel.close() == b"a" * srun.SRUN_PIECE + b"\n"


def test_a_line_longer_than_any_event_goes_on_in_lines_of_bounded_size() -> None:
    unlabel = srun.Unlabel()
    out = b"".join(unlabel.feed(line) for line in pieces(3, b"f" * (3 * HOLD) + b"\n"))
    most = HOLD + srun.SRUN_PIECE  # (the piece that took it past HOLD goes with it)
    assert [len(line) for line in out.splitlines()] == [most, most, 3 * HOLD - 2 * most]


def test_a_host_launcher_runs_the_modes_the_launchers_name_and_refuses_another_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert set(get_args(node.ModeName)) == set(node.MODES)
    assert node.command("spawn", "--nprocs", "2") == ("-m", "lab.rank.node", "spawn", "--nprocs", "2")
    monkeypatch.setattr(sys, "argv", ["lab.rank.node", "forks", "--nprocs", "2"])
    assert node.main() == 2
    assert capsys.readouterr().err == "usage: python -m lab.rank.node {fork,torchrun,spawn,srun,task} ARGS\n"


def test_tasks_per_node_from_slurms_count() -> None:
    assert per_node_counts("2(x3),1") == [2, 2, 2, 1] and per_node_counts("4") == [4]
    with pytest.raises(ValueError):
        per_node_counts("2(x")


def test_the_nodes_of_an_allocation_are_the_inventory_of_hosts_slurm() -> None:
    assert expand_nodelist("node[1-3,07],login,gpu[1-2]-ib[0-1]") == [
        "node1", "node2", "node3", "node07", "login", "gpu1-ib0", "gpu1-ib1", "gpu2-ib0", "gpu2-ib1"]
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    inventory = allocation_inventory({**env, "LAB_SHARED_DIR": "/shared"}, "/opt/py/bin/python")
    assert [(h.name, h.address, h.connection, h.slots, h.python, h.shared_dir) for h in inventory.hosts] == [
        ("node1", "node1", "slurm", 2, "/opt/py/bin/python", "/shared"),
        ("node2", "node2", "slurm", 2, "/opt/py/bin/python", "/shared")]
    for broken in ({}, {**env, "SLURM_JOB_NODELIST": "node[1-"}, {**env, "SLURM_TASKS_PER_NODE": "2(x3)"},
                   {**env, "SLURM_JOB_NODELIST": "node[2-1]"}, {**env, "LAB_SHARED_DIR": "shared; rm"}):
        with pytest.raises(UsageError, match="--hosts slurm|LAB_SHARED_DIR"):
            allocation_inventory(broken, "python3")


def test_a_time_limit_is_a_bad_request_or_the_jobs_end() -> None:
    too_long = slurm.refusal(["srun: error: Unable to allocate resources: Requested time limit is invalid "
                              "(missing or exceeds some limit)"], "host node1")
    assert too_long is not None and too_long.exit_code == ExitCode.BAD_INPUT
    assert submit.ran_out_of_time("slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-23T10:09:37 DUE TO "
                                 "TIME LIMIT ***\n")
    assert not submit.ran_out_of_time("slurmstepd: error: *** STEP 9.0 ON node1 CANCELLED AT 2026-11-23T10:09:37 ***")


def test_the_batch_script_runs_the_lab_from_its_clone_on_the_allocations_nodes(tmp_path: Path) -> None:
    job = submit.BatchJob(("p2p", "--timeout", "60"), nodes=2, ntasks_per_node=2, time="10:00", partition="gpu")
    script = job.script("/opt/py/bin/python", Path("/home/me/lab clone"), tmp_path)
    assert script.splitlines()[:8] == [
        "#!/bin/sh", "# written by `python -m lab submit`", "#SBATCH --job-name=lab-submit", "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=2", f"#SBATCH --output={tmp_path}/slurm-%j.out", "#SBATCH --time=10:00",
        "#SBATCH --partition=gpu"]
    assert "cd '/home/me/lab clone' || exit 5" in script
    assert (f"exec /opt/py/bin/python -m lab run p2p --timeout 60 --hosts slurm --junit {tmp_path}/lab-"
            '"$SLURM_JOB_ID".xml') in script
    for bad, says in (({"time": "soon"}, "not a Slurm time"), ({"nodes": 0}, "at least 1"),
                      ({"partition": "a;b"}, "not a Slurm partition")):
        with pytest.raises(UsageError, match=says):
            submit.BatchJob(("p2p",), **{"nodes": 1, "ntasks_per_node": 1, **bad}).check()  # type: ignore[arg-type]


@pytest.mark.parametrize(("lines", "code", "says"), [
    (["srun: error: invalid partition specified: gpu",
      "srun: error: Unable to allocate resources: Invalid partition name specified"],
     ExitCode.BAD_INPUT, "host node1: Slurm refused the job: Invalid partition name specified"),
    (["srun: Required node not available (down, drained or reserved)", "srun: job 19 queued and waiting",
      "srun: error: Unable to allocate resources: Requested nodes are busy"],
     ExitCode.UNREACHABLE, "Requested nodes are busy (Required node not available (down, drained or reserved)): "
                           "`sinfo` there shows the nodes' states"),
    (["lab.rank.node: cannot run srun on this host (No such file or directory): is it a Slurm cluster's login host?"],
     ExitCode.BAD_INPUT, "host node1: cannot run srun on this host (No such file or directory): is it a Slurm "
                         "cluster's login host?"),
])
def test_slurms_refusals_are_one_line_with_their_exit_code(lines: list[str], code: ExitCode, says: str) -> None:
    refused = slurm.refusal(lines, "host node1")
    assert refused is not None and refused.exit_code == code
    assert says in str(refused) and "\n" not in str(refused)
    assert slurm.refusal(["srun: error: node2: task 3: Exited with exit code 3"], "host node1") is None


def test_exits_are_reported_as_events_in_the_order_given(capfd: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAB_TOKEN", TOKEN)
    report_exits({3: 3, 0: -15})
    events = [parse_event(line, TOKEN) for line in capfd.readouterr().out.splitlines()]
    assert events == [Exit(rank=3, code=3), Exit(rank=0, code=-15)]


def test_the_doctor_names_each_slurm_problem_with_its_fix() -> None:
    hosts = [Host("node1", "10.0.0.1"), Host("node2", "10.0.0.2"), Host("gpu9", "10.0.0.9")]
    answers = SlurmAnswers("node1", "Slurmctld(primary) at node1 is DOWN",
                           {"node1": "idle", "node2": "down*"}, {"node1": None, "node2": None,
                                                                  "gpu9": "unmunge: Error: Invalid credential"})
    found = {(f.subject, f.message): f for f in doctor_slurm.findings(answers, hosts)}
    assert set(found) == {
        ("node1", "slurmctld does not answer: Slurmctld(primary) at node1 is DOWN"),
        ("node2", "Slurm has the node down*"),
        ("gpu9", "is not a node of this Slurm cluster"),
        ("gpu9", "munge there cannot decode a credential made on node1: unmunge: Error: Invalid credential")}
    assert all(f.severity == "error" and f.fix for f in found.values())
    munge = next(f for (subject, message), f in found.items() if subject == "gpu9" and message.startswith("munge"))
    assert "its munge key is not the cluster's" in munge.cause
    rejected = SlurmAnswers("node1", "Slurmctld(primary) at node1 is UP", {"node1": "idle", "node2": "idle*"},
                            {"node1": None, "node2": "unmunge: Error: Invalid credential"})
    (one,) = doctor_slurm.findings(rejected, hosts[:2])  # the node's state is the key's doing: one finding
    assert one.message.startswith("munge there cannot decode") and one.cause.endswith("(Slurm has the node idle*)")
    well = SlurmAnswers("node1", "Slurmctld(primary) at node1 is UP", {"node1": "idle", "node2": "mixed"},
                        {"node1": None, "node2": None})
    (note,) = doctor_slurm.findings(well, hosts[:2])
    assert note.severity == "info"
    assert note.message.startswith("Slurm: slurmctld on node1 answers; 2 node(s) idle, mixed")

