"""Hostile submissions: a rank that floods its output, prints one endless line, or ends itself
inside the exercise (os._exit, sys.exit, a signal). The controller's memory stays flat, a correct
run still passes, and an exit is a failed check that names the rank and how it ended."""
from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest

from lab.core.outcome import SHOWN_LINES, TAIL_LINES, Output, ended
from lab.core.streams import read_lines
from lab.errors import ExitCode
from lab.rank.output import tagged
from lab.rank.protocol import EVENT_MAX, LINE_MAX

from .conftest import Lab

MiB = 1 << 20
PEAK_LIMIT_MB = 300  # the controller's peak resident memory while every rank prints 64 MiB

REFERENCE = "from lab.suite.exercises.p2p import run as reference\n"

FLOOD = REFERENCE + """\
import sys


def run(rank, size, device):
    line = f"rank {rank} says ".ljust(1023, "x")
    for _ in range(32 * 1024):  # 32 MiB of 1 KiB lines on stdout, a print at a time
        print(line)
    block = ("e" * 63 + "\\n") * (1 << 14)
    for _ in range(32):  # 32 MiB of 64-byte lines on stderr, 1 MiB a write
        sys.stderr.write(block)
    return reference(rank, size, device)
"""

ENDLESS_LINE = REFERENCE + """\
import sys


def run(rank, size, device):
    result = reference(rank, size, device)
    piece = "z" * (1 << 20)
    for _ in range(32):  # one line of 32 MiB, no newline: the lab's result comes in the middle of it
        sys.stdout.write(piece)
    sys.stdout.flush()
    return result
"""

DIES = REFERENCE + """\
import os
import signal
import sys


def run(rank, size, device):
    if rank == 1:
        print("rank 1 goes", flush=True)
        {how}
    return reference(rank, size, device)
"""


def run_measured(lab: Lab, *args: str, timeout: float = 120) -> tuple[int, dict, str, int]:
    """``python -m lab ARGS --json``: its exit code, report, stderr and peak resident memory in MB."""
    result, peak = lab.measured(*args, "--json", timeout=timeout)
    assert result.out.strip(), f"no JSON on stdout; stderr:\n{result.err[-3000:]}"
    return result.code, json.loads(result.out), result.err, peak


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.local
def test_a_flood_of_output_keeps_the_controller_small_and_a_correct_run_passes(lab: Lab, tmp_path: Path) -> None:
    code, report, err, peak = run_measured(lab, "run", "p2p", "--nproc", "3",
                                           "--solution", write(tmp_path, "p2p_flood.py", FLOOD))
    entry = report["exercises"][0]
    assert (code, entry["status"]) == (ExitCode.OK, "pass"), entry
    assert peak < PEAK_LIMIT_MB, f"the controller peaked at {peak} MB"
    for rank in report["ranks"]:  # counted, and said to be dropped
        output = rank["output"]
        assert output["bytes"] >= 64 * MiB and output["lines"] >= (32 + 512) * 1024, rank
        assert output["shown"] == SHOWN_LINES and output["dropped"] == output["lines"] - SHOWN_LINES, rank
    # on_line got the first SHOWN_LINES of each rank, then one word that the rest is not shown
    for r in range(3):
        shown = [line for line in err.splitlines() if line.startswith(f"[local r{r}] ")]
        assert SHOWN_LINES <= len(shown) <= SHOWN_LINES + 1, len(shown)
        assert sum("the rest of this output is counted, not shown" in line for line in shown) == 1
    assert len(err) < 3 * (SHOWN_LINES + 10) * 1100
    assert lab.leftovers() == []


@pytest.mark.local
def test_the_text_report_says_what_a_flooding_rank_printed(lab: Lab, tmp_path: Path) -> None:
    solution = write(tmp_path, "p2p_some_flood.py", REFERENCE + (
        "def run(rank, size, device):\n"
        "    print(('w' * 99 + '\\n') * 5000, end='')\n"
        "    return reference(rank, size, device)\n"))
    result = lab("run", "p2p", "--nproc", "2", "--solution", solution)
    assert result.code == ExitCode.OK, result.text
    # 5000 lines, and the 2 the reference prints
    assert re.search(r"^note: rank 1 \(local\) printed 5002 lines \(488\.\d KiB\): the first 1000 were shown, "
                     r"the other 4002 counted and dropped$", result.out, re.MULTILINE), result.out[-2000:]


@pytest.mark.local
def test_one_endless_line_is_cut_and_the_result_after_it_still_counts(lab: Lab, tmp_path: Path) -> None:
    code, report, err, peak = run_measured(lab, "run", "p2p", "--nproc", "3", "--timeout", "30",
                                           "--solution", write(tmp_path, "p2p_endless.py", ENDLESS_LINE))
    entry = report["exercises"][0]
    assert (code, entry["status"]) == (ExitCode.OK, "pass"), entry  # every result came through
    assert peak < PEAK_LIMIT_MB, f"the controller peaked at {peak} MB"
    for rank in report["ranks"]:  # the reference's 2 lines, then the endless one
        assert rank["output"]["lines"] == 3 and rank["output"]["bytes"] > 32 * MiB, rank
    # shown cut, with its length (and the line end the rank's relay gives a last line without one)
    assert err.count(f"[cut: {32 * MiB + 1} bytes]") == 3, err[-3000:]
    assert lab.leftovers() == []


@pytest.mark.local
@pytest.mark.parametrize("how, reason", [
    ("os._exit(0)", r"rank 1 \(local\) exited with status 0 during p2p, before reporting its result"),
    ("sys.exit(3)", r"rank 1 \(local\) called sys\.exit\(3\) at p2p_dies\.py:10: sys\.exit\(3\) during p2p "
                    r"and exited with status 3"),
    ("os.kill(os.getpid(), signal.SIGKILL)",  # (a status 137 is read as SIGKILL too)
     r"rank 1 \(local\) was killed by SIGKILL( \(exit status 137\))? during p2p, before reporting its result"),
])
def test_a_rank_that_ends_itself_inside_the_exercise_fails_it(lab: Lab, tmp_path: Path, how: str,
                                                              reason: str) -> None:
    """Not "the run broke": that student's check failed, the dead rank named first as the cause
    (its peers fail after it, with connection errors), and nothing is left running."""
    solution = write(tmp_path, "p2p_dies.py", DIES.replace("{how}", how))
    started = time.monotonic()
    result = lab("run", "p2p", "--nproc", "3", "--timeout", "30", "--solution", solution, "--json")
    report = json.loads(result.out)
    entry = report["exercises"][0]
    assert (result.code, entry["status"]) == (ExitCode.CHECK_FAILED, "fail"), entry
    assert re.match(reason, entry["reason"]), entry["reason"]
    assert 1 in entry["ranks"]
    assert report["ranks"][1]["ended"] in entry["reason"]
    assert time.monotonic() - started < 30
    assert lab.leftovers() == []


# The pieces, without processes.

def lines_of(data: bytes, prefix: bytes = b"\x1flab:tok ") -> list[tuple[bytes, int, str]]:
    return list(read_lines(io.BufferedReader(io.BytesIO(data)), prefix, lambda: False))


def test_an_event_that_output_without_a_newline_ran_into_is_a_line_of_its_own() -> None:
    event = b'\x1flab:tok {"event": "done"}'
    assert lines_of(b"a\r\nno newline" + event + b"\nb") == [
        (b"a", 3, "whole"), (b"no newline", 10, "whole"), (event, len(event) + 1, "whole"), (b"b", 1, "whole")]


def test_a_line_longer_than_an_event_may_be_is_cut_and_never_held_whole() -> None:
    event = b'\x1flab:tok {"event": "done"}'
    long = b"z" * (3 * EVENT_MAX + 5)
    # an event between two pieces of a long line (the rank's channel wrote while its relay passed
    # the line on) comes first, and the line goes on after it
    got = lines_of(long + event + b"\n" + long + b"\nafter\n")
    assert got == [(event, len(event) + 1, "whole"), (long[:LINE_MAX], 2 * len(long) + 1, "cut"),
                   (b"after", 6, "whole")]
    # an event's mark split across two pieces of a long line is still found
    split = b"y" * (2 * EVENT_MAX - 3)
    assert lines_of(split + event + b"\n")[0] == (event, len(event) + 1, "whole")
    # an "event" too long to be one is output, cut
    assert lines_of(b"\x1flab:tok " + long + b"\n")[0][2] == "cut"


def test_lines_past_what_is_shown_are_counted_by_the_block() -> None:
    event = b"\x1flab:tok {}"
    data = b"".join(b"line %d\n" % i for i in range(50_000)) + event + b"\nlast\n"
    got = list(read_lines(io.BufferedReader(io.BytesIO(data)), b"\x1flab:tok ", lambda: True))
    assert {kind for _, _, kind in got} == {"lines", "whole"}
    assert (event, len(event) + 1, "whole") in got  # an event is never inside a block
    output = Output()
    for raw, size, kind in got:
        if kind == "lines":
            output.add_block(raw)
        elif raw != event:
            output.add(raw.decode(), size)
    assert (output.lines, output.size) == (50_001, len(data) - len(event) - 1)
    assert output.tail() == [f"line {i}" for i in range(50_000 - TAIL_LINES + 1, 50_000)] + ["last"]


@pytest.mark.parametrize("code, words", [
    (0, "exited with status 0"), (3, "exited with status 3"), (-9, "was killed by SIGKILL"),
    (137, "was killed by SIGKILL (exit status 137)"), (255, "exited with status 255"),
    (-1, "was killed by a signal or lost its connection (no exit status)"),
])
def test_exit_statuses_in_words(code: int, words: str) -> None:
    assert ended(code) == words


def test_the_relay_passes_a_long_line_on_without_holding_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lab.rank.output.HOLD", 8)
    assert tagged(b"T ", b"0123456789", b"", False) == (b"T 0123456789", b"", True)
    assert tagged(b"T ", b"abc\nd\nef", b"", True) == (b"abc\nT d\n", b"ef", False)
    # no line is an event: a mark is neutralized, and the line tagged like any other
    assert tagged(b"T ", b'\x1flab:x {"a": 1}\n', b"", False) == ('T \u241flab:x {"a": 1}\n'.encode(), b"", False)
