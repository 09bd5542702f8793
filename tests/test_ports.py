"""Rendezvous ports are chosen and held on rank 0's host (lab.rank.ports), never on the controller."""
from __future__ import annotations

import datetime
import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lab.rank import ports as held_ports
from lab.rank.events import Ports, parse_event

from .conftest import REPO

TOKEN = "t0k3n"


def start_holder(count: int, *flags: str, cwd: Path = REPO) -> tuple[subprocess.Popen[bytes], list[int]]:
    holder = subprocess.Popen([sys.executable, "-m", "lab.rank.ports", *flags, str(count)], cwd=cwd,
                              env={**os.environ, "LAB_TOKEN": TOKEN, "PYTHONPATH": str(REPO)},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None
    event = parse_event(holder.stdout.readline().decode().rstrip("\n"), TOKEN)
    assert isinstance(event, Ports)
    return holder, event.ports


def bind_error(port: int) -> int | None:
    """errno of a plain bind of ``port`` (as another program would try it), None if it binds."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError as exc:
            return exc.errno
    return None


def test_held_ports_are_distinct_refused_to_others_and_freed_when_the_run_ends() -> None:
    holder, ports = start_holder(3)
    try:
        assert len(set(ports)) == 3 and all(1024 < p < 65536 for p in ports)
        assert [bind_error(p) for p in ports] == [errno.EADDRINUSE] * 3
        other, theirs = start_holder(3)  # a second run, from another controller, on the same host
        other.stdin.close()  # type: ignore[union-attr]
        other.wait(timeout=10)
        assert not set(ports) & set(theirs)
    finally:
        holder.stdin.close()  # type: ignore[union-attr]  # the run ended (or its controller went away)
        assert holder.wait(timeout=10) == 0
    assert [bind_error(p) for p in ports] == [None] * 3


@pytest.mark.local
@pytest.mark.parametrize("libuv", [True, False])
def test_the_rank0_store_takes_over_a_held_port(libuv: bool) -> None:
    """torch's TCPStore (both of its servers) binds and listens on a port the holder holds."""
    import torch.distributed as dist

    holder, (port,) = start_holder(1)
    try:
        store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=10), use_libuv=libuv)
        store.set("key", "value")
        assert store.get("key") == b"value"
        del store
    finally:
        holder.kill()
        holder.wait(timeout=10)


def as_another_user(act: str, port: int, folder: Path) -> str:
    """What ``act`` ("bind": bind ``port`` with SO_REUSEADDR and listen, as a thief would; "take":
    ask the holder in ``folder`` for it) did, run as nobody."""
    code = (f"import os, socket, sys; sys.path.insert(0, {str(REPO)!r}); os.chdir({str(folder)!r})\n"
            "from lab.rank.ports import take\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "try:\n"
            f"    if {act!r} == 'bind':\n"
            "        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"        s.bind(('', {port})); s.listen(); print('bound')\n"
            "    else:\n"
            f"        print('took' if take({port}) else 'refused')\n"
            "except OSError as exc:\n"
            "    print(type(exc).__name__, exc.errno)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30).stdout.strip()


@pytest.mark.local
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as another user")
def test_an_exclusive_holder_keeps_its_ports_from_other_users_and_hands_them_to_its_own() -> None:
    """--exclusive (grading, where another share may be on the host): no other user can bind the
    port, even with SO_REUSEADDR, nor take it from the holder; this user takes the socket itself,
    which stays bound to the port through a listener's shutdown (the preflight's), and the store
    listens on it."""
    import torch.distributed as dist

    folder = Path(tempfile.mkdtemp(prefix="lab-ports-"))
    folder.chmod(0o755)  # (a run directory is 0700: here another user may enter, to show the holder asks who)
    holder, (port,) = start_holder(1, held_ports.EXCLUSIVE, cwd=folder)
    try:
        assert as_another_user("bind", port, folder) == f"OSError {errno.EADDRINUSE}"
        (folder / held_ports.SOCKET_NAME).chmod(0o777)
        assert as_another_user("take", port, folder) == "refused"
        os.chdir(folder)
        try:
            preflight = held_ports.take(port)
            assert preflight is not None and preflight.getsockname()[1] == port
            preflight.listen()
            preflight.shutdown(socket.SHUT_RDWR)  # as the preflight's listener ends
            preflight.close()
            assert as_another_user("bind", port, folder) == f"OSError {errno.EADDRINUSE}"
            sock = held_ports.take(port)
        finally:
            os.chdir(REPO)
        assert sock is not None
        store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=datetime.timedelta(seconds=10), multi_tenant=True,
                              master_listen_fd=sock.detach())
        store.set("key", "value")
        assert store.get("key") == b"value"
        assert as_another_user("bind", port, folder) == f"OSError {errno.EADDRINUSE}"
        del store
    finally:
        holder.stdin.close()  # type: ignore[union-attr]
        assert holder.wait(timeout=10) == 0
        assert not (folder / held_ports.SOCKET_NAME).exists()
        shutil.rmtree(folder)
