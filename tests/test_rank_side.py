"""Pieces of the rank side and the hang locator, without starting a cluster."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lab.core.stacks import users_traceback, where_stopped
from lab.rank.protocol import RANK_TAG, rank_tag, untag
from lab.rank.worker import SharedPathError, call_with_context, ensure_shared_path

from .conftest import REPO

DUMP = """\
Thread 0x00007f0000000001 (most recent call first):
  File "/srv/run/lab/rank/worker.py", line 58 in watch
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f0000000002 (most recent call first):
  File "/home/u/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2601 in recv
  File "/srv/run/mine.py", line 3 in run
  File "/srv/run/lab/rank/worker.py", line 170 in run_exercise
""".splitlines()


def test_where_stopped_names_the_program_line_with_its_source(tmp_path: Path) -> None:
    program = tmp_path / "mine.py"
    program.write_text("def run(rank):\n    t = 0\n    dist.recv(t, src=0)\n")
    assert where_stopped(DUMP, {"mine.py": program}) == "mine.py:3 in run: dist.recv(t, src=0)"


def test_where_stopped_outside_any_program_names_the_exercise_threads_innermost_frame() -> None:
    # e.g. a rank stuck in init_process_group: the lab's stdin watcher thread is not it.
    assert where_stopped(DUMP, {}) == "distributed_c10d.py:2601 in recv"
    assert where_stopped(["no frames here"], {}) is None


TRACEBACK = """Traceback (most recent call last):
  File "/tmp/lab-run-1/code/lab/rank/worker.py", line 330, in run_exercise
    value = call_with_context(program.run, self.context(init_method))
            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "<frozen runpy>", line 98, in _run_module_code
  File "/home/me/mine.py", line 12, in run
    dist.all_reduce(t)
  File "/tmp/lab-run-1/code/lab/rank/calls.py", line 120, in wrapper
    return fn(*args, **kwargs)
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
    return func(*args, **kwargs)
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501, in all_reduce
    work.wait()
RuntimeError: Connection closed by peer
"""


def test_a_traceback_keeps_the_users_frames_and_torchs_last() -> None:
    assert users_traceback(TRACEBACK).splitlines() == [
        "Traceback (most recent call last):",
        '  File "/home/me/mine.py", line 12, in run',
        "    dist.all_reduce(t)",
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501, in all_reduce',
        "    work.wait()",
        "RuntimeError: Connection closed by peer"]
    assert users_traceback("no traceback at all") == "no traceback at all"


def test_shared_path_check_passes_when_every_rank_sees_every_marker(tmp_path: Path) -> None:
    path = str(tmp_path / "rendezvous")
    peers = [threading.Thread(target=ensure_shared_path, args=(path, r, 3, 5.0)) for r in (1, 2)]
    for t in peers:
        t.start()
    ensure_shared_path(path, 0, 3, 5.0)
    for t in peers:
        t.join()


def test_shared_path_check_says_clearly_when_the_path_is_not_shared(tmp_path: Path) -> None:
    path = str(tmp_path / "rendezvous")
    with pytest.raises(SharedPathError, match=r"is not shared: rank 0 on .* sees markers of ranks \[0\] only"):
        ensure_shared_path(path, 0, 2, 0.3)


def test_programs_get_only_the_context_their_signature_names() -> None:
    context = {"rank": 1, "size": 4, "device": "cpu", "backend": "gloo"}
    assert call_with_context(lambda rank, size: (rank, size), context) == (1, 4)
    assert call_with_context(lambda backend: backend, context) == "gloo"


TAGGED_RANK = """\
import os, sys
from lab.rank.output import divert_output
from lab.rank.protocol import Channel
print("before", flush=True)
events, relay = divert_output(3)
print("hello from python")
sys.stdout.write("\\x1flab:tok {\\"event\\": \\"done\\", \\"rank\\": 3}\\n"); sys.stdout.flush()
Channel(events, "tok").send("done", rank=3, failures=0)
os.write(2, b"from C, on fd 2\\n")
os.system("echo from a child process")
sys.stdout.write("a last line without its newline")
sys.stdout.flush()
os._exit(0)  # the relay, a process of its own, still passes every line on
"""


def test_a_relayed_rank_has_every_line_tagged_and_no_line_an_event(tmp_path: Path) -> None:
    """Everything the rank and its children write, through fd 1 and 2, gets the rank's tag and its
    marks neutralized; only what goes through the rank's channel is an event; nothing is lost when
    the rank ends itself."""
    done = subprocess.run([sys.executable, "-c", TAGGED_RANK], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr  # (run() waits for the relay: it holds the pipes to the end)
    out = done.stdout.splitlines()
    event = '\x1flab:tok {"event": "done", "rank": 3, "failures": 0}'
    assert out[0] == "before" and event in out, out
    assert [line for line in out if line not in ("before", event)] == [
        f"{RANK_TAG}3 hello from python", f'{RANK_TAG}3 \u241flab:tok {{"event": "done", "rank": 3}}',
        f"{RANK_TAG}3 from a child process", f"{RANK_TAG}3 a last line without its newline"]
    assert done.stderr.splitlines() == [f"{RANK_TAG}3 from C, on fd 2"]
    assert untag(out[1 if out[1] != event else 2].encode()) == (3, b"hello from python", None)
    assert untag(b"an untagged line") == (None, b"an untagged line", None)
    assert untag(rank_tag(12, 5000) + b"zzz") == (12, b"zzz", 5000)  # the start of a line the zygote cut
