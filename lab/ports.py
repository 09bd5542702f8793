"""Free ports for rendezvous on this machine, reserved so that two runs at once differ.

The kernel hands out a free port (bind to port 0); the lab then holds a lock named
after it, an abstract Unix socket, for as long as the run lasts. Another lab run that
is given the same port sees the lock and takes another. Abstract sockets vanish with
the process that holds them, so a killed run leaves nothing behind.
"""
from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Iterator

from .errors import RunError


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _lock(port: int) -> socket.socket | None:
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0lab-port-{port}")
    except OSError:
        lock.close()
        return None
    return lock


@contextmanager
def reserved_ports(count: int, attempts: int = 100) -> Iterator[tuple[int, ...]]:
    """Yield ``count`` distinct free ports, each held against other lab runs until exit."""
    locks: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(attempts):
            if len(ports) == count:
                break
            port = _free_port()
            lock = _lock(port) if port not in ports else None
            if lock is not None:
                locks.append(lock)
                ports.append(port)
        if len(ports) < count:
            raise RunError(f"could not reserve {count} free ports on this machine")
        yield tuple(ports)
    finally:
        for lock in locks:
            lock.close()
