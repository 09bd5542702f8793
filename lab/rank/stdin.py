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

Under ``--launcher torchrun`` and ``spawn`` (and ``srun-torchrun``'s tasks) the host's launcher is an
agent of torch's that starts the ranks with its own stdin, which they cannot share. There the host's
process keeps the controller's line to itself and runs a :class:`Relay`: the ranks inherit a fd 0
that carries nothing and closes when the controller goes away (their watch, as before), and the
frames' bytes go to each rank that connects to the relay's socket (:data:`RELAY_VAR`, in the run's
directory, which only the user can enter): every rank under :data:`EVERY_RANK`, rank 0 under
:data:`RANK_0` (:func:`take_relayed`, as the rank starts, puts that socket on its fd 0, and
/dev/null on the others', as the zygote does).
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading

from lab.rank.reaper import is_run_dir_name

STDIN_VAR = "LAB_STDIN"  # set in the environment of a launch whose zygote passes its stdin on: to whom
RANK_0 = "1"  # (the launch of rank 0) to rank 0
EVERY_RANK = "every"  # to every rank of the host
HOLD_MAX = 64 << 20  # bytes of stdin held for a rank that does not read it
RELAY_NAME = "stdin-relay"  # the relay's socket, in the run's directory on the host
SOCKET_PATH_MAX = 90  # characters of a folder the socket's path may start with (a unix socket's is at most 107)
RELAY_VAR = "LAB_STDIN_RELAY"  # the socket a rank reads the controller's stdin from, where its launcher is torch's
CONNECT_WAIT = 30.0  # seconds for a rank to reach its host's relay
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


class Relay:
    """A host's launcher's stdin relayed to ranks that an agent of torch's starts (see the module):
    started before the agent (it sets :data:`RELAY_VAR` and the fd 0 the ranks inherit), it reads
    the controller's frames until the line closes, then ends this process group as
    ``lab.rank.worker.stop_when_orphaned`` would. ``expected``: how many ranks will connect; the
    bytes every one of them has taken are let go, and a rank that connects later misses nothing
    before that. At most :data:`HOLD_MAX` bytes wait for the slowest; the rest is dropped and said
    (where a rank reads)."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        here = os.getcwd()  # (a host's launcher starts in the run's directory, which the run removes)
        self.folder = here if is_run_dir_name(os.path.basename(here)) and len(here) < SOCKET_PATH_MAX else None
        self.path = os.path.join(self.folder or tempfile.mkdtemp(prefix="lab-stdin-"),  # (0700)
                                 f"{RELAY_NAME}-{os.getpid()}")  # (hosts on one machine may share the run's directory)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(max(expected, 1))
        self.controller = os.dup(0)
        read, self.quiet = os.pipe()  # the ranks' fd 0: nothing comes, and it closes with the controller
        os.dup2(read, 0)
        os.close(read)
        self.lock = threading.Condition()
        self.held = b""  # what the slowest rank has yet to take, from offset ``base`` of all that came
        self.base = 0
        self.taken: dict[int, int] = {}  # each connected rank's offset (by its connection's number)
        self.connected = 0
        self.ended = False  # the user's stdin ended (or the controller is gone)
        self.dropped = 0
        self.said = False
        os.environ[RELAY_VAR] = self.path

    def start(self) -> None:
        atexit.register(self.remove)
        threading.Thread(target=self._read, name="lab-stdin-relay", daemon=True).start()
        threading.Thread(target=self._accept, name="lab-stdin-accept", daemon=True).start()

    def _read(self) -> None:
        frames = Frames()
        try:
            while data := os.read(self.controller, 1 << 16):
                was_open = not frames.ended
                self._add(frames.feed(data))
                if was_open and frames.ended:  # the user's stdin is over: each rank's ends once it has taken the rest
                    self._end()
        except (OSError, ValueError):  # (ValueError: not the frames of lab.rank.stdin)
            pass
        self._end()
        os.close(self.quiet)  # the controller is gone: so is every rank (each watches its fd 0), and we
        self.remove()
        os.killpg(0, signal.SIGKILL)

    def remove(self) -> None:
        """The socket, and the folder made for it (not the run's: the run removes that)."""
        with contextlib.suppress(OSError):
            self.server.close()
        if self.folder is None:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _end(self) -> None:
        with self.lock:
            self.ended = True
            self.lock.notify_all()

    def _add(self, data: bytes) -> None:
        with self.lock:
            room = HOLD_MAX - len(self.held)
            self.held += data[:max(room, 0)]
            self.dropped += max(len(data) - max(room, 0), 0)
            self._say_dropped()
            if data:
                self.lock.notify_all()

    def _say_dropped(self) -> None:
        """(With the lock held.) Once, where a rank reads here: what it will never read. (Where none
        connects, the line's bytes were for a rank of another host, under srun-torchrun's one
        environment for every node.)"""
        if self.dropped and self.connected and not self.said:
            self.said = True
            print(f"lab: a rank has not read {HOLD_MAX >> 20} MiB of its stdin: the rest is dropped",
                  file=sys.stderr, flush=True)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            with self.lock:
                number, self.connected = self.connected, self.connected + 1
                self.taken[number] = self.base
                self._say_dropped()
            threading.Thread(target=self._serve, args=(connection, number), name="lab-stdin-serve",
                             daemon=True).start()

    def _serve(self, connection: socket.socket, number: int) -> None:
        """One rank's stdin: everything from the start, as it comes, and its end."""
        try:
            while True:
                with self.lock:
                    self.lock.wait_for(lambda: self.base + len(self.held) > self.taken[number] or self.ended)
                    data = self.held[self.taken[number] - self.base:]
                if not data:  # (ended, and all taken)
                    return
                connection.sendall(data)
                with self.lock:
                    self.taken[number] += len(data)
                    self._let_go()
        except OSError:  # the rank closed its stdin, or ended: it takes nothing more
            pass
        finally:
            connection.close()
            with self.lock:
                del self.taken[number]
                self._let_go()

    def _let_go(self) -> None:
        """(With the lock held.) What every rank that will come has taken is not held any longer."""
        if self.connected >= self.expected and self.taken:
            done = min(self.taken.values()) - self.base
            self.held, self.base = self.held[done:], self.base + done


def take_relayed() -> int:
    """As a rank starts (``lab.rank.worker.start_rank``), where its host relays the controller's stdin
    (:class:`Relay`): its fd 0 becomes the relay's socket where it is one of the ranks that read it,
    else /dev/null (as under ``--launcher lab``). The descriptor that closes when the controller
    goes away, for the rank's watch (fd 0 where there is no relay)."""
    path, to = os.environ.pop(RELAY_VAR, ""), os.environ.pop(STDIN_VAR, "")
    if not path:
        return 0
    watch = os.dup(0)
    if to == EVERY_RANK or to == RANK_0 and os.environ.get("RANK") == "0":
        relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        relay.settimeout(CONNECT_WAIT)
        relay.connect(path)
        relay.setblocking(True)  # (a timeout makes the socket non-blocking: fd 0 must block, as a pipe's does)
        os.dup2(relay.fileno(), 0)
        relay.close()
    else:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    with contextlib.suppress(OSError, ValueError):
        if sys.stdin is None or sys.stdin.fileno() != 0:  # (mp.spawn's children have /dev/null for sys.stdin)
            sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process's stdin, for as long as it runs)
    return watch
