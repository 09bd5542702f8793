"""Rank 0's stdin, as torchrun gives it: what ``lab launch`` reads on its own stdin goes to rank 0
(and, for a notebook's ranks, to every rank: :data:`EVERY_RANK`).

A host's launcher's stdin is the controller's line to it (its closing means the controller is gone:
the launcher ends its ranks), so what the user types or pipes goes along it in frames: a length, a
newline and that many bytes, each; a frame of length 0 is the end of the user's stdin. Under
``--launcher lab`` the zygote of rank 0's host (the one whose environment has :data:`STDIN_VAR`
:data:`RANK_0`) gives rank 0 a pipe for its fd 0 and writes the frames' bytes into it as rank 0
reads (a :class:`Feeder`, never blocking the zygote), closing it at the end; every other rank has
/dev/null. With :data:`EVERY_RANK` (set on every host's launch) each rank gets a pipe of its own and
the same bytes. What a rank leaves unread is held up to :data:`HOLD_MAX` bytes, past which the rest
is dropped and said once.
"""
from __future__ import annotations

import errno
import os

STDIN_VAR = "LAB_STDIN"  # set in the environment of a launch whose zygote passes its stdin on: to whom
RANK_0 = "1"  # (the launch of rank 0) to rank 0
EVERY_RANK = "every"  # to every rank of the host
HOLD_MAX = 64 << 20  # bytes of stdin held for a rank that does not read it
LENGTH_MAX = 20  # digits of a frame's length


def frame(data: bytes) -> bytes:
    """``data`` as one frame (b"": the end of stdin)."""
    return b"%d\n" % len(data) + data


class Frames:
    """Frames as they come, in pieces: :meth:`feed` says the bytes they carry, and whether the end came."""

    def __init__(self) -> None:
        self._buffer = b""
        self._left = -1  # bytes of the current frame still to come; -1: its length is next
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out = []
        while self._buffer and not self.ended:
            if self._left < 0:
                length, newline, rest = self._buffer.partition(b"\n")
                if not newline:
                    if len(length) > LENGTH_MAX:
                        raise ValueError("a stdin frame with no length")
                    break
                if not length.isdigit():
                    raise ValueError("a stdin frame with no length")
                self._left, self._buffer = int(length), rest
                self.ended = self._left == 0
                continue
            taken, self._buffer = self._buffer[:self._left], self._buffer[self._left:]
            self._left -= len(taken)
            out.append(taken)
            if self._left == 0:
                self._left = -1
        return b"".join(out)


class Feeder:
    """The zygote's side of a rank's stdin: the write end of its pipe (non-blocking), what is still
    to go into it, and whether the user's stdin has ended (the pipe closes once the rest is in)."""

    def __init__(self, fd: int, rank: int = 0) -> None:
        os.set_blocking(fd, False)
        self.fd: int | None = fd
        self.rank = rank
        self.frames = Frames()
        self.held = b""
        self.dropped = 0  # bytes over HOLD_MAX, not passed on

    def take(self, data: bytes) -> None:
        """Frames from the controller."""
        if self.fd is None:
            return
        carried = self.frames.feed(data)
        room = HOLD_MAX - len(self.held)
        self.held += carried[:max(room, 0)]
        self.dropped += max(len(carried) - max(room, 0), 0)
        self._close_if_done()

    @property
    def waiting(self) -> bool:
        """Whether there is something to write when the pipe has room."""
        return self.fd is not None and bool(self.held)

    def write(self) -> None:
        """As much as the pipe takes now; a rank that closed its stdin or ended takes nothing more."""
        if self.fd is None:
            return
        try:
            self.held = self.held[os.write(self.fd, self.held[:1 << 16]):]
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            self.held, self.frames.ended = b"", True
        self._close_if_done()

    def _close_if_done(self) -> None:
        if self.fd is not None and self.frames.ended and not self.held:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
