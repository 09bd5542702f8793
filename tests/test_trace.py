"""What the lab writes of a job's calls to look at: ``--trace FILE`` (Chrome trace-event JSON, loaded
here by Chrome DevTools' own trace engine, tests/tools/trace_engine.py) and ``--fr-dir DIR`` (torch's
flight-recorder dumps, read by torch's own analyzer), from a DDP job that hangs and a receive cycle."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, Lab
from .tools import trace_engine

TRAIN, WHY = REPO / "tests" / "train", REPO / "tests" / "why"


def engine() -> None:
    if not trace_engine.installed():
        if os.environ.get("CI") == "true":
            pytest.fail("no node or DevTools' trace engine: tests/setup-host.sh installs them")
        pytest.skip("no node or DevTools' trace engine (tests/setup-host.sh installs them)")


def calls(parsed: dict[str, Any], rank: int, track: int) -> list[str]:
    return [e["name"] for e in parsed["processes"][str(rank)]["threads"][str(track)]["entries"]]


@pytest.mark.local
def test_a_hung_ddp_job_s_trace_and_torch_s_dumps_open_in_their_tools(lab: Lab, tmp_path: Path) -> None:
    engine()
    trace, dumps = tmp_path / "job.json", tmp_path / "fr"
    result = lab("launch", "--nproc", "4", "--hang-after", "5", "--timeout", "60", "--trace", str(trace),
                 "--fr-dir", str(dumps), str(TRAIN / "ddp_checkpoint_barrier.py"), timeout=180)
    assert result.code == 4, result.text
    parsed = trace_engine.parse(trace)
    assert parsed["names"] == {str(r): f"rank {r} (local)" for r in range(4)}
    assert "barrier #11 (in flight at the end)" in calls(parsed, 0, 1)
    for rank in (1, 2, 3):
        issued = calls(parsed, rank, 2)
        assert issued[-1] == "DDP's gradient all_reduce #11 (in flight at the end)", issued
        assert "DDP's broadcast #3" in issued  # (DDP's own, at its construction: one number per group)
        assert calls(parsed, rank, 1) == ["init_process_group #1"]
    bounds = parsed["bounds"]
    assert 0 <= bounds["min"] < bounds["max"]
    said = json.loads(trace.read_text())["otherData"]  # (the moments the benchmarks time the verdicts from)
    assert "first_failure" not in said and 0 < said["hang_found"] <= said["verdict"], said
    # torch's own analyzer reads the dumps as they are, and names the same call
    analyzed = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps),
                               "-p", "rank_"], capture_output=True, text=True, timeout=120)
    assert sorted(os.listdir(dumps)) == [f"rank_{r}" for r in range(4)]
    assert "Culprit rank 0; Error type: COLLECTIVE_TYPE_MISMATCH" in analyzed.stdout + analyzed.stderr, \
        analyzed.stdout[-3000:] + analyzed.stderr[-3000:]


@pytest.mark.local
def test_a_crash_s_trace_says_when_the_first_rank_failed_and_when_the_verdict_came(lab: Lab, tmp_path: Path) -> None:
    trace = tmp_path / "crash.json"
    result = lab("launch", "--nproc", "2", "--timeout", "60", "--trace", str(trace),
                 str(TRAIN / "ddp_checkpoint_reentrant.py"), timeout=180)
    assert result.code == 1, result.text
    said = json.loads(trace.read_text())["otherData"]
    assert said["status"] == "crashed" and "hang_found" not in said
    assert 0 < said["first_failure"] <= said["verdict"] < said["first_failure"] + 60e6, said


@pytest.mark.local
def test_a_receive_cycle_s_trace_draws_who_waits_for_whom(lab: Lab, tmp_path: Path) -> None:
    engine()
    trace = tmp_path / "cycle.json"
    result = lab("launch", "--nproc", "4", "--hang-after", "5", "--timeout", "60", "--trace", str(trace),
                 str(WHY / "recv_cycle.py"), timeout=180)
    assert result.code == 4, result.text
    parsed = trace_engine.parse(trace)
    assert parsed["flows"] == 4  # an arrow from each rank to the one it receives from
    for rank in range(4):
        assert any(name.startswith(f"recv from {(rank - 1) % 4}") and name.endswith("(in flight at the end)")
                   for name in calls(parsed, rank, 1)), calls(parsed, rank, 1)


@pytest.mark.parametrize("option, path, says", [
    ("--trace", "no/such/dir/t.json", "--trace no/such/dir/t.json: no such folder: no/such/dir"),
    ("--fr-dir", "{tmp}/a-file/dumps", "--fr-dir {tmp}/a-file/dumps: Not a directory"),
])
def test_a_record_that_cannot_be_written_is_refused_before_the_job_runs(lab: Lab, tmp_path: Path, option: str,
                                                                         path: str, says: str) -> None:
    (tmp_path / "a-file").write_text("")
    path, says = path.format(tmp=tmp_path), says.format(tmp=tmp_path)
    result = lab("launch", "--nproc", "2", option, path, str(WHY / "p2p_even_odd.py"), timeout=60)
    assert result.code == 2 and says in result.err and "Traceback" not in result.text, result.text
    assert "starting" not in result.err  # (refused before anything ran)

