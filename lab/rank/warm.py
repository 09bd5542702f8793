"""The warm start: a host's launches under ``--launcher lab`` forked from a process that has torch
imported already, instead of each importing it again (about 1.5 s of CPU a host, most of what a
small run costs).

``python -m lab.rank.warm serve DIR`` (the container lab's hosts start one for the ``lab`` user as
they start: images/lab-host/entrypoint.sh) listens on ``DIR/socket`` and imports torch once, on
the first launch it takes (a host's start pays nothing for it; that launch waits for the import as
it would have waited to import torch itself); DIR is
``WARM_DIR/<uid>``, the user's own (0700), in a folder only root may write. ``lab.rank.node fork``
(the host's launcher, started under the lab's reaper as always) first offers its launch to it
(:func:`hand_over`); where no server answers, or the launch is not one it can take, the launcher
starts cold, as before, and nothing else changes.

What is kept, as the cold start keeps it:

* **The same user, and nothing more.** The server runs as the user whose launches it takes and
  answers only a peer of that uid (``SO_PEERCRED``); a client talks only to a server of its own uid
  in a folder of its own. A server has no right its user lacks; grading's share users have none.
* **The same process.** The launcher's stdin, stdout and stderr are passed to the server (SCM_RIGHTS),
  with its argument list, environment, folder, umask and limits; the zygote forked for it takes them
  all, drops every module of the lab's that the server loaded (the run's own copy of the lab is
  imported afresh, from the launch's PYTHONPATH) and reseeds ``random``. A launch whose environment
  differs from the server's in what is read as the interpreter and torch load (:data:`LOAD_TIME`:
  OMP_*, TORCH_*, LD_*, PYTHON*, ...; the server starts with what the lab gives every launch,
  :data:`LAUNCH_ENV`), or that asks for limits the server cannot give, or another Python, starts cold.
* **Nothing outlives it.** Each launch gets a process of its own in the server (the *keeper*), a
  child subreaper like the lab's reaper: it forks the zygote into a process group of its own, and
  when the zygote ends, or the launcher goes away (its connection closes: the lab killed its group),
  it kills what is left below it (``lab.rank.reaper``'s sweep) and says how the zygote ended.
* **Signals reach the ranks.** The launcher passes SIGTERM, SIGINT, SIGHUP and SIGUSR1 (the lab asking
  for stacks) on to the zygote's group, and ends as the zygote ended (its status, or its signal).
* **No launch runs twice.** The zygote starts only once the launcher has said ``go`` (it got the
  zygote's pid in time); a launcher that gave up waiting has closed its connection, and starts cold.

Only ``fork`` (``--launcher lab``) is warm; torchrun's agent and mp.spawn's parent start cold. The
server is not dumpable, so no rank can reach its memory; a rank of its user may stop it or take its
socket, which costs the later launches their warm start, nothing else (the server takes its socket
back within a second).
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import random
import resource
import select
import signal
import socket
import stat
import struct
import sys
import tempfile
import time
from typing import Any, NoReturn

from lab.rank.labfiles import LAB_DIR, SERVER_LAB_VAR

WARM_DIR = "/run/lab-warm"  # root's; in it a folder per user that has a server: WARM_DIR/<uid>
WARM_DIR_VAR = "LAB_WARM_DIR"  # another place for WARM_DIR (a launch's own setting: its user's servers only)
SOCKET = "socket"
SERVED = "served"  # how many launches it has taken (a number), for whoever looks
LOG = "log"
# torch and what it loads, imported by the server (the zygote's PRELOAD less the lab's own modules)
PRELOAD = ("torch", "torch.distributed", "torch.multiprocessing", "torch.nn.parallel", "torch.utils.data")
# What is read as torch, its OpenMP and BLAS, the C library and the interpreter load: a launch whose
# values of these differ from the server's (set in one, not the other, too) starts cold.
LOAD_TIME = ("TORCH", "PYTORCH", "OMP_", "GOMP_", "KMP_", "MKL", "OPENBLAS", "CUDA", "NVIDIA", "LD_", "MALLOC",
             "GLIBC_", "PYTHON", "LC_", "LANG")
OWN = ("PYTHONPATH",)  # of those, the one the zygote takes as the launch's (its sys.path)
# What the lab starts every launch with, of those (lab.core.plan): the server starts with it too
LAUNCH_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# passed on to the zygote's group
SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
ANSWER_WAIT = 5.0  # seconds for the server to answer a launch (else it starts cold)
IMPORT_WAIT = 120.0  # seconds for it to import torch, on the first launch it takes
REQUEST_MAX = 1 << 20  # bytes of a request
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def folder() -> str:
    """This user's server's folder."""
    return f"{os.environ.get(WARM_DIR_VAR) or WARM_DIR}/{os.getuid()}"


# -- the launcher's side ------------------------------------------------------------------------------


def hand_over(argv: list[str]) -> int | None:
    """Offer this launch (``lab.rank.node``'s arguments) to the user's warm server: the exit status
    the zygote it forked ended with (as this process's own: a signal that ended it ends this process
    too), or None where there is none or it did not take the launch (start cold)."""
    conn = _connect()
    if conn is None:
        return None
    zygote: list[int] = []
    pending: list[int] = []

    def pass_on(signum: int, _frame: object) -> None:
        if zygote:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(zygote[0], signum)
        else:
            pending.append(signum)

    previous = {signum: signal.signal(signum, pass_on) for signum in SIGNALS}
    with conn:
        answer = _offer(conn, argv)
        if answer is None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for signum in pending:  # (what came while it asked: for the cold start, as if sent now)
                os.kill(os.getpid(), signum)
            return None
        zygote.append(answer)
        for signum in pending:
            pass_on(signum, None)
        status = _ended(conn)
    if status < 0:  # end the same way, so that whoever waits for us sees the signal
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


def _connect() -> socket.socket | None:
    """A connection to the user's own server, or None: no folder of the user's own (0700), no
    server, or one of another user."""
    try:
        facts = os.lstat(folder())
        if not stat.S_ISDIR(facts.st_mode) or facts.st_uid != os.getuid() or facts.st_mode & 0o077:
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    except OSError:
        return None
    try:
        conn.settimeout(ANSWER_WAIT)
        conn.connect(f"{folder()}/{SOCKET}")
        if peer_uid(conn) == os.getuid():
            return conn
    except OSError:
        pass
    conn.close()
    return None


def _offer(conn: socket.socket, argv: list[str]) -> int | None:
    """Send the launch (its streams with it); the zygote's pid once the server took it and we said
    go, else None (it said cold, or did not answer in time: the connection closed, nothing started)."""
    umask = os.umask(0o077)
    os.umask(umask)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask,
               "executable": os.path.realpath(sys.executable), "limits": own_limits()}
    try:
        socket.send_fds(conn, [frame(request)], [0, 1, 2])
        answer = read_frame(conn)
        if isinstance(answer, dict) and answer.get("importing"):  # (the first launch: the server imports torch now)
            server = answer.get("pid")
            answer = _await_import(conn, server if isinstance(server, int) else 0)
        if not isinstance(answer, dict) or not isinstance(answer.get("pid"), int):
            return None
        conn.sendall(frame({"go": True}))
        conn.settimeout(None)  # (from here on the launch is the zygote's, however long it runs)
        return int(answer["pid"])
    except (OSError, ValueError):
        return None


def _await_import(conn: socket.socket, server: int) -> Any:
    """The server's answer once it has imported torch (IMPORT_WAIT at most), saying meanwhile, as a
    cold launcher's start-up helper does (lab.rank.preflight), how much CPU the import has used: the
    controller's start-up deadline counts only time in which nothing moved, however slowly a busy
    machine lets it go."""
    from lab.rank.preflight import PULSE_EVERY, cpu_of
    from lab.rank.protocol import emit
    from lab.rank.worker import TOKEN_VAR

    token, deadline = os.environ.get(TOKEN_VAR, ""), time.monotonic() + IMPORT_WAIT
    began = cpu_of(server)
    while not select.select([conn], [], [], PULSE_EVERY)[0]:
        if time.monotonic() > deadline:
            raise ValueError("the server did not import torch in time")
        if token:
            emit(token, "pulse", cpu=round(max(0.0, cpu_of(server) - began), 2))
    return read_frame(conn)


def _ended(conn: socket.socket) -> int:
    """How the zygote ended, from its keeper: its exit status, or -N where signal N ended it (1, said,
    where the keeper went away without saying)."""
    try:
        answer = read_frame(conn)
    except (OSError, ValueError):
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("status"), int):
        return int(answer["status"])
    os.write(2, b"lab.rank.warm: the warm start's keeper went away without saying how the ranks ended\n")
    return 1


def own_limits() -> dict[str, list[int]]:
    return {name: list(resource.getrlimit(getattr(resource, name))) for name in dir(resource)
            if name.startswith("RLIMIT_")}


# -- the wire -----------------------------------------------------------------------------------------


def frame(data: dict[str, Any]) -> bytes:
    body = json.dumps(data).encode()
    return struct.pack("!I", len(body)) + body


def read_frame(conn: socket.socket) -> Any:
    """One frame's JSON; ValueError where the peer closed or sent no frame."""
    size = struct.unpack("!I", _exactly(conn, 4))[0]
    if size > REQUEST_MAX:
        raise ValueError(f"a frame of {size} bytes")
    return json.loads(_exactly(conn, size))


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ValueError("the peer closed")
        data += chunk
    return data


def peer_uid(conn: socket.socket) -> int:
    return int(struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1])


# -- the server ---------------------------------------------------------------------------------------


def cold_reason(request: Any, server_env: dict[str, str], limits: dict[str, list[int]]) -> str | None:
    """Why a launch must start cold rather than be forked from this server (None: it need not)."""
    if not isinstance(request, dict):
        return "not a launch"
    argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd")
    if not (isinstance(argv, list) and argv[:1] == ["fork"] and all(isinstance(a, str) for a in argv)):
        return "only --launcher lab's zygote starts warm"
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        return "no environment"
    if not isinstance(cwd, str) or not isinstance(request.get("umask"), int):
        return "no folder or umask"
    if request.get("executable") != os.path.realpath(sys.executable):
        return f"another Python: {request.get('executable')!r}"
    for key in sorted(set(env) | set(server_env)):
        if key.startswith(LOAD_TIME) and key not in OWN and env.get(key) != server_env.get(key):
            return f"{key} is not the server's"
    asked = request.get("limits")
    if not isinstance(asked, dict):
        return "no limits"
    for name, (_, hard) in limits.items():
        want = asked.get(name)
        if not (isinstance(want, list) and len(want) == 2 and all(isinstance(v, int) for v in want)):
            return f"no {name}"
        if not _within(want[1], hard) or not _within(want[0], want[1]):
            return f"{name} beyond the server's"
    return None


def _within(value: int, bound: int) -> bool:
    infinite = resource.RLIM_INFINITY
    return bound == infinite or (value != infinite and 0 <= value <= bound)


def serve(directory: str) -> NoReturn:
    """Take the launches of this user that come to ``directory``'s socket, one at a time, each forked
    to a keeper of its own (torch imported on the first: :func:`_preload`), until killed."""
    os.umask(0o077)
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # (what a keeper that was killed leaves comes here, and is killed)
    listener, inode = _listen(directory)
    served = 0
    _write_served(directory, served)
    env, limits = dict(os.environ), own_limits()
    keepers: set[int] = set()
    said: set[str] = set()  # the reasons to start cold it has logged (each once)
    while True:
        if select.select([listener], [], [], 1.0)[0]:
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with conn:
                    cold = _take(conn, listener, env, limits, keepers)
                if cold is None:
                    served += 1
                    _write_served(directory, served)
                elif cold not in said and len(said) < 64:
                    said.add(cold)
                    print(f"lab.rank.warm: a launch starts cold: {cold}", file=sys.stderr, flush=True)
        _reap(keepers)
        listener, inode = _keep_socket(directory, listener, inode)


def _listen(directory: str) -> tuple[socket.socket, int]:
    path = f"{directory}/{SOCKET}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    listener.bind(path)
    listener.listen(64)
    return listener, os.lstat(path).st_ino


def _keep_socket(directory: str, listener: socket.socket, inode: int) -> tuple[socket.socket, int]:
    """Its socket, its own again where another process of the user removed or replaced it."""
    try:
        if os.lstat(f"{directory}/{SOCKET}").st_ino == inode:
            return listener, inode
    except FileNotFoundError:
        pass
    except OSError:
        return listener, inode
    try:
        new = _listen(directory)
    except OSError:
        return listener, inode
    listener.close()
    return new


def _write_served(directory: str, served: int) -> None:
    with contextlib.suppress(OSError):
        with open(f"{directory}/{SERVED}.tmp", "w") as f:
            f.write(f"{served}\n")
        os.replace(f"{directory}/{SERVED}.tmp", f"{directory}/{SERVED}")


def _reap(keepers: set[int]) -> None:
    """Reap the keepers that ended; kill anything else that came to this process (an orphan of a
    keeper that was killed before it could sweep)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            break
        keepers.discard(pid)
    from lab.rank.reaper import below

    for pid in below():
        if pid not in keepers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _take(conn: socket.socket, listener: socket.socket, env: dict[str, str], limits: dict[str, list[int]],
          keepers: set[int]) -> str | None:
    """Read one launch and fork its keeper (None), or say why it starts cold (and return that)."""
    conn.settimeout(ANSWER_WAIT)
    fds: list[int] = []
    try:
        if peer_uid(conn) != os.getuid():
            return "a peer of another user"
        data, fds, _, _ = socket.recv_fds(conn, REQUEST_MAX + 4, 3)
        if len(data) < 4 or len(fds) != 3:
            return "no launch with its three streams"
        size = struct.unpack("!I", data[:4])[0]
        if size > REQUEST_MAX:
            return "a launch larger than a launch may be"
        body = data[4:] + (_exactly(conn, size - len(data) + 4) if size > len(data) - 4 else b"")
        request = json.loads(body)
        reason = cold_reason(request, env, limits) or _preload(conn)
        if reason is not None:
            conn.sendall(frame({"cold": reason}))
            return reason
        sys.stdout.flush()
        sys.stderr.flush()
        keeper = os.fork()
        if keeper == 0:
            listener.close()
            keep(conn, fds, request)
        keepers.add(keeper)
        return None
    except (OSError, ValueError) as exc:
        return f"the launch could not be read: {exc}"
    finally:
        for fd in fds:
            os.close(fd)


def _preload(conn: socket.socket) -> str | None:
    """torch imported, on the first launch that can be forked from it (so that a host's start, and a
    host no launch comes to, pays nothing for it; the first launch waits as it would have waited to
    import it itself); why not, where it cannot be."""
    if "torch" not in sys.modules and not _unloadable:
        conn.sendall(frame({"importing": True, "pid": os.getpid()}))  # (the launcher waits IMPORT_WAIT for it)
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception as exc:  # (the zygote's own import of it says what it is)
                if name == "torch":
                    _unloadable.append(f"torch cannot be imported: {exc}"[:200])
                    break
    return _unloadable[0] if _unloadable else None


_unloadable: list[str] = []  # why torch could not be imported, once it could not


def keep(conn: socket.socket, fds: list[int], request: dict[str, Any]) -> NoReturn:
    """A launch's keeper (see the module): fork the zygote, hold it until the launcher says go, wait
    for it or for the launcher to go away, sweep, say how it ended."""
    code = 1
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)  # (not inherited from the server)
        gate, opened = os.pipe()
        zygote = os.fork()
        if zygote == 0:
            os.close(opened)
            conn.close()
            os.setpgid(0, 0)
            if os.read(gate, 1):  # (one byte: go; end of file: the launch was given up)
                os.close(gate)
                become(fds, request)
            os._exit(0)
        os.close(gate)
        with contextlib.suppress(OSError):  # (both sides set it: whichever runs first)
            os.setpgid(zygote, zygote)
        for fd in fds:
            os.close(fd)
        conn.sendall(frame({"pid": zygote}))
        if read_frame(conn) != {"go": True}:
            raise ValueError("not go")
        os.write(opened, b"g")
        os.close(opened)
        status = _wait(conn, zygote)
        from lab.rank.reaper import linger, sweep

        if status != -signal.SIGKILL:
            linger()
        sweep()
        conn.settimeout(ANSWER_WAIT)
        conn.sendall(frame({"status": status}))
        code = 0
    except (OSError, ValueError):
        from lab.rank.reaper import sweep

        sweep()
    os._exit(code)


def _wait(conn: socket.socket, zygote: int) -> int:
    """The zygote's end (its exit status, or -N for signal N); the launcher going away first (its
    connection closing) kills the zygote's group."""
    ended = os.pidfd_open(zygote)
    while True:
        ready = select.select([ended, conn.fileno()], [], [])[0]
        if conn.fileno() in ready:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(zygote, signal.SIGKILL)
        if ready:
            _, status = os.waitpid(zygote, 0)
            return os.waitstatus_to_exitcode(status)


def become(fds: list[int], request: dict[str, Any]) -> NoReturn:
    """In the zygote: the launcher's process as it would have started (see the module), then the
    zygote itself (``lab.rank.node``, from the launch's copy of the lab); ends as its interpreter would."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        for name, (soft, hard) in request["limits"].items():
            with contextlib.suppress(ValueError, OSError, AttributeError):
                resource.setrlimit(getattr(resource, name), (soft, hard))
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_DFL)
        server_path = os.environ.get("PYTHONPATH", "")
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[SERVER_LAB_VAR] = LAB_DIR
        sys.path[:] = [request["cwd"], *(p for p in os.environ.get("PYTHONPATH", "").split(":") if p),
                       *(p for p in sys.path[1:] if p not in server_path.split(":"))]
        for name in [n for n in sys.modules if n == "lab" or n.startswith("lab.")]:
            del sys.modules[name]
        tempfile.tempdir = None  # (its folder is read from TMPDIR once: the launch's, not the server's)
        importlib.invalidate_caches()
        random.seed()  # (numpy's generator, where torch loaded it: as fresh as a new process's)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        sys.argv = ["-m", *request["argv"]]
        node = importlib.import_module("lab.rank.node")
        code = node.start(request["argv"][0], request["argv"][1:])
    except SystemExit as exc:
        code = exc.code & 0xFF if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def main() -> int:
    if sys.argv[1:2] != ["serve"] or len(sys.argv) != 3:
        print("usage: python -m lab.rank.warm serve DIR", file=sys.stderr)
        return 2
    wanted = {**os.environ, **LAUNCH_ENV}
    if wanted != dict(os.environ):  # (read as the interpreter and torch load: start again with it)
        os.execve(sys.executable, [sys.executable, "-m", "lab.rank.warm", *sys.argv[1:]], wanted)
    directory = sys.argv[2]
    log = os.open(f"{directory}/{LOG}", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.dup2(log, 2)
    os.close(log)
    serve(directory)


if __name__ == "__main__":
    sys.exit(main())
