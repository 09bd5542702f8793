"""``python -m lab.rank.ports COUNT``: choose COUNT free ports on this host and hold them for a run.

The lab starts this on rank 0's host before the ranks, because the rendezvous ports are used
there: a port chosen on the controller may be busy on rank 0's host, and two controllers driving
the same hosts would each think theirs free. Each port is a socket bound to port 0 (the kernel
picks a free one) with SO_REUSEADDR and never listening. While it is bound:

* the kernel hands the port to no other ``bind(0)`` and to no outgoing connection, so no other
  run, lab or not, from any controller, is given it, and a plain ``bind`` of it fails;
* torch's TCPStore (and torchrun's c10d rendezvous), which also sets SO_REUSEADDR, can still
  bind and listen on it: the rank-0 store takes it over when the rendezvous starts.

It reports the ports in one ``ports`` event (``lab.rank.protocol``), then holds them until its
standard input closes (the run ended, or the controller went away) or it is killed. Standard
library only.
"""
from __future__ import annotations

import os
import socket
import sys

from lab.rank.protocol import emit


def hold(count: int) -> list[socket.socket]:
    """``count`` sockets, each bound to a distinct free port and held (see the module)."""
    return [_bound() for _ in range(count)]


def _bound() -> socket.socket:
    """A socket bound to a free port of every address: IPv4, or IPv6 on a host without it."""
    try:
        return _bind(socket.AF_INET)
    except OSError:
        return _bind(socket.AF_INET6)


def _bind(family: socket.AddressFamily) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", 0))
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str]) -> int:
    count = int(argv[0])
    held = hold(count)
    emit(os.environ["LAB_TOKEN"], "ports", ports=[sock.getsockname()[1] for sock in held])
    try:
        while os.read(0, 4096):  # until the controller closes our stdin
            pass
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
