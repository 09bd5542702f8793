"""Pieces of the rank side and the hang locator, without starting a cluster; how a script run as a
rank (``python -m lab.rank.script``) ends, on real gloo ranks: its ``end`` event, its exit status,
its traceback."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from lab.core.stacks import users_lines, users_traceback, where_stopped
from lab.rank.events import End, MalformedEvent, parse_event
from lab.rank.protocol import RANK_TAG, event_line, rank_tag, untag
from lab.rank.script import EXIT_WAIT
from lab.rank.worker import SharedPathError, call_with_context, ensure_shared_path

from .conftest import REPO, Ended, lines_of, run_ranks_as_the_lab_does

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


def test_a_ranks_last_lines_keep_its_programs_stack_and_none_of_the_labs() -> None:
    """The lab's frames go, and the thread that ran nothing but the lab and Python (the recorder's)
    goes whole: what is left is the program's own thread, from torch down to its line."""
    assert users_lines(["it printed this", *DUMP, "and this"]) == [
        "it printed this", "",
        "Current thread 0x00007f0000000002 (most recent call first):",
        '  File "/home/u/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2601 in recv',
        '  File "/srv/run/mine.py", line 3 in run', "and this"]


def test_where_stopped_outside_any_program_names_the_exercise_threads_innermost_frame() -> None:
    # e.g. a rank stuck in init_process_group: the lab's stdin watcher thread is not it.
    assert where_stopped(DUMP, {}) == "distributed_c10d.py:2601 in recv"
    # a project's file is the program by its path in the run, not by its name alone
    assert where_stopped(DUMP, {"work/pkg/distributed_c10d.py": Path("/nowhere")}) == \
        "distributed_c10d.py:2601 in recv"  # (torch's own, found as the exercise thread's innermost frame)
    assert where_stopped([line.replace("/srv/run/mine.py", "/srv/run/work/pkg/mine.py") for line in DUMP],
                         {"work/pkg/mine.py": Path("/nowhere"), "work/mine.py": Path("/nowhere")}) == "mine.py:3 in run"
    assert where_stopped(["no frames here"], {}) is None


def test_where_stopped_names_a_notebooks_cell_and_never_the_labs_own_frame() -> None:
    """A rank stuck in its cell's line (in C++ there, past Ctrl-C): that line, as the notebook shows it.
    A rank in the lab's own code (writing to its pipe) has no place to show: not the lab's frame."""
    cell = ["Current thread 0x00007f0000000002 (most recent call first):",
            '  File "/usr/lib/python3/site-packages/torch/cuda/__init__.py", line 1085 in synchronize',
            '  File "cell [8]", line 4 in <module>',
            '  File "/srv/run/lab/rank/cells.py", line 150 in run_cell']
    assert where_stopped(cell, {}) == "cell [8]:4 in <module>"
    writing = ["Current thread 0x00007f0000000002 (most recent call first):",
               '  File "/srv/run/lab/rank/protocol.py", line 268 in write_all',
               '  File "/srv/run/lab/rank/worker.py", line 170 in run_exercise']
    assert where_stopped(writing, {}) is None


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


# --- how a script's program ends ----------------------------------------------------------------

TOKEN = "endtoken"


def run_script(tmp_path: Path, program: str, n: int = 2) -> list[Ended]:
    """``program`` (prog.py) run on ``n`` local gloo ranks as ``lab launch`` starts each one."""
    (tmp_path / "prog.py").write_text(program)
    ended = run_ranks_as_the_lab_does(tmp_path, n, ["-m", "lab.rank.script", "prog.py"], TOKEN, timeout=120)
    for rank_ended in ended:
        assert rank_ended.events and rank_ended.events[0]["event"] == "hello", rank_ended.stderr[-3000:]
    return ended


def ends(ended: Ended) -> list[dict[str, Any]]:
    return [e for e in ended.events if e["event"] == "end"]


def said_after_end(ended: Ended) -> list[str]:
    """The kinds of event the rank sent after its ``end``."""
    kinds = [e["event"] for e in ended.events]
    return kinds[kinds.index("end") + 1:]


def test_an_end_event_is_a_rank_event_with_its_fields_checked() -> None:
    line = event_line(TOKEN, "end", rank=1, how="exited", code=3, error="SystemExit: sys.exit(3)", where="a.py:4",
                      traceback="")
    assert parse_event(line.rstrip("\n"), TOKEN) == End(rank=1, how="exited", code=3, error="SystemExit: sys.exit(3)",
                                                         where="a.py:4", traceback="")
    with pytest.raises(MalformedEvent, match="'code'"):
        parse_event(line.replace('"code": 3', '"code": "3"').rstrip("\n"), TOKEN)


RAISES = """\
import os
import torch
import torch.distributed as dist

def step(t):
    dist.send(t, dst=dist.get_rank())  # @send (to itself: torch raises)

dist.init_process_group("gloo", init_method=os.environ["STORE"])
t = torch.ones(4)
dist.all_reduce(t)
if dist.get_rank() == 1:
    step(t)  # @step
dist.destroy_process_group()
"""


@pytest.mark.local
def test_a_script_that_raises_says_where_and_prints_its_traceback_without_the_labs_frames(tmp_path: Path) -> None:
    at = lines_of(RAISES)
    fine, failed = run_script(tmp_path, RAISES)
    assert (fine.code, ends(fine)) == (0, [])  # a script that ends normally says nothing more
    assert failed.code == 1, failed.stderr
    [end] = ends(failed)
    assert (end["how"], end["code"], end["where"]) == ("raised", 1, f"prog.py:{at['send']}")  # the user's, not torch's
    assert end["error"].startswith("ValueError: Invalid destination rank")
    text = end["traceback"]
    assert text.startswith(f'Traceback (most recent call last):\n  File "prog.py", line {at["step"]}, in <module>\n')
    assert f'File "prog.py", line {at["send"]}, in step' in text and "distributed_c10d.py" in text  # torch's kept
    assert "lab/rank" not in text and "runpy" not in text
    assert text.endswith(f"{end['error']}\n")
    # on stderr as Python prints it (through torch's hook, which tags each line with the rank)
    stderr = "\n".join(re.sub(r"^\[rank1\]: ", "", line) for line in failed.stderr.splitlines())
    assert text.rstrip("\n") in stderr
    assert "lab/rank" not in failed.stderr and "runpy" not in failed.stderr
    assert "flight" in said_after_end(failed)  # the recorder's last dump still comes, at exit


EXITS = """\
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=os.environ["STORE"])
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
if rank == 1:
    sys.exit(3)  # @exit
exit()  # @quit
"""


@pytest.mark.local
def test_a_script_that_calls_sys_exit_says_so_and_exits_as_python_does(tmp_path: Path) -> None:
    at = lines_of(EXITS)
    quits, exits = run_script(tmp_path, EXITS)
    assert (exits.code, quits.code) == (3, 0)
    assert ends(exits) == [{"event": "end", "rank": 1, "how": "exited", "code": 3, "error": "SystemExit: sys.exit(3)",
                            "where": f"prog.py:{at['exit']}", "traceback": ""}]
    assert ends(quits) == [{"event": "end", "rank": 0, "how": "exited", "code": 0, "error": "SystemExit: sys.exit()",
                            "where": f"prog.py:{at['quit']}", "traceback": ""}]  # (the user's line, not site's)
    assert "Traceback" not in exits.stderr + quits.stderr
    assert "flight" in said_after_end(exits)


HARD_EXIT = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=os.environ["STORE"])
t = torch.ones(4)
for step in range(8):
    if dist.get_rank() == 1 and step == 3:
        os._exit(0)  # @exit
    dist.all_reduce(t)  # @all_reduce
dist.destroy_process_group()
"""


@pytest.mark.local
def test_a_script_that_calls_os_exit_says_so_and_sends_its_last_dump_first(tmp_path: Path) -> None:
    """os._exit runs no atexit: the rank's own os._exit sends ``end`` and the last dump before it exits.
    The rank left waiting in the all_reduce fails there, and says so."""
    at = lines_of(HARD_EXIT)
    left, exited = run_script(tmp_path, HARD_EXIT)
    assert exited.code == 0, exited.stderr
    assert ends(exited) == [{"event": "end", "rank": 1, "how": "exited", "code": 0, "error": "os._exit(0)",
                             "where": f"prog.py:{at['exit']}", "traceback": ""}]
    assert said_after_end(exited)[-1] == "flight"
    dump = exited.events[-1]
    assert dump["counts"] == {"world": {"init_process_group": 1, "all_reduce": 3}} and dump["inflight"] == []
    assert left.code == 1
    [end] = ends(left)
    assert (end["how"], end["code"], end["where"]) == ("raised", 1, f"prog.py:{at['all_reduce']}")
    assert end["error"].startswith("RuntimeError: ") and "lab/rank" not in end["traceback"]


STUCK = """\
import os
from lab.rank import protocol

if os.environ["RANK"] == "0":
    protocol.CHANNEL._mutex.acquire()  # as if one of its threads were stuck writing an event
    os._exit(7)
os.close(protocol.CHANNEL.fd)  # the controller is gone
os._exit(5)
"""


def test_os_exit_exits_with_its_status_whatever_the_channel_does(tmp_path: Path) -> None:
    started = time.monotonic()
    held, closed = run_script(tmp_path, STUCK)
    assert (held.code, closed.code) == (7, 5), held.stderr + closed.stderr
    assert time.monotonic() - started < EXIT_WAIT + 20  # (the held lock costs EXIT_WAIT, no more)
    assert ends(held) == ends(closed) == [] and held.stderr == closed.stderr == ""


RELAY = """\
import os, select, socket, sys, time
from lab.rank.stdin import RELAY_VAR, Relay, frame
line, write = os.pipe()  # (the controller's line to the host's launcher)
os.dup2(line, 0)
os.close(line)
Relay(2).start()
def connected():
    rank = socket.socket(socket.AF_UNIX)
    rank.connect(os.environ[RELAY_VAR])
    return rank
def whole(rank):
    data = b""
    while chunk := rank.recv(4096):
        data += chunk
    return data
first = connected()
os.write(write, frame(b"one\\n") + frame(b"two\\n"))
time.sleep(0.3)
late = connected()
os.write(write, frame(b"three\\n") + frame(b""))
print(whole(first), whole(late), select.select([0], [], [], 0.3)[0], os.environ[RELAY_VAR], flush=True)
os.close(write)  # the controller goes away
time.sleep(10)
"""


@pytest.mark.local
def test_a_hosts_relay_gives_each_rank_the_whole_stdin_and_ends_its_group_with_the_controller(tmp_path: Path) -> None:
    """lab.rank.stdin.Relay, as torchrun's or mp.spawn's host runs it: each rank that connects, late or
    not, reads every byte the controller's frames carried and then its end of file; the fd 0 the ranks
    inherit carries nothing; the controller's line closing ends the process group at once, the socket
    removed."""
    done = subprocess.run([sys.executable, "-c", RELAY], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    first, late, readable, path = done.stdout.split()
    assert (first, late, readable) == ("b'one\\ntwo\\nthree\\n'", "b'one\\ntwo\\nthree\\n'", "[]"), done.stdout
    assert done.returncode == -9 and not os.path.exists(path), done.stderr
