"""What a host's TCP connections carried while its ranks ran, measured outside the ranks.

A rank's call recorder (``lab.rank.calls``) lives in the rank's process, where a student's code can
alter it. The host's launcher (the zygote, ``lab.rank.zygote``), a process no rank can reach (not
dumpable: no ptrace, no ``/proc/PID/mem``), asks the kernel instead: the socket diagnostics of
netlink (``sock_diag``, ``man 7 sock_diag``: no privileges needed) give every TCP socket's owner,
its cookie (unique while the system runs) and its ``tcp_info``, whose ``bytes_acked`` counts the
payload its peer acknowledged. The sum over the run's sockets counts every byte the host's ranks
sent once, at its sender, whatever sent it: torch's wrapped calls, its unwrapped C++ bindings, the
rendezvous store, a socket of the student's own.

Which sockets are the run's (:data:`MODES`):

* ``netns``: every TCP socket in the network namespace (a sandbox's, which holds one submission and
  nothing else). The launchers of the ranks that share one (each rank of a sandbox has a container of
  its own, in one namespace) count the same sockets: each says which namespace it counted
  (:func:`space`), and the checker counts each namespace once;
* ``uid``: the sockets this user owns (a host where the submission runs as a user it has to itself:
  ``grade_users``). Never for a user other runs share: their sockets would count.

Sockets are sampled (:meth:`Wire.poll`, every :data:`POLL` seconds at most) and each one's last
count is taken as it closes, from the kernel's message on the destroy groups: those messages carry
no owner, so in ``uid`` mode a connection opened and closed between two samples is not counted
(the measure can fall short, never over). ``netns`` mode counts every one. The last count waits for
the bytes still on their way: a rank that exits right after a send leaves its connection closing,
the kernel still sending what its peer has not acknowledged (a peer busy elsewhere, its window full:
most of a tensor), and the kernel sends the destroy messages from a work queue. So it waits for the
sockets a sample saw that are gone since, and for those closing with bytes to send
(:data:`DRAINING`), until each one's destroy message has come. A socket that was there before the
measure began is none of the ranks' (they start after it) and never counts: the SSH connection that
carries their output to the controller, which the host's sshd holds for the user.

Pure standard library: it runs on every host. The request and the replies are the kernel's structs
(``linux/inet_diag.h``, ``linux/tcp.h``), a few fields of each, packed here rather than taking a
netlink library onto every host for them.
"""
from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import struct
import time
from dataclasses import dataclass, field, replace
from typing import Final, Literal

from lab.rank.tcpinfo import BYTES_ACKED_AT

WIRE_VAR: Final = "LAB_WIRE"  # set to a mode in a launcher's environment: measure its host's connections
Mode = Literal["netns", "uid"]
MODES: Final[tuple[Mode, ...]] = ("netns", "uid")
POLL: Final = 0.1  # seconds between two samples of the host's sockets, at least (each costs ~0.6 ms of CPU)
SETTLE: Final = 5.0  # seconds the last count waits at most for the closing sockets' last counts
# The TCP states of a socket closed by its process whose peer has not acknowledged all it sent (its FIN
# at least): FIN_WAIT1, LAST_ACK, CLOSING (include/net/tcp_states.h)
DRAINING: Final = frozenset({4, 9, 11})

NETLINK_SOCK_DIAG: Final = 4
SOCK_DIAG_BY_FAMILY: Final = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO: Final = 2  # the attribute that carries a socket's tcp_info
TCP_DESTROY_GROUPS: Final = (1, 3)  # SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY
ALL_STATES: Final = 0xFFFFFFFF
NLMSG = struct.Struct("=IHHII")  # struct nlmsghdr
REQUEST = struct.Struct("=BBBBI48x")  # struct inet_diag_req_v2: family, protocol, extensions, pad, states, id
MESSAGE_SIZE: Final = 72  # struct inet_diag_msg
STATE_AT, COOKIE_AT, UID_AT = 1, 44, 64  # its idiag_state, id.idiag_cookie, idiag_uid
RECEIVE_BUFFER: Final = 1 << 20  # bytes asked for the destroy messages' queue (the kernel may give less)


def space() -> str:
    """This process's network namespace, as no other on any machine names its own: the machine's boot id
    and the namespace's inode (``/proc/self/ns/net``)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/net')}"
    except OSError:
        return ""


@dataclass(frozen=True)
class Seen:
    """One TCP socket as the kernel described it."""

    cookie: int
    uid: int | None  # None in a destroy message, which names no owner
    acked: int  # payload bytes its peer acknowledged
    state: int = 0  # its TCP state (include/net/tcp_states.h)


@dataclass
class Wire:
    """The bytes the run's sockets on this host carried since :meth:`start` (see the module)."""

    mode: Mode
    uid: int = field(default_factory=os.getuid)
    before: set[int] = field(default_factory=set)  # the cookies of the sockets there when the measure began
    counted: dict[int, int] = field(default_factory=dict)  # cookie -> most bytes acked seen, of the run's
    lost: int = 0  # times the kernel dropped destroy messages (their queue was full): the measure falls short
    live: set[int] = field(default_factory=set)  # the cookies of the sockets the last sample saw
    draining: set[int] = field(default_factory=set)  # those of them closing with bytes unacknowledged
    closed: set[int] = field(default_factory=set)  # the cookies of the sockets whose destroy message came
    polled_at: float = 0.0
    events: socket.socket | None = None

    @classmethod
    def start(cls, mode: Mode) -> Wire:
        """Note the sockets there already (none of them will count), then subscribe to the closing ones'
        last counts (in that order: one that closes in between is none of the ranks', which start after).
        Raises OSError where the kernel has no socket diagnostics."""
        wire = cls(mode, before={s.cookie for s in sockets()})
        wire.events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                                    NETLINK_SOCK_DIAG)
        with contextlib.suppress(OSError):
            wire.events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        wire.events.bind((0, sum(1 << (group - 1) for group in TCP_DESTROY_GROUPS)))
        wire.polled_at = time.monotonic()
        return wire

    def fileno(self) -> int:
        """The descriptor to wait on: readable when sockets have closed (then :meth:`take_closed`)."""
        assert self.events is not None
        return self.events.fileno()

    def take_closed(self) -> None:
        """Count the last bytes of the sockets that closed since it last looked."""
        assert self.events is not None
        while True:
            try:
                data = self.events.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                self.lost += 1
                continue
            for seen in parse(data):
                self.closed.add(seen.cookie)
                self._take(replace(seen, uid=None))

    def poll(self, force: bool = False) -> None:
        """Sample every socket's count, unless it did less than :data:`POLL` seconds ago (and not ``force``)."""
        now = time.monotonic()
        if now - self.polled_at < POLL and not force:
            return
        self.polled_at = now
        live = sockets()
        self.live = {seen.cookie for seen in live}
        self.draining = {seen.cookie for seen in live if seen.state in DRAINING}
        for seen in live:
            self._take(seen)

    def carried(self) -> int:
        """Bytes the run's sockets carried since the measure began, once the last bytes of those that
        close have been acknowledged: each counted socket a sample saw that is gone now (its destroy
        message owed: the kernel sends those from a work queue, later on a busy machine) or closing
        with bytes still to send (:data:`DRAINING`) is waited for until its destroy message comes
        (SETTLE seconds at most; one a process of the run's still holds open is not waited for)."""
        self.take_closed()
        sampled = self.live & self.counted.keys()
        deadline = time.monotonic() + SETTLE
        while True:
            self.poll(force=True)
            owed = ((sampled - self.live) | (self.draining & self.counted.keys())) - self.closed
            left = deadline - time.monotonic()
            if not owed or left <= 0 or self.events is None:
                break
            select.select([self.events], [], [], min(left, POLL))
            self.take_closed()
        self.take_closed()
        return sum(self.counted.values())

    def close(self) -> None:
        if self.events is not None:
            self.events.close()

    def _take(self, seen: Seen) -> None:
        if seen.cookie in self.before:
            return
        if seen.cookie in self.counted or self.mode == "netns" or seen.uid == self.uid:
            self.counted[seen.cookie] = max(self.counted.get(seen.cookie, 0), seen.acked)


def sockets() -> list[Seen]:
    """Every TCP socket of this network namespace (IPv4 and IPv6), as the kernel describes it now."""
    found: list[Seen] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as diag:
        diag.settimeout(5.0)
        for family in (socket.AF_INET, socket.AF_INET6):
            request = REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, ALL_STATES)
            diag.send(NLMSG.pack(NLMSG.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
                      + request)
            done = False
            while not done:
                data = diag.recv(1 << 16)
                done = _ends_dump(data)
                found += parse(data)
    return found


def _ends_dump(data: bytes) -> bool:
    """Whether a reply ends its dump; raises OSError for the kernel's error."""
    at = 0
    while at + NLMSG.size <= len(data):
        length, kind = NLMSG.unpack_from(data, at)[:2]
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, at + NLMSG.size)[0]
            raise OSError(code, f"socket diagnostics: {os.strerror(code)}")
        at += max(_aligned(length), NLMSG.size)
    return False


def parse(data: bytes) -> list[Seen]:
    """The sockets a netlink reply (or destroy message) describes; the socket with no tcp_info (a
    socket in TIME_WAIT, say) is left out."""
    found = []
    at = 0
    while at + NLMSG.size <= len(data):
        length, kind = NLMSG.unpack_from(data, at)[:2]
        if kind == SOCK_DIAG_BY_FAMILY and length >= NLMSG.size + MESSAGE_SIZE:
            seen = _described(data[at + NLMSG.size:at + length])
            if seen is not None:
                found.append(seen)
        at += max(_aligned(length), NLMSG.size)
    return found


def _described(message: bytes) -> Seen | None:
    state = message[STATE_AT]
    cookie = struct.unpack_from("=Q", message, COOKIE_AT)[0]
    uid = struct.unpack_from("=I", message, UID_AT)[0]
    at = MESSAGE_SIZE
    while at + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, at)
        if length < 4:
            break
        if kind == INET_DIAG_INFO and length - 4 >= BYTES_ACKED_AT + 8:
            acked = struct.unpack_from("=Q", message, at + 4 + BYTES_ACKED_AT)[0]
            return Seen(cookie, uid, acked, state)
        at += _aligned(length)
    return None


def _aligned(length: int) -> int:
    return (length + 3) & ~3
