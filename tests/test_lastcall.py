"""The call a rank died in and the kernel's OOM line, told by the rank's relay (lab.rank.lastcall):
the page as the recorder writes it and the relay reads it, the kernel's log as the relay reads it,
and a rank the kernel's OOM killer really kills (root: a memory cgroup of its own, its limit low)."""
from __future__ import annotations

import os
import re
import socket
import textwrap
from pathlib import Path

import pytest

from lab.rank import lastcall
from lab.rank.events import Died, parse_event
from lab.rank.groups import Group
from lab.rank.protocol import MARK

from .conftest import Lab


def record(seq: int = 7) -> list[object]:
    return [seq, Group("world"), "all_reduce"]


def test_the_page_holds_the_call_in_flight_until_it_ends() -> None:
    page = lastcall.Page(3, "token")
    call = record()
    page.begin(call, 7, 1732530000.5, None, 0, (2, 3), b"all_reduce", b"float32", b"g0,1#0", b"train.py:42")
    said = page.call()
    assert said is not None
    assert (said["seq"], said["group"], said["op"], said["shape"], said["numel"], said["dtype"]) == \
        (7, "g0,1#0", "all_reduce", [2, 3], 6, "float32")
    assert (said["where"], said["root"], said["peer"], said["state"], said["async"]) == \
        ("train.py:42", 0, None, "in_flight", False)
    page.returned_async(call)
    assert page.call()["async"] is True  # type: ignore[index]
    page.ended(record())  # (another call's end leaves it)
    assert page.call() is not None
    page.ended(call)
    assert page.call() is None


def test_a_call_the_page_cannot_hold_leaves_it_empty() -> None:
    page = lastcall.Page(0, "token")
    page.begin(record(), 1, 0.0, None, None, None, b"barrier", b"", b"world", b"a.py:1")
    assert page.call() is not None
    page.begin(record(), 2, 0.0, 1 << 70, None, (4,), b"send", b"float32", b"world", b"a.py:2")  # (a hostile peer)
    assert page.call() is None
    page.begin(record(), 3, 0.0, None, None, tuple(range(1, 11)), b"all_reduce", b"float32", b"world", b"a.py:3")
    said = page.call()
    assert said is not None and said["shape"] is None and said["numel"] == 3628800  # (more dims than kept)


def test_the_relay_tells_the_call_as_an_event_the_controller_takes() -> None:
    page = lastcall.Page(2, "tok")
    page.begin(record(), 5, 1.0, 1, None, (4,), b"recv", b"float32", b"world", b"ring.py:12")
    read, write = os.pipe()
    page.tell(write)
    os.close(write)
    line = os.read(read, 1 << 16).decode()
    os.close(read)
    event = parse_event(line.rstrip("\n"), "tok")
    assert isinstance(event, Died) and event.rank == 2 and event.call is not None and event.oom == ""
    assert (event.call.op, event.call.peer, event.call.shape) == ("recv", 1, (4,))
    assert line.startswith(MARK)


def test_a_rank_that_ended_well_makes_its_relay_say_nothing() -> None:
    page = lastcall.Page(2, "tok")
    read, write = os.pipe()
    page.tell(write)
    os.close(write)
    assert os.read(read, 1024) == b""
    os.close(read)


def test_the_kernel_s_oom_line_is_the_one_naming_the_rank_s_process() -> None:
    """The kernel's log as /dev/kmsg gives it (a record a read; EPIPE where records were overwritten),
    through a socket pair that keeps records apart."""
    page = lastcall.Page(0, "tok")
    mine, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for line in (f"6,101,500,-;Memory cgroup out of memory: Killed process {page.pid + 1} (python3) total-vm:1kB",
                 "4,102,600,-;eth0: link up",
                 f"3,103,700,-;Out of memory: Killed process {page.pid} (python3) total-vm:426168kB, "
                 "anon-rss:102016kB, file-rss:5584kB, shmem-rss:0kB, UID:0\n SUBSYSTEM=memory"):
        other.send(line.encode())
    other.close()
    mine.setblocking(False)
    page.kmsg = mine.detach()
    assert page.oom_line() == (f"Out of memory: Killed process {page.pid} (python3) total-vm:426168kB, "
                               "anon-rss:102016kB, file-rss:5584kB, shmem-rss:0kB, UID:0")
    os.close(page.kmsg)


def memory_cgroup(name: str) -> Path:
    """A memory cgroup of this process's own, made for a test (v1's memory hierarchy, or v2's)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = next((line.split(":", 2)[2] for line in lines if line.split(":")[1] == "memory"), None)
    if v1 is not None:
        base = Path("/sys/fs/cgroup/memory") / v1.lstrip("/")
        limit = "memory.limit_in_bytes"
    else:
        v2 = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        base = Path("/sys/fs/cgroup") / v2.lstrip("/")
        limit = "memory.max"
    made = base / name
    made.mkdir()
    (made / limit).write_text(str(200 << 20))
    return made


@pytest.mark.local
@pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"), reason="a memory cgroup is root's to make")
def test_a_rank_the_oom_killer_kills_is_said_so_with_the_kernel_s_line(lab: Lab, tmp_path: Path) -> None:
    cgroup = memory_cgroup(f"lab-oom-{os.getpid()}")
    program = tmp_path / "activations.py"
    program.write_text(textwrap.dedent(f"""\
        import os

        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        grad = torch.ones(1024)
        dist.all_reduce(grad)
        if dist.get_rank() == 1:  # (its memory now counts against a cgroup of 200 MB)
            with open({str(cgroup / "cgroup.procs")!r}, "w") as procs:
                procs.write(str(os.getpid()))
            activations = [torch.ones(16 << 20) for _ in range(64)]  # 4 GB
        dist.all_reduce(grad)
        dist.destroy_process_group()
        """))
    try:
        result = lab("launch", "--nproc", "2", "--timeout", "60", "--hang-after", "5", str(program), timeout=180)
    finally:
        cgroup.rmdir()
    headline = next(line for line in result.text.splitlines() if line.startswith("lab: Rank"))
    assert result.code == 1, result.text
    assert "OOM killer" in result.text  # (its fix)
    assert re.search(r'Rank 1 \(local\) failed first: it was killed by SIGKILL \(the kernel: "[^"]*Killed '
                     r'process \d+ \(python[^)]*\) total-vm:\d+kB, anon-rss:\d+kB"\)', headline), result.text
    assert "rank 0 lost its connection to rank 1" in headline, result.text
    assert lab.leftovers() == []
