"""The lab's launcher (lab.rank.zygote): what it passes on from a rank's pipes is that rank's, whatever
the rank writes into them, and the ranks it forks from one torch import run as if started alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.rank import stdin
from lab.rank.events import Bad, Done, Event, Exit, WireMeasure, parse_event
from lab.rank.isolation import LAST_USER, USERS_VAR
from lab.rank.protocol import EVENT_MAX, LINE_MAX, NEUTRAL, event_line, rank_tag, untag
from lab.rank.stdin import Frames, frame
from lab.rank.wire import WIRE_VAR
from lab.rank.zygote import StreamFilter

from .conftest import REPO

TOKEN = "tok"


def event(kind: str, **fields: object) -> bytes:
    return event_line(TOKEN, kind, **fields).encode()  # type: ignore[arg-type]


def passed(data: bytes, rank: int = 1, events: bool = True, pieces: int = 7) -> list[bytes]:
    """The lines a StreamFilter passes on for ``data``, fed in pieces of ``pieces`` bytes, then closed."""
    stream_filter = StreamFilter(rank, TOKEN, events)
    out = b"".join(stream_filter.feed(data[i:i + pieces]) for i in range(0, len(data), pieces)) + stream_filter.close()
    assert out.endswith(b"\n")
    return out.split(b"\n")[:-1]


def said(line: bytes) -> Event | None:
    return parse_event(line.decode(), TOKEN)


def test_output_is_tagged_with_the_pipes_rank_and_its_own_events_pass_as_they_came() -> None:
    done = event("done", rank=1, failures=0)
    lines = passed(b"hello\n" + done + b"two\nlines\na last one")
    assert lines == [rank_tag(1) + b"hello", done[:-1], rank_tag(1) + b"two", rank_tag(1) + b"lines",
                     rank_tag(1) + b"a last one"]


@pytest.mark.parametrize("line", [
    event("progress", rank=1, completed=2, inflight=None, moved=0, quiet=0),
    event("flight", rank=1, records=[], inflight=[], counts={}, dropped=0),
    event("end", rank=1, how="raised", code=1, error="ValueError: x", where="a.py:3",
          traceback='Traceback (most recent call last):\n  File "a.py", line 3, in <module>\nValueError: x\n'),
])
def test_the_flight_recorders_events_and_a_scripts_end_pass_as_they_came(line: bytes) -> None:
    assert passed(line) == [line[:-1]]


@pytest.mark.parametrize("line, what", [
    (event("done", rank=0, failures=0), "sent an event as rank 0 (a rank speaks for itself only)"),
    (event("exit", rank=1, code=0), "sent a 'exit' event, which no rank sends"),
    (event("bad", rank=0, what="framed"), "sent a 'bad' event, which no rank sends"),
    (event("wire", rank=0, carried=0, lost=0), "sent a 'wire' event, which no rank sends"),
    (b"\x1flab:tok [1]\n", "sent a malformed event: not an object but a list"),
    (b'\x1flab:tok {"event": "step", "rank": 1}\n', "sent a malformed event: a 'step' event without its 'step'"),
])
def test_an_event_that_is_not_the_ranks_own_is_dropped_and_named_as_its_failure(line: bytes, what: str) -> None:
    assert [said(x) for x in passed(line)] == [Bad(rank=1, what=what)]


def test_marks_that_start_no_event_of_the_run_are_output() -> None:
    lines = passed(b"\x1flab:other-run {}\n" + rank_tag(0) + b"as rank 0\n" + b"err\x1flab:tok {}\n", events=False)
    assert all(untag(line)[0] == 1 for line in lines), lines
    assert b"\x1f" not in b"".join(untag(line)[1] for line in lines)
    assert untag(lines[0])[1] == NEUTRAL + b"lab:other-run {}"
    # on stdout too: a forged tag of another rank's is output of this one
    assert [untag(line)[:2] for line in passed(rank_tag(0) + b"forged\n")] == [(1, NEUTRAL + b"lab-rank:0 forged")]


def test_a_long_line_is_passed_on_cut_with_its_size_and_an_event_between_its_pieces_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lab.rank.zygote.HOLD", 100)
    result = event("result", rank=1, exercise="p2p", value=[1], seconds=0.1)
    long = b"z" * 10_000
    lines = passed(long + result + long + b"\nafter\n", pieces=4096)
    assert lines[0] == result[:-1]  # the relay wrote it between two pieces of the long line
    assert untag(lines[1]) == (1, long[:LINE_MAX], 20_001)  # its start, and its size as printed
    assert lines[2] == rank_tag(1) + b"after" and len(lines) == 3
    # a last line without its end, still long at the end of the stream
    assert untag(passed(long, pieces=4096)[0]) == (1, long[:LINE_MAX], 10_001)


def test_an_event_line_longer_than_an_event_may_be_is_dropped_and_named() -> None:
    lines = passed(b"\x1flab:tok " + b"x" * (EVENT_MAX + 10) + b"\nnext\n", pieces=65536)
    assert said(lines[0]) == Bad(rank=1, what=f"sent an event line longer than {EVENT_MAX} bytes")
    assert lines[1:] == [rank_tag(1) + b"next"]


FORKED = """
import argparse, os, sys
from lab.rank import zygote
sys.argv[1:] = []
sys.exit(zygote.main(argparse.Namespace(nprocs=3, first_rank=4, module="child", args=[])))
"""

CHILD = """
import os, sys, atexit
import torch  # already imported: the zygote's
from lab.rank.protocol import emit
from lab.rank.worker import start_rank
from lab.rank import protocol

def main():
    start_rank()
    rank = int(os.environ["RANK"])
    atexit.register(print, f"atexit of {rank}")
    emit("tok", "done", rank=rank, failures=0)
    if rank == 5:
        emit("tok", "done", rank=4, failures=0)  # another's name
    print(f"rank {rank} local {os.environ['LOCAL_RANK']} torch {'torch' in sys.modules}", flush=True)
    if rank == 6:
        os.kill(os.getpid(), 9)
    sys.exit(3 if rank == 5 else None)
"""


def forked_children(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess[bytes]:
    """The zygote of FORKED, run to its end with ``settings`` in its environment, forking CHILD's ranks."""
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}", "LAB_TOKEN": TOKEN, "OMP_NUM_THREADS": "1", **settings}
    stdin, held_open = os.pipe()  # (the zygote ends its group when its stdin closes: the controller is gone)
    try:
        return subprocess.run([sys.executable, "-c", FORKED], stdin=stdin, capture_output=True, env=env,
                              cwd=tmp_path, timeout=120, start_new_session=True)
    finally:
        os.close(stdin)
        os.close(held_open)


def test_the_zygote_forks_its_ranks_and_reports_each_ones_end(tmp_path: Path) -> None:
    zygote = forked_children(tmp_path, **{WIRE_VAR: "uid"})
    assert zygote.returncode == 1, zygote.stderr  # not every rank ended with status 0
    lines = zygote.stdout.splitlines()
    events = [said(line) for line in lines if line.startswith(b"\x1f")]
    exits = {e.rank: e.code for e in events if isinstance(e, Exit)}
    assert exits == {4: 0, 5: 3, 6: -9}, events
    assert Bad(rank=5, what="sent an event as rank 4 (a rank speaks for itself only)") in events
    assert sorted(e.rank for e in events if isinstance(e, Done)) == [4, 5, 6]
    # asked to, it measured the host's connections while its ranks ran, and said so last, as the host's first rank
    last = events[-1]
    assert isinstance(last, WireMeasure) and (last.rank, last.lost, last.error, last.failed) == (4, 0, "", ""), last
    output = {untag(line)[:2] for line in lines if not line.startswith(b"\x1flab:")}
    assert {(r, f"rank {r} local {r - 4} torch True".encode()) for r in (4, 5, 6)} <= output, output
    assert {(4, b"atexit of 4"), (5, b"atexit of 5")} <= output  # the program ended as the interpreter would
    assert not json.dumps(sorted(str(x) for x in output)).count("atexit of 6")  # (killed: no atexit)


def test_ranks_it_was_asked_to_keep_apart_and_cannot_end_before_they_run_and_say_why(tmp_path: Path) -> None:
    """Asked to run each rank as a user of its own (lab.rank.isolation) where it cannot (here: users
    past the last), no rank runs at all, together or otherwise: each ends with 127 and says why."""
    zygote = forked_children(tmp_path, **{USERS_VAR: str(LAST_USER - 3)})  # (ranks 4 to 6: past the last user)
    events = [said(line) for line in zygote.stdout.splitlines() if line.startswith(b"\x1f")]
    exits = {e.rank: e.code for e in events if isinstance(e, Exit)}
    assert exits == {4: 127, 5: 127, 6: 127} and not any(isinstance(e, Done) for e in events), events
    assert zygote.returncode == 1 and b"torch True" not in zygote.stdout
    said_why = {untag(line)[:2] for line in zygote.stderr.splitlines()}
    for rank in (4, 5, 6):
        assert (rank, f"lab: rank {rank}: cannot keep the rank apart: no user {LAST_USER - 3 + rank} to run it "
                      f"as (1 to {LAST_USER})".encode()) in said_why, zygote.stderr


def test_rank_0s_stdin_frames_come_whole_in_any_pieces_and_end_once() -> None:
    """What the controller sends of its stdin (lab.rank.stdin): frames cut anywhere give back the
    bytes in order; a frame of length 0 ends them; a frame with no length is refused."""
    sent = frame(b"hello\n") + frame(b"") + frame(b"after the end")
    for cut in range(1, len(sent)):
        frames = Frames()
        assert frames.feed(sent[:cut]) + frames.feed(sent[cut:]) == b"hello\n" and frames.ended
    with pytest.raises(ValueError):
        Frames().feed(b"x" * 40)
    with pytest.raises(ValueError):
        Frames().feed(b"12a\nhello")


def test_stdin_rank_0_does_not_read_is_held_to_its_bound_and_the_pipe_closes_at_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stdin, "HOLD_MAX", 10)
    read, write = os.pipe()
    feeder = stdin.Feeder(write)
    feeder.take(frame(b"0123456789abcdef"))
    assert feeder.held == b"0123456789" and feeder.dropped == 6 and feeder.waiting
    feeder.take(frame(b""))
    feeder.write()
    assert os.read(read, 100) == b"0123456789" and feeder.fd is None and os.read(read, 100) == b""
    os.close(read)
