"""What a rank was in when it died, told after it by its relay (``lab.rank.output``).

A rank that a C++ exception aborts (gloo's size checks: "Received data size doesn't match") or that
the kernel kills (the OOM killer's SIGKILL) runs no code of its own as it ends: what it was doing
must already be where another process can read it. So each rank keeps the call it is in (the flight
recorder's record of a call the program makes, written as the call begins and cleared as it ends:
:meth:`Page.begin`, about 2 us a call) in a page of memory it shares with its relay, which
outlives it; and the relay opens the kernel's log (``/dev/kmsg``, where the host lets it: root, or
``kernel.dmesg_restrict=0``) as the rank starts, at its end. Once the rank's streams have closed,
the relay (:meth:`Page.tell`) sends a ``died`` event {rank, call, oom} on the rank's channel where
the page holds a call in flight (``call``: a record of ``lab.rank.record``'s schema, its
state "in_flight") or the kernel logged that it killed the rank's process for memory (``oom``: the
kernel's line); a rank that ended with neither sends nothing.

What the page holds is the rank's own word, as its other records are. The collectives torch issues
from C++ (DDP's) are not on it: no program code runs as they begin.

Standard library only: the relay imports it before torch.
"""
from __future__ import annotations

import contextlib
import errno
import math
import mmap
import os
import re
import struct
from typing import Any

from lab.rank import protocol
from lab.rank.record import Record, to_wire

# state (0: no call in flight, 1: in flight), seq, t0, peer, root (-1: none), numel (-1: unknown), ndim
# (-1: no tensor), the first DIMS dimensions, op, dtype, group, where, async (the last byte)
DIMS = 8
_LAYOUT = struct.Struct(f"<Bqdqqqb{DIMS}q24s16s160s160s?")
_ZEROS = (0,) * DIMS
WHERE_MEMO = 4096  # user frames (code, offset) whose ``file.py:LINE`` is kept as bytes
KMSG = "/dev/kmsg"
KMSG_RECORDS = 100_000  # records of the kernel's log read at most, once the rank ended
_OOM = re.compile(rb"Killed process (\d{1,10}) \(")

PAGE: Page | None = None  # this rank's page, once it has one (lab.rank.worker.start_rank)


class Page:
    """A page shared by a rank and its relay: the rank's call in flight; made before the relay forks."""

    def __init__(self, rank: int, token: str) -> None:
        self.rank, self.token = rank, token
        self.memory = mmap.mmap(-1, mmap.PAGESIZE)  # (MAP_SHARED: the relay, a child, sees it)
        self.holds: Any = None  # the record on the page (the rank's side)
        self.kmsg: int | None = None  # the kernel's log, from where it stood as the rank started (the relay's)
        self.pid = os.getpid()

    # -- the rank's side ---------------------------------------------------------------------------

    def begin(self, record: list[Any], seq: int, t0: float, peer: Any, root: Any, shape: Any, op: bytes,
              dtype: bytes, group: bytes, where: bytes) -> None:
        """A call begins: ``record`` (lab.rank.flight's), its fields as numbers and bytes."""
        try:
            dims = _ZEROS if shape is None else tuple(shape)
            _LAYOUT.pack_into(self.memory, 0, 1, seq, t0, peer if type(peer) is int else -1,
                              root if type(root) is int else -1, -1 if shape is None else math.prod(dims),
                              -1 if shape is None else min(len(dims), 127), *(dims + _ZEROS)[:DIMS], op, dtype,
                              group, where, False)
        except (struct.error, TypeError, ValueError):  # (a peer past 64 bits: the page says nothing)
            self.memory[0] = 0
            self.holds = None
            return
        self.holds = record

    def returned_async(self, record: list[Any]) -> None:
        if record is self.holds:
            self.memory[_LAYOUT.size - 1] = 1

    def ended(self, record: list[Any]) -> None:
        if record is self.holds:
            self.memory[0] = 0
            self.holds = None

    # -- the relay's side --------------------------------------------------------------------------

    def open_log(self) -> None:
        """In the relay, as the rank starts: the kernel's log from its end, if this host lets us read it."""
        with contextlib.suppress(OSError):
            fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                os.lseek(fd, 0, os.SEEK_END)
            except OSError:
                os.close(fd)
                return
            self.kmsg = fd

    def tell(self, events: int) -> None:
        """In the relay, once the rank's streams closed: send ``died`` where there is something to say."""
        call, oom = self.call(), self.oom_line()
        if call is None and not oom:
            return
        with contextlib.suppress(OSError):
            protocol.Channel(events, self.token).send("died", rank=self.rank, call=call, oom=oom)

    def call(self) -> dict[str, Any] | None:
        """The call on the page, as a record; None if none is in flight."""
        (state, seq, t0, peer, root, numel, ndim, *rest) = _LAYOUT.unpack_from(self.memory, 0)
        dims, (op, dtype, group, where, is_async) = rest[:DIMS], rest[DIMS:]
        if state != 1:
            return None
        shape = None if ndim < 0 else list(dims[:min(ndim, DIMS)]) if ndim <= DIMS else None
        return to_wire(Record(seq, _text(group), _text(op), "in_flight", t0 if math.isfinite(t0) else 0.0, None,
                              numel if numel >= 0 else None, None if shape is None else tuple(shape),
                              _text(dtype) or None, peer if peer >= 0 else None, root if root >= 0 else None,
                              is_async=is_async, where=_text(where)))

    def oom_line(self) -> str:
        """The kernel's line that it killed the rank's process for memory, logged since the rank began."""
        if self.kmsg is None:
            return ""
        found = ""
        for _ in range(KMSG_RECORDS):
            try:
                record = os.read(self.kmsg, 8192)
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # (records overwritten before they were read: go on)
                    continue
                break
            if not record:
                break
            message = record.split(b";", 1)[-1].split(b"\n", 1)[0]
            killed = _OOM.search(message)
            if killed and int(killed[1]) == self.pid:
                found = message.decode(errors="replace")[:protocol.LINE_MAX]
        return found


def _text(field: bytes) -> str:
    return field.rstrip(b"\0").decode(errors="replace")
