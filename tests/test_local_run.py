"""The local cluster end to end: the real CLI, real processes, real torch.distributed (gloo)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import pty
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from lab.core import requirements, workdir
from lab.core.outcome import RunOutcome
from lab.core.planner import build_launch_plan
from lab.core.runner import run_plan
from lab.inventory.hosts import local_inventory
from lab.suite import registry

from .conftest import DDP_SERIES, REPO, TOKENIZED, WRONG, Lab, assert_ddp_series_trained
from .load import cpu_hog
from .tutorials import assert_prints_as_shown, ring_allreduce_fragment, tutorial_scripts
from .wheels import tokenized_project

pytestmark = pytest.mark.local
SOLUTIONS = REPO / "tests" / "solutions"


def run_json(lab: Lab, *args: str) -> tuple[int, dict]:
    result = lab("run", *args, "--json")
    assert result.out.strip(), f"no JSON on stdout; stderr:\n{result.err[-3000:]}"
    return result.code, json.loads(result.out)


def by_name(report: dict) -> dict[str, dict]:
    return {e["name"]: e for e in report["exercises"]}


# Each rendezvous method of the shared group once and each world size once (the two are independent:
# the init-* exercises form their own groups by each method in every run, and the sizes try the rings'
# remainders): three runs instead of nine. Started as on a user's own machine (cold), as are the
# start-up's own tests below.
@pytest.mark.cold
@pytest.mark.parametrize(("init", "nproc"), [("env", 2), ("tcp", 3), ("file", 4)])
def test_run_all_passes(lab: Lab, nproc: int, init: str) -> None:
    code, report = run_json(lab, "all", "--nproc", str(nproc), "--init", init, "--backend", "gloo")
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    assert set(by_name(report)) == {name for name, e in registry.EXERCISES.items() if e.in_all}
    assert report["plan"]["world_size"] == nproc and report["plan"]["init"] == init
    assert lab.leftovers() == []


def test_output_streams_with_host_and_rank_prefix_then_one_line_per_exercise(lab: Lab) -> None:
    result = lab("run", "p2p", "reduce-scatter", "--nproc", "4")
    assert result.code == 0, result.text
    # The reduce-scatter program prints what each rank holds, as the tutorial does.
    assert "[local r3] " in result.out
    lines = result.out.splitlines()
    assert any(line.startswith("PASS") and "p2p " in line for line in lines)
    assert any(line.startswith("PASS") and "reduce-scatter" in line for line in lines)
    assert lines[-1].startswith("2 passed, 0 failed")


WRONG_PROGRAMS = [
    ("all-reduce", "all_reduce_max_for_sum.py", "SUM"),
    ("reduce-scatter", "reduce_scatter_swapped.py", "reduce_scatter"),
    ("p2p", "p2p_ring_off_by_one.py", "ring"),
    ("barrier", "barrier_skipped.py", "left"),
    ("groups", "groups_wrong_subset.py", "rank"),
    ("p2p", "p2p_crashes.py", "rank 1"),
    ("ring-allreduce", "ring_world_size_two_only.py",
     "rank 0: allreduce(send, recv), size 1 float32: positions [0] (the inputs there: rank 0 ["),
    ("ring-allreduce", "ring_drops_remainder.py",
     "rank 0: ring_allreduce(tensor), size 1 float32: positions [0] (the inputs there: rank 0 ["),
    ("dsgd", "dsgd_never_averages.py", "rank 1: dsgd parameters after step 1 (epoch 0, batch 1) as on rank 0: "),
    ("dsgd", "dsgd_forgets_divide.py",
     "rank 0: dsgd's first step, in units of one process's step on the full batch: expected 1.0, got 4.0"),
    ("ring-allreduce", "ring_computes_locally.py",
     "rank 0 sent 0 bytes in allreduce(): it computed the result without communicating"),
    ("ring-allreduce", "ring_reads_the_checker.py", "No module named 'lab.suite.checks'"),
    ("ring-allreduce", "ring_calls_functional_collective.py",
     "ranks 0, 1, 2, 3 called torch.ops._c10d_functional.all_reduce: ring-allreduce must be built from "
     "point-to-point calls"),
]


@pytest.mark.parametrize("exercise, program, fragment", WRONG_PROGRAMS)
def test_wrong_programs_fail_their_check_with_a_reason(lab: Lab, exercise: str, program: str,
                                                      fragment: str) -> None:
    code, report = run_json(lab, exercise, "--nproc", "4", "--solution", str(WRONG / program),
                            "--timeout", "30")
    entry = by_name(report)[exercise]
    assert code == 1, entry
    assert entry["status"] == "fail" and fragment in entry["reason"], entry
    assert entry["ranks"], "a failure names the rank(s)"
    assert lab.leftovers() == []


def test_a_rank_that_raised_in_its_exercise_is_the_cause_said_first_in_its_own_frames(lab: Lab) -> None:
    """Not the lab's barrier that rank waits in after its exercise, not the lab's frames, not the
    doctor's network checks: the student's exception, at the student's line."""
    result = lab("run", "dsgd", "--nproc", "2", "--solution", str(WRONG / "dsgd_raises_on_one_rank.py"),
                 "--timeout", "30", "--hang-after", "3", timeout=120)
    lines = [line.strip() for line in result.out.splitlines()]
    headline = next(line for line in lines if line.startswith("lab: "))
    assert headline == ("lab: Rank 1 (local) failed first: it raised ValueError: rank 1 gives up at "
                        "dsgd_raises_on_one_rank.py:14; rank 0 still waits in all_reduce."), result.out
    assert "FAIL dsgd: rank 1 raised ValueError: rank 1 gives up at dsgd_raises_on_one_rank.py:14" in result.out
    assert "barrier" not in result.out and "lab/" not in result.out and "exercises/dsgd.py" not in result.out
    assert "likely cause" not in result.out, result.out
    assert lab.leftovers() == []


def test_a_students_own_hang_is_said_in_their_frames_and_the_doctor_is_not_asked(lab: Lab) -> None:
    """A ring whose every rank receives first: the cycle named, each rank's last lines without a frame
    of the lab's (the stacks every rank dumps as it is stopped), and no "likely cause" from the doctor,
    whose checks of the run's own port would find it held by the run's own ranks."""
    result = lab("run", "ring-allreduce", "--part", "allreduce", "--solution",
                 str(WRONG / "ring_allreduce_receives_first.py"), "--nproc", "3", "--timeout", "60",
                 "--hang-after", "3", timeout=180)
    assert result.code == 4, result.text[-3000:]
    assert "every rank receives first" in result.out and "ring_allreduce_receives_first.py:10" in result.out, result.out
    assert "last lines of rank" in result.out, result.out
    assert not re.search(r"lab/(rank|suite)/|zygote|worker\.py", result.out), result.out
    assert "likely cause" not in result.out and "MASTER_PORT" not in result.out, result.out
    assert lab.leftovers() == []


def test_a_solution_with_its_own_run_is_refused_where_the_exercise_asks_for_functions(lab: Lab) -> None:
    code, report = run_json(lab, "ring-allreduce", "--nproc", "3", "--solution", str(WRONG / "ring_own_run.py"))
    entry = by_name(report)["ring-allreduce"]
    assert code != 0 and entry["status"] != "pass", entry
    assert "ring_own_run.py defines run(): this exercise asks for allreduce(), ring_allreduce(), which its own " \
           "run() drives and checks; remove run()" in entry["reason"], entry
    assert lab.leftovers() == []


@pytest.mark.parametrize("nproc", [2, 3, 5])
def test_ring_allreduce_dsgd_and_backends_pass(lab: Lab, nproc: int) -> None:
    """The ring for world sizes 2, 3 and 5 (sizes that no world size divides); dsgd and
    backends for 2 and 3, in the same run."""
    names = ["ring-allreduce"] + (["dsgd", "backends"] if nproc <= 3 else [])
    code, report = run_json(lab, *names, "--nproc", str(nproc))
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    assert list(by_name(report)) == names
    assert lab.leftovers() == []


def test_the_tutorials_own_ring_allreduce_passes_as_its_part_and_earns_half_the_exercise(lab: Lab, tmp_path) -> None:
    """Tutorial 001's ``allreduce(send, recv)``, its text taken from the tutorial, graded as a
    student's solution: the lab's reference drives it on every case (3 ranks). The tutorial
    leaves ``ring_allreduce`` as homework: the exercise's other part, not written (the reference's
    runs in its place, and is not the student's). ``--part allreduce`` checks the tutorial's ring
    alone, and it passes."""
    solution = tmp_path / "tutorial_ring.py"
    solution.write_text(ring_allreduce_fragment())
    code, report = run_json(lab, "ring-allreduce", "--nproc", "3", "--solution", str(solution))
    entry = by_name(report)["ring-allreduce"]
    assert (code, entry["status"], entry["score"]) == (1, "fail", 0.5), entry
    assert entry["reason"] == "ring_allreduce(): not written (the solution does not define it)", entry
    assert [(p["name"], p["passed"]) for p in entry["parts"]] == [("allreduce", True), ("ring_allreduce", False)]
    code, report = run_json(lab, "ring-allreduce", "--nproc", "3", "--solution", str(solution), "--part", "allreduce")
    entry = by_name(report)["ring-allreduce"]
    assert (code, entry["status"], entry["score"]) == (0, "pass", 1.0), entry
    assert any(n.startswith("allreduce(send, recv): each rank sent 2.00x") for n in entry["notes"]), entry


def test_a_ring_for_two_ranks_only_passes_with_two(lab: Lab) -> None:
    """The wrong ring of tests/wrong passes with 2 ranks, which is why 3 and more are tried."""
    code, report = run_json(lab, "ring-allreduce", "--nproc", "2",
                            "--solution", str(WRONG / "ring_world_size_two_only.py"))
    assert code == 0, by_name(report)["ring-allreduce"]


def test_a_hanging_rank_is_stopped_at_the_timeout_and_located(lab: Lab) -> None:
    started = time.monotonic()
    code, report = run_json(lab, "p2p", "--nproc", "2", "--timeout", "5",
                            "--solution", str(WRONG / "p2p_never_sends.py"))
    elapsed = time.monotonic() - started
    entry = by_name(report)["p2p"]
    assert code == 4 and entry["status"] == "timeout"
    assert entry["ranks"] == [1]
    assert "rank 1 (local) stopped after 5s in p2p at p2p_never_sends.py:" in entry["reason"]
    assert "dist.recv" in entry["reason"]
    assert elapsed < 30
    assert lab.leftovers() == []


@pytest.mark.load
@pytest.mark.cold
def test_on_a_busy_machine_a_start_up_longer_than_the_timeout_is_no_timeout_while_it_moves(lab: Lab) -> None:
    """On a busy machine, importing torch takes longer than --timeout 3: the lab's own start-up is
    judged by the CPU seconds its launchers and ranks say they used, not by a clock load can stop; the
    exercise, the program's own step, still has its 3 s."""
    with cpu_hog():
        code, report = run_json(lab, "p2p", "--nproc", "4", "--timeout", "3")
    assert code == 0 and by_name(report)["p2p"]["status"] == "pass", report
    code, report = run_json(lab, "p2p", "--nproc", "2", "--timeout", "3",
                            "--solution", str(WRONG / "p2p_never_sends.py"))
    assert code == 4 and "rank 1 (local) stopped after 3s in p2p" in by_name(report)["p2p"]["reason"], report
    assert lab.leftovers() == []


def test_no_hang_is_said_while_a_connection_of_the_ranks_still_moves(lab: Lab) -> None:
    """Both ranks receive first, while each moves bytes on a connection of its own for 8 s: no verdict
    then (each rank's line that its traffic stopped comes out, which a stopped rank could not print),
    the cycle after."""
    result = lab("launch", "--nproc", "2", "--hang-after", "3", str(REPO / "tests/why/recv_cycle_while_bytes_move.py"),
                 timeout=120)
    assert result.code == 4 and "0 waits for 1, 1 for 0" in result.out, result.text[-3000:]
    assert {"[local r0] rank 0: its side traffic stopped", "[local r1] rank 1: its side traffic stopped"} <= set(
        result.out.splitlines()), result.out
    assert lab.leftovers() == []


@pytest.mark.cold
def test_sigint_stops_every_rank(lab: Lab) -> None:
    proc = lab.popen("run", "p2p", "--nproc", "3", "--timeout", "120",
                     "--solution", str(WRONG / "p2p_never_sends.py"))
    code, out = lab.interrupt_when_running(proc, 4)  # the lab and 3 ranks
    assert code == 130, out
    assert lab.leftovers() == []
    # where each rank was, said as such: no diagnosis of a run that was stopped before it could end
    assert "lab: interrupted; where each rank was:" in out and all(f"rank {r} (local): " in out for r in range(3)), out
    assert "fix:" not in out, out


def test_local_hosts_from_an_inventory_run_end_to_end(lab: Lab, tmp_path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(
        "all:\n  vars:\n    ansible_connection: local\n    slots: 2\n"
        "  hosts:\n    alpha:\n    beta:\n")
    result = lab("run", "p2p", "all-gather", "--hosts", str(inventory))
    assert result.code == 0, result.text
    assert "[alpha r0] " in result.out or "[beta r3] " in result.out or "PASS" in result.out
    code, report = run_json(lab, "all-gather", "--hosts", str(inventory))
    assert code == 0
    assert [(r["host"], r["rank"]) for r in report["ranks"]] == [
        ("alpha", 0), ("alpha", 1), ("beta", 2), ("beta", 3)]


def test_dry_run_prints_the_plan_as_yaml_and_starts_nothing(lab: Lab) -> None:
    result = lab("run", "all", "--nproc", "3", "--init", "tcp", "--dry-run")
    assert result.code == 0, result.err
    plan = yaml.safe_load(result.out)
    assert plan["world_size"] == 3 and plan["backend"] == "gloo"
    assert [r["env"]["RANK"] for r in plan["ranks"]] == ["0", "1", "2"]
    assert plan["stages"][1]["init_method"].startswith("tcp://127.0.0.1:")


def test_list_names_every_exercise(lab: Lab) -> None:
    result = lab("list")
    assert result.code == 0
    assert [line.split()[0] for line in result.out.splitlines()] == list(registry.EXERCISES)


@pytest.mark.parametrize("args, fragment", [
    (("run", "nope"), "unknown exercise 'nope'"),
    (("run", "p2p", "--nproc", "0"), "--nproc must be at least 1"),
    (("run", "p2p", "--timeout", "-1"), "--timeout must be positive"),
    (("launch", "--timeout", "-1", str(WRONG / "p2p_crashes.py")), "--timeout must be 0 (no limit) or more"),
    (("launch", "--node_rank", "1", str(WRONG / "p2p_crashes.py")), "--node_rank: torchrun's flag; the lab starts "
                                                                     "every host's ranks itself"),
    (("launch", "--master-port", "29500", str(WRONG / "p2p_crashes.py")), "the lab chooses the rendezvous itself"),
    (("run", "p2p", "broadcast", "--solution", str(WRONG / "p2p_crashes.py")), "exactly one exercise"),
    (("run", "p2p", "--solution", "/no/such/file.py"), "not a readable .py file"),
    (("run", "p2p", "--backend", "mpi"), "invalid choice"),
    (("run", "p2p", "--hosts", "/no/such/inventory.yaml"), "/no/such/inventory.yaml"),
])
def test_bad_input_is_one_line_and_exit_2(lab: Lab, args: tuple[str, ...], fragment: str) -> None:
    result = lab(*args)
    assert result.code == 2
    assert fragment in result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    assert "Traceback" not in result.err


def test_torchruns_own_spelling_of_the_flags_that_mean_the_same_is_understood(lab: Lab, tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n")
    result = lab("launch", "--standalone", "--nproc_per_node", "2", "--max_restarts", "0", "--log_dir",
                 str(tmp_path / "logs"), str(script))
    assert result.code == 0, result.text
    assert "rank 1 of 2" in result.out and (tmp_path / "logs" / "rank_1.log").exists(), result.text


def test_bad_inventory_names_file_and_line(lab: Lab, tmp_path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n    a:\n      slots: 0\n")
    result = lab("run", "p2p", "--hosts", str(inventory))
    assert result.code == 2
    assert result.err.strip().startswith(f"lab: error: {inventory}:4: ")
    assert "slots" in result.err and "Traceback" not in result.err


def test_junit_report_grades_a_submission(lab: Lab, tmp_path) -> None:
    report = tmp_path / "report.xml"
    result = lab("run", "all-reduce", "--nproc", "3", "--junit", str(report),
                 "--solution", str(WRONG / "all_reduce_max_for_sum.py"))
    assert result.code == 1
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("failures")) == ("1", "1")
    failure = suite.find("testcase/failure")
    assert failure is not None and "all_reduce SUM" in failure.get("message", "")
    result = lab("run", "all-reduce", "broadcast", "--nproc", "3", "--junit", str(report))
    assert result.code == 0
    cases = ET.parse(report).getroot().findall("testsuite/testcase")
    assert [c.get("name") for c in cases] == ["all-reduce", "broadcast"]  # (in the order named)
    assert all(len(c) == 0 for c in cases)  # no failure, error or skip inside


def received_tensor(out: str) -> str:
    """What rank 1 printed it holds after the receive, as one line of numbers."""
    lines = [line.split("] ", 1)[1] for line in out.splitlines() if line.startswith("[local r1] ")]
    text = " ".join(lines)
    found = re.findall(r"(?:after: |rank 1: )tensor\((\[\[.*?\]\])\)", text)
    return re.sub(r"\s+", " ", found[-1]) if found else ""


def test_launch_runs_the_tutorials_scripts_unchanged(lab: Lab, tmp_path) -> None:
    for script in tutorial_scripts(tmp_path):
        n = script.nproc
        result = lab("launch", "--nproc", str(n), "--timeout", "120", str(script.path))
        assert result.code == 0, result.text
        assert f"{script.name}: {n} of {n} ranks succeeded" in result.out
        assert_prints_as_shown(script, result.out)
        if script.name.startswith("p2p"):
            received = received_tensor(result.out)
            assert received and received != "[[0., 0.], [0., 0.]]", result.out  # rank 0's data reached rank 1
    assert lab.leftovers() == []


def test_launch_reports_the_failing_rank_and_stops_the_others(lab: Lab, tmp_path) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1':\n    print('bye from 1', file=sys.stderr); sys.exit(7)\n"
                      "time.sleep(300)\n")
    result = lab("launch", "--nproc", "3", "--log-dir", str(tmp_path / "logs"), str(script))
    assert result.code == 1, result.text
    assert "lab: Rank 1 (local) failed first: it exited with status 7 at fails.py:3." in result.out  # the cause
    assert lab.leftovers() == []
    # --log-dir: each rank's lines in a file of its own, its stderr's marked, and how the job ended
    logs = tmp_path / "logs"
    assert (logs / "rank_1.log").read_text() == "[err] bye from 1\n" and (logs / "rank_2.log").read_text() == ""
    summary = json.loads((logs / "summary.json").read_text())
    assert summary["exit_code"] == 1 and summary["cause"]["headline"].startswith("Rank 1 (local) failed first")
    assert [(r["rank"], r["log"]) for r in summary["ranks"]] == [(n, f"rank_{n}.log") for n in range(3)]
    assert summary["ranks"][1]["exit_code"] == 7, summary["ranks"]


def test_launch_names_the_cause_of_an_error_every_torch_user_meets(lab: Lab, tmp_path) -> None:
    """MASTER_PORT taken on rank 0's host, for real: the script holds the port, then starts the store on it."""
    script = tmp_path / "taken.py"
    script.write_text("import os, socket, torch.distributed as dist\n"
                      "held = socket.create_server(('', 0))\n"
                      "port = held.getsockname()[1]\n"
                      "dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=0, world_size=1)\n")
    result = lab("launch", "--nproc", "1", "--timeout", "60", str(script))
    assert result.code == 1, result.text
    assert "what the ranks printed means:" in result.out
    cause = result.out.split("what the ranks printed means:", 1)[1]
    assert re.search(r"rank 0 \(local\) printed '(?i:EADDRINUSE|address already in use)': MASTER_PORT is already "
                     r"taken on MASTER_ADDR's host", " ".join(cause.split())), cause
    assert lab.leftovers() == []


@pytest.mark.parametrize("solution, status, fragment", [
    ("average_gradients_only.py", "pass", ""),
    ("average_gradients_no_divide.py", "fail",
     "in units of one process's step on the full batch: expected 1.0, got 2.0"),
    ("nothing_to_grade.py", "fail", "defines neither run() nor any function of dsgd.py to replace"),
])
def test_a_solution_may_define_only_the_function_it_replaces(lab: Lab, solution: str, status: str,
                                                             fragment: str) -> None:
    code, report = run_json(lab, "dsgd", "--nproc", "2", "--solution", str(SOLUTIONS / solution))
    entry = by_name(report)["dsgd"]
    assert (entry["status"], code) == (status, 0 if status == "pass" else 1), entry
    assert fragment in entry["reason"]


def test_doctor_from_the_command_line(lab: Lab, tmp_path) -> None:
    result = lab("doctor", "--nproc", "2")
    assert result.code == 0, result.text
    assert "ok: the cluster can run a job" in result.out
    result = lab("doctor", "--json")
    assert result.code == 0 and json.loads(result.out)["ok"] is True
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  hosts:\n    a:\n      ansible_connection: local\n      network_interface: nope0\n")
    result = lab("doctor", "--hosts", str(inventory))
    assert result.code == 1, result.text
    assert "nope0" in result.out


def test_a_launch_says_what_it_is_doing_live_on_a_terminal_and_a_line_a_phase_in_a_pipe(lab: Lab,
                                                                                        tmp_path: Path) -> None:
    """Never silent: in a pipe, one plain line on stderr for each phase; on a terminal (a real pty),
    a live line with the phase and the time, which is gone when the run ends."""
    script = tmp_path / "work.py"
    script.write_text("import time\ntime.sleep(3)\nprint('worked')\n")
    piped = lab("launch", "--nproc", "2", str(script))
    assert piped.code == 0, piped.text
    said = [line for line in piped.err.splitlines() if line.startswith("lab: ")]
    kinds = [line.split(" ", 2)[1].rstrip(":") for line in said]
    assert kinds[:3] == ["reaching", "holding", "starting"] and kinds[-2:] == ["running", "finishing"], said
    assert set(kinds) == {"reaching", "holding", "starting", "checking", "running", "finishing"}, said
    assert "lab: running: 2 of 2 rank(s) at work" in said
    main, secondary = pty.openpty()
    proc = subprocess.Popen(lab.argv("launch", "--nproc", "2", str(script)), cwd=REPO,
                            env={**lab.env, "TERM": "xterm"}, stdin=subprocess.DEVNULL, stdout=secondary,
                            stderr=secondary)
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # (EIO: the other side is closed)
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert proc.wait(timeout=60) == 0, shown.decode(errors="replace")[-3000:]
    screen = shown.decode(errors="replace")
    assert re.search(r"lab: running: 2 of 2 rank\(s\) at work\S* \S*0:00:0[2-9]", screen), screen[-3000:]
    assert "work.py: 2 of 2 ranks succeeded" in screen.rsplit("\x1b[2K", 1)[-1], screen[-500:]  # the line gone


def test_a_project_is_carried_once_and_its_kept_copy_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """How a launch carries a project to a host that is not this machine (lab.core.workcache), on
    this machine's own processes: a second launch of an unchanged project takes the host's kept copy
    (nothing carried); what the ranks write in their folder never reaches the kept copy; a changed
    file is carried anew; a folder of kept copies that is not safely the user's is not used. (Over SSH and
    on the container lab: test_lab_jobs.py.)"""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "helper.py").write_text("VALUE = 1\n")
    (project / "train.py").write_text(
        "import os\nfrom helper import VALUE\n"
        "out = f\"out-{os.environ['RANK']}.txt\"\n"
        "print('value', VALUE, 'seen-before', os.path.exists(out))\n"
        "open(out, 'w').write('written by a rank')\n")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # (this process's own temporary folder: tempfile's cache)
    caplog.set_level(logging.DEBUG, logger="lab.core")

    def launch() -> str:
        caplog.clear()
        lines: list[str] = []
        plan = build_launch_plan(local_inventory(2), str(project / "train.py"), (), 120.0,
                                 workdir=workdir.collect(project), bring_back_max=0)  # (the copy's part alone)
        outcome = run_plan(plan, on_line=lambda _state, _stream, line: lines.append(line))
        assert outcome.status == "completed" and all(s.done for s in outcome.ranks), lines[-20:]
        assert sum("seen-before False" in line for line in lines) == 2, lines
        return "\n".join(lines) + "\n" + caplog.text

    assert "the project (2 file(s)) carried there" in launch()
    again = launch()
    assert "as the host kept it, unchanged" in again and "value 1" in again
    (project / "helper.py").write_text("VALUE = 22\n")
    changed = launch()
    assert "carried there" in changed and "value 22" in changed
    kept = temp / f"lab-work-{os.getuid()}"
    assert len(list(kept.iterdir())) == 2 and not list(kept.glob("*/out-*.txt")) and not list(project.glob("out-*"))
    kept.chmod(0o755)  # (not safely the user's: others may look in)
    unsafe = launch()
    assert "no kept projects (unsafe)" in unsafe and "value 22" in unsafe
    # an empty project (a notebook's new folder) has its folder there all the same: its ranks start in it
    empty = tmp_path / "empty"
    empty.mkdir()
    plan = build_launch_plan(local_inventory(2), "platform", (), 120.0, workdir=workdir.collect(empty), module=True,
                             bring_back_max=0)
    lines: list[str] = []
    outcome = run_plan(plan, on_line=lambda _state, _stream, line: lines.append(line))
    assert outcome.status == "completed" and all(s.done for s in outcome.ranks), lines[-20:]


def test_what_the_ranks_write_in_a_carried_project_comes_back_into_it(tmp_path: Path) -> None:
    """A project carried to its host (lab.core.bringback, on this machine's own processes): what the
    ranks wrote in their copy is in the project when the job ends, but a file of the project changed
    here while the job ran, which stays as it is (the host's beside it, under .lab/hosts/); more than
    the bound stays on the host, in its run directory, said. (Across hosts: test_lab_jobs.py.)"""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "notes.txt").write_text("mine\n")
    (project / "train.py").write_text(
        "import os, time\nr = os.environ['RANK']\nos.makedirs('out', exist_ok=True)\n"
        "os.makedirs('__pycache__', exist_ok=True)\nopen('__pycache__/x.pyc', 'w').write('never the job\\'s')\n"
        "open('out/ckpt.pt', 'wb').write(b'step 10' * 1000)\nopen(f'out/log-{r}.txt', 'w').write('rank ' + r)\n"
        "open('notes.txt', 'w').write('the job\\'s\\n')\ntime.sleep(1)\n")

    def launch(**options: object) -> RunOutcome:
        plan = build_launch_plan(local_inventory(2), str(project / "train.py"), (), 120.0,
                                 workdir=workdir.collect(project), **options)  # type: ignore[arg-type]
        outcome = run_plan(plan)
        assert outcome.status == "completed" and all(s.done for s in outcome.ranks), outcome
        return outcome

    def change_notes_meanwhile() -> None:
        time.sleep(0.5)
        (project / "notes.txt").write_text("mine, changed while the job ran\n")

    changer = threading.Thread(target=change_notes_meanwhile)
    changer.start()
    outcome = launch()
    changer.join()
    assert outcome.brought_back == [
        "brought back 4 file(s), 6.9 KiB, that the ranks wrote into the project: out/ckpt.pt, out/log-0.txt, "
        "out/log-1.txt, .lab/hosts/local/notes.txt (1 of them under .lab/hosts/: their hosts disagree, or the "
        "project's own changed meanwhile)"]
    assert (project / "out" / "ckpt.pt").read_bytes() == b"step 10" * 1000
    assert (project / "out" / "log-1.txt").read_text() == "rank 1"
    assert (project / "notes.txt").read_text() == "mine, changed while the job ran\n"
    assert (project / ".lab" / "hosts" / "local" / "notes.txt").read_text() == "the job's\n"
    shutil.rmtree(project / "out")
    over = launch(bring_back_max=1000)
    [line] = over.brought_back
    assert re.fullmatch(r"not brought back: local: 6\.9 KiB in 4 file\(s\), more than --bring-back-max 1000 bytes "
                        r"in all; they stay in (/\S+)/work on local", line), line
    kept = Path(line.split("they stay in ")[1].split(" on local")[0])
    assert (kept / "out" / "ckpt.pt").is_file() and not (project / "out").exists()
    shutil.rmtree(kept.parent)


def test_a_checkpoint_comes_back_as_it_is_saved_while_the_job_goes_on(tmp_path: Path) -> None:
    """--sync-back on a project carried to its host: each torch.save of its ranks that the patterns
    match is in the project while the job still runs (the test sees step 0 there before it lets the
    job save step 1), said in a line; a file they do not match comes at the end, with the last saves.
    (What ranks of other hosts than rank 0's save comes at the end too.)"""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text(
        "import os, time, torch\nrank = os.environ['RANK']\nos.makedirs('out', exist_ok=True)\n"
        "torch.save({'step': 0, 'rank': rank}, f'out/ckpt-{rank}.pt')\ntorch.save([0], 'out/other.bin')\n"
        "while not os.path.exists('../go') and time.time() < float(os.environ['UNTIL']):\n    time.sleep(0.1)\n"
        "torch.save({'step': 1, 'rank': rank}, f'out/ckpt-{rank}.pt')\n")
    plan = build_launch_plan(local_inventory(2), str(project / "train.py"), (), 120.0,
                             workdir=workdir.collect(project), sync_back=("*.pt",),
                             rank_env={"UNTIL": str(time.time() + 60)})
    notes: list[str] = []
    outcomes: list[RunOutcome] = []
    job = threading.Thread(target=lambda: outcomes.append(run_plan(plan, on_note=notes.append)))
    job.start()
    deadline = time.monotonic() + 60
    while len(notes) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    import torch

    assert job.is_alive() and torch.load(project / "out" / "ckpt-0.pt") == {"step": 0, "rank": "0"}, notes
    assert torch.load(project / "out" / "ckpt-1.pt") == {"step": 0, "rank": "1"} and \
        not (project / "out" / "other.bin").exists()
    (Path(tempfile.gettempdir()) / plan.run_name / "go").touch()  # (beside the copy: the job goes on)
    job.join(60)
    [outcome] = outcomes
    assert outcome.status == "completed", outcome
    assert set(notes) == {f"brought back out/ckpt-{r}.pt (1.2 KiB) from local, as its rank saved it"
                          for r in (0, 1)}, notes  # (step 1's saves as well, where the job had not ended first)
    assert torch.load(project / "out" / "ckpt-0.pt") == {"step": 1, "rank": "0"}  # (the end's: the last)
    assert (project / "out" / "other.bin").is_file()
    assert outcome.brought_back[0].startswith("brought back 3 file(s)"), outcome.brought_back


def test_what_cannot_come_back_stays_on_the_host_said_and_the_run_still_ends_clean(tmp_path: Path) -> None:
    """A path the job wrote that cannot land in the project (a folder of the project's there): the
    job's files stay in the host's run directory, a line says where, and nothing is left running."""
    project = tmp_path / "proj"
    (project / "out" / "ckpt.pt").mkdir(parents=True)  # (here a folder; on the host the job writes a file)
    (project / "out" / "ckpt.pt" / "keep.txt").write_text("the user's\n")
    (project / "train.py").write_text("import os, shutil\nif os.environ['RANK'] == '0':\n"
                                      "    shutil.rmtree('out')\n    os.makedirs('out')\n"
                                      "    open('out/ckpt.pt', 'w').write('step 10')\n")
    plan = build_launch_plan(local_inventory(1), str(project / "train.py"), (), 120.0, workdir=workdir.collect(project))
    outcome = run_plan(plan)
    assert outcome.status == "completed", outcome
    [line] = outcome.brought_back
    assert re.fullmatch(r"not brought back: what the ranks wrote, for the lab could not bring it back "
                        r"\(\w+Error: .+\): it stays in local:(/\S+)", line), line
    kept = Path(line.rsplit("local:", 1)[1])
    assert (kept / "work" / "out" / "ckpt.pt").read_text() == "step 10"
    assert (project / "out" / "ckpt.pt" / "keep.txt").read_text() == "the user's\n"
    shutil.rmtree(kept)


def test_in_place_the_ranks_start_in_the_project_and_keep_the_callers_python_path(lab: Lab, tmp_path: Path) -> None:
    """On this machine a launch runs its ranks in the project folder itself (nothing carried): what
    they write there is there after the job, a second launch sees it, and the caller's PYTHONPATH
    (a src-layout project's src/, a folder outside the project) is theirs whole."""
    project = tmp_path / "proj"
    (project / "src" / "pkg").mkdir(parents=True)
    (project / "src" / "pkg" / "__init__.py").write_text("")
    (project / "src" / "pkg" / "mod.py").write_text("VALUE = 7\n")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "other.py").write_text("OTHER = 8\n")
    (project / "train.py").write_text(
        "import os\nfrom pkg.mod import VALUE\nfrom other import OTHER\n"
        "out = f\"out/rank-{os.environ['RANK']}.txt\"\n"
        "print('value', VALUE, OTHER, 'in', os.getcwd(), 'seen-before', os.path.exists(out))\n"
        "os.makedirs('out', exist_ok=True)\nopen(out, 'w').write('written by a rank')\n")
    env = {**lab.env, "PYTHONPATH": f"{project / 'src'}:{tmp_path / 'elsewhere'}"}

    def launch(*options: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(lab.argv("launch", "--nproc", "2", *options, str(project / "train.py")), cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done

    first = launch()
    assert first.stdout.count(f"value 7 8 in {project} seen-before False") == 2, first.stdout[-2000:]
    assert "left out" not in first.stderr, first.stderr
    assert sorted(p.name for p in (project / "out").iterdir()) == ["rank-0.txt", "rank-1.txt"]
    again = launch("--exclude", "out/")  # (what a copy would leave out: here there is no copy)
    assert again.stdout.count("seen-before True") == 2
    assert (f"lab: --exclude changed nothing: on this machine the ranks run in the project itself ({project}), as "
            f"under torchrun; nothing is carried") in again.stderr, again.stderr
    assert lab.leftovers() == []


def test_a_real_project_runs_as_torchrun_would_run_it(lab: Lab, tmp_path: Path) -> None:
    """A project shaped as pytorch/examples' DDP series (a launcher script, a trainer and a data
    module in a package, a config and a data file), launched with --nproc-per-node, --env and
    --log-dir on this machine: its ranks run in the project itself, as under torchrun, so the snapshot
    it writes to a relative path is in the project when the job has ended, for the next to resume."""
    project = tmp_path / "ddp_series"
    shutil.copytree(DDP_SERIES, project)
    result = lab("launch", "--nproc-per-node", "2", "--env", "SERIES_TAG=series-1", "--log-dir",
                 str(tmp_path / "logs"), str(project / "train.py"), "--epochs", "2", timeout=300)
    assert result.code == 0, result.text[-3000:]
    assert_ddp_series_trained(result.out, 2)
    assert "trained 2 epoch(s)" in (tmp_path / "logs" / "rank_0.log").read_text()
    assert (project / "snapshots" / "latest.pt").is_file()
    assert lab.leftovers() == []


def test_a_trainer_that_needs_a_package_gets_it_once_and_resumes_as_torchrun_trains(lab: Lab, tmp_path: Path) -> None:
    """tests/projects/tokenized (its tokenizer a package this machine's Python lacks, named in its
    requirements.txt): under torchrun with the package on its path, 4 steps; under the lab with
    --requirements, 2 steps (the environment installed, said) and 2 more resumed from its checkpoint
    (the environment kept: nothing said): the same losses, the package imported from the environment."""
    project = tmp_path / "tokenized"
    shutil.copytree(TOKENIZED, project)
    version = tokenized_project(project)
    installed = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--target", str(installed),
                    *(str(w) for w in (project / "wheels").glob("*.whl"))], check=True)
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py",
                               "--steps", "4"], cwd=project, env={**os.environ, "PYTHONPATH": str(installed)},
                              capture_output=True, text=True, timeout=300)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    shutil.rmtree(project / "out")
    env = {**lab.env, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # (this machine's wheels: the test's own)
    lab.env, before = env, lab.env
    try:
        first = lab("launch", "--nproc", "2", "--requirements", str(project / "requirements.txt"),
                    str(project / "train.py"), "--steps", "2", timeout=300)
        resumed = lab("launch", "--nproc", "2", "--requirements", str(project / "requirements.txt"),
                      str(project / "train.py"), "--steps", "4", "--init-from", "resume", timeout=300)
    finally:
        lab.env = before
        key = requirements.read(project / "requirements.txt").key
        for kept in Path(tempfile.gettempdir(), f"lab-env-{os.getuid()}").glob(f"{key}-*"):  # (its lock too)
            shutil.rmtree(kept) if kept.is_dir() else kept.unlink()
    assert first.code == 0 and resumed.code == 0, (first.text[-3000:], resumed.text[-3000:])
    assert "installed the requirements on local: kept there for the next launches" in first.err, first.err
    assert "installed the requirements" not in resumed.err, resumed.err
    steps = re.compile(r"step \d+ loss \d+\.\d+")
    assert len(steps.findall(torchrun.stdout)) == 4
    assert steps.findall(first.out) + steps.findall(resumed.out) == steps.findall(torchrun.stdout)
    assert f"labtok {version} from " in resumed.out and "/requirements-env/labtok/" in resumed.out, resumed.out
    assert (tmp_path / "cache" / "lab" / "wheels").is_dir()
    assert lab.leftovers() == []


STDIN_ECHO = """\
import hashlib, os, sys
data = sys.stdin.buffer.read()
print("rank", os.environ["RANK"], "read", len(data), "bytes", hashlib.sha256(data).hexdigest()[:16], flush=True)
"""


@pytest.mark.parametrize("launcher", ["lab", "torchrun", "spawn"])
def test_rank_0_reads_the_launchs_stdin_and_the_others_read_nothing(lab: Lab, tmp_path: Path, launcher: str) -> None:
    """As under torchrun: what `lab launch` reads on its stdin, 6 MiB of it, is rank 0's, whole and
    in order, and its end is rank 0's end of file; the other ranks' stdin is empty. Under torchrun
    and mp.spawn, whose agents start the ranks, through the host's relay (lab.rank.stdin.Relay)."""
    script = tmp_path / "echo.py"
    script.write_text(STDIN_ECHO)
    text = "".join(f"line {i} of the launch's stdin\n" for i in range(200_000))
    result = lab("launch", "--nproc", "3", "--launcher", launcher, str(script), stdin=text)
    assert result.code == 0, result.text[-3000:]
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    assert f"[local r0] rank 0 read {len(text)} bytes {digest}" in result.out, result.out
    empty = hashlib.sha256(b"").hexdigest()[:16]
    assert f"[local r1] rank 1 read 0 bytes {empty}" in result.out and f"rank 2 read 0 bytes {empty}" in result.out
    assert lab.leftovers() == []


def test_a_requirement_nobody_has_is_one_line_naming_it_and_the_host(lab: Lab, tmp_path: Path) -> None:
    """A package no index nor wheel holds: the launch fails before any rank starts, in one line
    naming the package and the host; a line the lab cannot install names its file and line."""
    (tmp_path / "train.py").write_text("print('never')\n")
    (tmp_path / "requirements.txt").write_text("--no-index\nnosuchpackage-lab-test>=2\n")
    (tmp_path / "editable.txt").write_text("numpy\n-e ./tokenizer\n")
    env = {**lab.env, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    lab.env, before = env, lab.env
    try:
        missing = lab("launch", "--nproc", "2", "--requirements", str(tmp_path / "requirements.txt"),
                      str(tmp_path / "train.py"))
        editable = lab("launch", "--nproc", "2", "--requirements", str(tmp_path / "editable.txt"),
                       str(tmp_path / "train.py"))
    finally:
        lab.env = before
    assert missing.code == 5 and "never" not in missing.out, missing.text[-2000:]
    assert [line for line in missing.err.splitlines() if line.startswith("lab: error")] == [
        f"lab: error: host local: cannot get the packages of {tmp_path / 'requirements.txt'} for its Python "
        f"{sys.version_info[0]}.{sys.version_info[1]} on {platform.machine()}: No matching distribution found for "
        "nosuchpackage-lab-test>=2"], missing.err
    assert editable.code == 2 and editable.err.strip() == (
        f"lab: error: {tmp_path / 'editable.txt'}:2: -e: not what the lab can install on the hosts (it installs "
        "wheels: build one and name its file)"), editable.err
    assert "Traceback" not in missing.err + editable.err and lab.leftovers() == []


def test_a_program_that_makes_its_own_store_gets_the_held_port(lab: Lab) -> None:
    """The port holder hands its socket to rank 0 (no other user can bind the port meanwhile); a
    program that makes its master TCPStore itself on that port gets that store, not EADDRINUSE."""
    result = lab("run", "init-env", "--nproc", "3", "--solution", str(REPO / "tests" / "solutions" /
                                                                       "init_env_own_store.py"))
    assert result.code == 0 and "PASS    init-env" in result.out, result.text[-3000:]
