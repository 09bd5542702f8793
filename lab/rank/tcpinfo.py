"""What the kernel counts on a TCP connection (``tcp_info``, ``linux/tcp.h``): read from a socket of
this process with TCP_INFO, or from the one the socket diagnostics carry (``lab.rank.wire``).

The counters are the network's own evidence, whatever the load on either end: a SYN no one answers
is sent again (``syn_resent``), a segment no one acknowledges is sent again (``resent``), and what a
peer's kernel acknowledges (``acked``) or this one received (``received``) has crossed the network,
whether or not a program read it yet. Standard library only: it runs on every host.
"""
from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from typing import Final

TCP_INFO: Final = getattr(socket, "TCP_INFO", 11)
RETRANSMITS_AT: Final = 2  # tcpi_retransmits (u8): unanswered sends since the last answer (SYNs while connecting)
TOTAL_RETRANS_AT: Final = 100  # tcpi_total_retrans (u32)
BYTES_ACKED_AT: Final = 120  # tcpi_bytes_acked (u64; Linux 4.1 and later)
BYTES_RECEIVED_AT: Final = 128  # tcpi_bytes_received (u64; Linux 4.1 and later)
SIZE: Final = 136  # through tcpi_bytes_received


@dataclass(frozen=True)
class TcpCounters:
    """A few counters of one connection's tcp_info."""

    syn_resent: int
    resent: int
    acked: int
    received: int


def counters(conn: socket.socket) -> TcpCounters | None:
    """The connection's counters; None where the kernel gives none (not TCP, not Linux, too old)."""
    try:
        info = conn.getsockopt(socket.IPPROTO_TCP, TCP_INFO, 256)
    except OSError:
        return None
    if len(info) < SIZE:
        return None
    (resent,) = struct.unpack_from("=I", info, TOTAL_RETRANS_AT)
    acked, received = struct.unpack_from("=QQ", info, BYTES_ACKED_AT)
    return TcpCounters(info[RETRANSMITS_AT], resent, acked, received)


def traffic(leave_out: frozenset[int] = frozenset()) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The bytes this process's TCP connections carried (acknowledged to it, or received), and a mark
    of each: (socket inode, its bytes), sorted; a connection from or to a port of ``leave_out`` is not
    counted. Equal marks at two times mean nothing moved on any of them in between (the counters only
    grow while a connection lives; one opened or closed changes the mark). Read from /proc/self/fd: no
    descriptor of the process is kept or changed."""
    marks = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return 0, ()
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if not link.startswith("socket:["):
            continue
        try:
            with socket.socket(fileno=os.dup(int(name))) as conn:
                if conn.type != socket.SOCK_STREAM or conn.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                if leave_out and ({conn.getsockname()[1], _peer_port(conn)} & leave_out):
                    continue
                seen = counters(conn)
        except (OSError, ValueError):
            continue
        if seen is not None:
            marks.append((int(link[8:-1]), seen.acked + seen.received))
    marks.sort()
    return sum(moved for _, moved in marks), tuple(marks)


def _peer_port(conn: socket.socket) -> int | None:
    try:
        return int(conn.getpeername()[1])
    except OSError:  # (listening, or not connected)
        return None
