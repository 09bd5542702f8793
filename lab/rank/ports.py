"""``python -m lab.rank.ports [--exclusive] COUNT``: choose COUNT free ports on this host and hold
them for a run.

The lab starts this on rank 0's host before the ranks, because the rendezvous ports are used
there: a port chosen on the controller may be busy on rank 0's host, and two controllers driving
the same hosts would each think theirs free. Each port is a socket bound to port 0 (the kernel
picks a free one) and never listening. While it is bound, the kernel hands the port to no other
``bind(0)`` and to no outgoing connection, so no other run, lab or not, from any controller, is
given it, and a plain ``bind`` of it fails. Two ways to hold, as the plan says:

* shared (the default): the socket sets SO_REUSEADDR, so the program's own TCPStore (and
  torchrun's c10d rendezvous), which also sets it, can bind and listen on the port when the
  rendezvous starts. So can any other user's socket that sets it, until the store listens: what a
  user's own program binds itself needs no more.
* ``--exclusive``: the socket sets SO_REUSEPORT alone, so no socket of another user (nor one of
  this user's without SO_REUSEPORT) can bind the port at all. The lab's own processes take the
  socket itself from the holder instead (:func:`take`: its descriptor, over ``ports.sock`` in the
  holder's folder, the run directory, which only this user may enter; where each rank runs as a
  user of its own, ``lab.rank.isolation``, rank 0's user too): rank 0's store listens on
  it (``TCPStore(master_listen_fd=...)``), and so does the preflight's listener on MASTER_PORT
  before it. So a share graded beside another cannot take its ports (lab.containerlab.shares).

It reports the ports in one ``ports`` event (``lab.rank.protocol``), then holds them (and hands
them over) until its standard input closes (the run ended, or the controller went away) or it is
killed. Standard library only.
"""
from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import sys

from lab.rank.isolation import USERS_VAR, user_of
from lab.rank.protocol import emit

EXCLUSIVE = "--exclusive"
SOCKET_NAME = "ports.sock"  # in the holder's folder: where a process of its user takes a held port
TAKE_TIMEOUT = 10.0  # seconds to take a port from the holder


def hold(count: int, exclusive: bool = False) -> list[socket.socket]:
    """``count`` sockets, each bound to a distinct free port and held (see the module)."""
    return [_bound(exclusive) for _ in range(count)]


def _bound(exclusive: bool) -> socket.socket:
    """A socket bound to a free port of every address: IPv4, or IPv6 on a host without it."""
    try:
        return _bind(socket.AF_INET, exclusive)
    except OSError:
        return _bind(socket.AF_INET6, exclusive)


def _bind(family: socket.AddressFamily, exclusive: bool) -> socket.socket:
    """The kernel picks the port (bind to 0); then a second socket binds it by its number, and that
    one is kept: a port bound by number stays bound when a listener on it is shut down, where one
    the kernel picked is let go (the preflight shuts its listener down, on the socket handed over)."""
    picked = _socket(family, exclusive, 0)
    try:
        return _socket(family, exclusive, picked.getsockname()[1])
    finally:
        picked.close()


def _socket(family: socket.AddressFamily, exclusive: bool, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT if exclusive else socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
    except OSError:
        sock.close()
        raise
    return sock


def take(port: int) -> socket.socket | None:
    """The socket the run's port holder holds ``port`` with, from the holder in this folder (the
    run directory on rank 0's host); None where it hands over none (it holds shared, is not here,
    or does not answer in time)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(TAKE_TIMEOUT)
            conn.connect(SOCKET_NAME)
            conn.sendall(b"%d\n" % port)
            answer, fds, _, _ = socket.recv_fds(conn, 16, 1)
    except OSError:
        return None
    if answer != b"ok" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    return socket.socket(fileno=fds[0])


def _hand_over(server: socket.socket, held: dict[int, socket.socket], users: frozenset[int]) -> None:
    """Answer one process that asks for a held port: the socket's descriptor, to ``users`` only."""
    conn, _ = server.accept()
    with conn:
        conn.settimeout(TAKE_TIMEOUT)
        try:
            pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            asked = conn.recv(16).strip()
            sock = held.get(int(asked)) if asked.isdigit() and uid in users else None
            if sock is None:
                conn.sendall(b"no")
            else:
                socket.send_fds(conn, [b"ok"], [sock.fileno()])
        except OSError:
            pass


def main(argv: list[str]) -> int:
    exclusive = argv[:1] == [EXCLUSIVE]
    # who may take them: this user, and where each rank runs as a user of its own, rank 0's (lab.rank.isolation)
    first_user = int(os.environ[USERS_VAR]) if os.environ.get(USERS_VAR) else None
    users = frozenset({os.getuid(), *([user_of(first_user, 0)] if first_user is not None else [])})
    held = {sock.getsockname()[1]: sock for sock in hold(int(argv[-1]), exclusive)}
    server = None
    if exclusive:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCKET_NAME)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(SOCKET_NAME)  # (in the run directory: 0700, this user's)
        if first_user is not None:  # (rank 0 runs as a user of its own, in a run directory it may read)
            os.chmod(SOCKET_NAME, 0o666)
        server.listen(8)
    emit(os.environ["LAB_TOKEN"], "ports", ports=list(held))
    events = selectors.DefaultSelector()
    events.register(0, selectors.EVENT_READ)
    if server is not None:
        events.register(server, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in events.select():
                if key.fileobj is server:
                    _hand_over(server, held, users)
                elif not os.read(0, 4096):  # the controller closed our stdin
                    return 0
    except OSError:
        return 0
    finally:
        if server is not None:
            server.close()
            with contextlib.suppress(OSError):
                os.unlink(SOCKET_NAME)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
