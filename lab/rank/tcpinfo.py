"""What the kernel counts on a TCP connection (``tcp_info``, ``linux/tcp.h``): read from a socket of
this process with TCP_INFO, or from the one the socket diagnostics carry (``lab.rank.wire``).

The counters are the network's own evidence, whatever the load on either end: a SYN no one answers
is sent again (``syn_resent``), a segment no one acknowledges is sent again (``resent``), and what a
peer's kernel acknowledges (``acked``) or this one received (``received``) has crossed the network,
whether or not a program read it yet. Standard library only: it runs on every host.
"""
from __future__ import annotations

import math
import os
import socket
import struct
from dataclasses import dataclass
from typing import Final

TCP_INFO: Final = getattr(socket, "TCP_INFO", 11)
STATE_AT: Final = 0  # tcpi_state (u8)
TCP_LISTEN: Final = 10
LAST_DATA_SENT_AT: Final = 44  # tcpi_last_data_sent (u32, ms ago)
LAST_DATA_RECV_AT: Final = 52  # tcpi_last_data_recv (u32, ms ago)
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
    idle: float  # seconds since data last went out or came in on it (the kernel's clock)


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
    (sent_ago,), (received_ago,) = struct.unpack_from("=I", info, LAST_DATA_SENT_AT), struct.unpack_from(
        "=I", info, LAST_DATA_RECV_AT)
    idle = math.inf if info[STATE_AT] == TCP_LISTEN else min(sent_ago, received_ago) / 1000  # (no data listens)
    return TcpCounters(info[RETRANSMITS_AT], resent, acked, received, idle)


def traffic(leave_out: frozenset[int] = frozenset()) -> tuple[int, tuple[int, ...], float]:
    """This process's TCP connections (a connection from or to a port of ``leave_out`` left out): the
    bytes they carried (acknowledged to it, or received), their sockets' inodes (sorted: one opened or
    closed changes them), and the seconds since data last went out or came in on any of them (the
    kernel's word; inf with none). Read from /proc/self/fd: no descriptor of the process is kept or
    changed."""
    marks = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return 0, (), math.inf
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
            marks.append((int(link[8:-1]), seen.acked + seen.received, seen.idle))
    marks.sort()
    return (sum(moved for _, moved, _ in marks), tuple(inode for inode, _, _ in marks),
            min((idle for _, _, idle in marks), default=math.inf))


def _peer_port(conn: socket.socket) -> int | None:
    try:
        return int(conn.getpeername()[1])
    except OSError:  # (listening, or not connected)
        return None
