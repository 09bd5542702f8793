"""Rendezvous ports are chosen and held on rank 0's host (lab.rank.ports), never on the controller."""
from __future__ import annotations

import datetime
import errno
import os
import socket
import subprocess
import sys

import pytest

from lab.rank.protocol import parse_event

from .conftest import REPO

TOKEN = "t0k3n"


def start_holder(count: int) -> tuple[subprocess.Popen[bytes], list[int]]:
    holder = subprocess.Popen([sys.executable, "-m", "lab.rank.ports", str(count)], cwd=REPO,
                              env={**os.environ, "LAB_TOKEN": TOKEN}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None
    event = parse_event(holder.stdout.readline().decode().rstrip("\n"), TOKEN)
    assert event is not None and event["event"] == "ports"
    return holder, event["ports"]


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
