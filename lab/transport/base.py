"""What every transport does, and the helpers they share.

A transport does one small thing for the runner: start a process on its host with a given
environment and hand back a :class:`RankProcess` whose output can be read line by line, whose
input can be written and closed, which can be signalled (its whole process group, so nothing it
started survives) and killed; and carry a run's files to the host (``prepare``) and remove them
(``cleanup``). ``for_each_host`` does one thing on many hosts at once.
"""
from __future__ import annotations

import ast
import io
import json
import logging
import posixpath
import select
import shlex
import signal
import subprocess
import tarfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, TypeVar

from lab.errors import RunError
from lab.inventory.model import Host
from lab.rank.protocol import PID_MARK
from lab.rank.reaper import ENV_ON_STDIN, KEPT

log = logging.getLogger(__name__)

Upload = Path | bytes  # a file to carry to a host: a local file, or what it holds
CALL_OUTPUT = 1 << 16  # bytes kept of each stream of a ``Transport.call``
STREAM_WAIT = 5.0  # seconds for the last output of a call that ended


class RankProcess(ABC):
    """A started process on some host, and every process it started."""

    stdin: IO[bytes]  # open while it runs; a worker stops itself when it closes
    stdout: IO[bytes]
    stderr: IO[bytes]
    pgid: int  # its process group on the host: what ``signal`` and ``kill`` address

    def send(self, data: bytes) -> None:
        """Write ``data`` to the process's stdin now (flushed); OSError once it is closed or gone."""
        self.stdin.write(data)
        self.stdin.flush()

    def close_stdin(self) -> None:
        """Close the process's stdin, so it reads end-of-file; never raises, safe to call twice."""
        try:
            self.stdin.close()
        except (OSError, EOFError, ValueError):
            pass

    @abstractmethod
    def poll(self) -> int | None:
        """The exit status, or None while it runs. (SSH: HostUnreachable once its host is lost.)"""

    @abstractmethod
    def exited(self) -> bool:
        """Whether its exit status is in. From then on its group is never signalled: with the
        group's last process gone, its id may be another process's already."""

    @abstractmethod
    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process's whole group; no error if it is gone; nothing once it exited."""

    @abstractmethod
    def release(self) -> None:
        """Close its streams and let go of it, without signalling it; safe to call twice."""

    def kill(self) -> None:
        """Kill the whole group (unless it exited) and release it; safe to call twice."""
        if not self.exited():
            self.signal(signal.SIGKILL)
        self.release()


class Transport(ABC):
    """Reaches one host."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.run_dir: str | None = None  # the run's directory on the host, once ``prepare`` made it

    @abstractmethod
    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> RankProcess:
        """Start ``argv`` in ``cwd`` with ``env`` added to the host's environment."""

    @property
    def python(self) -> str:
        """The host's Python: the one with torch (``ansible_python_interpreter``)."""
        return self.host.python

    def module_argv(self, module: str) -> list[str]:
        """How to run ``python -m module`` with the host's Python."""
        return [self.python, "-m", module]

    @abstractmethod
    def prepare(self, run_name: str, uploads: Mapping[str, Upload]) -> str:
        """Make the directory ``run_name`` in the host's own temp directory (``$TMPDIR``, else
        /tmp; only its owner may enter it), put each upload (path in it -> a local file, or the
        bytes it holds) there, and return its path on the host (also kept as ``run_dir``)."""

    @abstractmethod
    def cleanup(self, keep: bool = False, also: Sequence[str] = ()) -> None:
        """Remove the run directory and the directories ``also``; with ``keep``, mark the run directory
        kept instead (:func:`keep_command`), so no later run sweeps it. Never raises."""

    @abstractmethod
    def signal_groups(self, pgids: Sequence[int], signum: int) -> None:
        """Send ``signum`` to each of the host's process groups ``pgids`` at once (one command on a
        remote host); no error if one is gone or the host cannot be reached (that is logged)."""

    def kill_all(self, processes: Sequence[RankProcess]) -> None:
        """Kill ``processes`` (started by this transport) at once: their groups in one
        ``signal_groups``, except those whose exit status is in, then release each. Never raises."""
        live = [p.pgid for p in processes if not p.exited()]
        try:
            if live:
                self.signal_groups(live, signal.SIGKILL)
        finally:
            for process in processes:
                process.release()

    def call(self, argv: Sequence[str], timeout: float) -> tuple[int | None, str]:
        """Run ``argv`` on the host (a short command, not a rank) and wait for it, up to ``timeout``
        seconds: its exit status (None: it did not end in time and was killed) and the last
        CALL_OUTPUT bytes it printed on stdout and stderr. OSError, LabError as ``start``."""
        process = self.start(argv, {}, "/")
        printed: list[bytes] = []
        readers = [threading.Thread(target=lambda s=stream: printed.append(s.read()[-CALL_OUTPUT:]), daemon=True)
                   for stream in (process.stdout, process.stderr)]
        for reader in readers:
            reader.start()
        process.close_stdin()
        deadline = time.monotonic() + timeout
        status = process.poll()
        while status is None and time.monotonic() < deadline:
            time.sleep(0.05)
            status = process.poll()
        for reader in readers:
            reader.join(max(0.0, deadline - time.monotonic()) if status is None else STREAM_WAIT)
        process.kill()
        return status, b"".join(printed).decode("utf-8", "replace")

    def own_address(self) -> str | None:
        """The host's address as this transport reaches it, when it can tell (see ssh)."""
        return None

    def heard_since(self, since: float) -> bool:
        """Whether the host has answered since ``since`` (time.monotonic()): silence from its ranks is
        theirs, not the network's. A host on this machine always has (see ssh: its keepalives)."""
        return True

    def close(self) -> None:
        """Release the connection."""


def _reaper_code() -> str:
    """lab/rank/reaper.py as one ``-c`` argument: its code without docstrings and comments."""
    tree = ast.parse((PACKAGE_DIR / "rank" / "reaper.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            body[:1] = [] if len(body) > 1 else [ast.Pass()]
    return ast.unparse(tree)


def supervised(python: str, argv: Sequence[str], env_on_stdin: bool = False) -> list[str]:
    """``argv`` under the lab's reaper, run by ``python`` (any Python 3.9+, standard library only):
    started in a process group of its own, whose id is its first line (``PID_MARK``), and nothing
    it starts outlives it (lab.rank.reaper). With ``env_on_stdin``, the reaper reads the settings
    to start it with from stdin first (:func:`env_payload`)."""
    return [python, "-S", "-c", REAPER_CODE, *([ENV_ON_STDIN] if env_on_stdin else []), *argv]


def env_payload(env: Mapping[str, str]) -> bytes:
    """What a process started by :func:`remote_command` reads on stdin first: its settings."""
    data = json.dumps(dict(env)).encode()
    return b"%d\n" % len(data) + data


def kill_command(pgids: Sequence[int], signum: int) -> str:
    """One command for the host's ``/bin/sh`` (whatever the login shell) that sends ``signum`` to
    every process group of ``pgids``."""
    name = signal.Signals(signum).name.removeprefix("SIG")
    kill = shlex.join(["kill", "-s", name, "--", *(f"-{int(pgid)}" for pgid in pgids)])
    return f"/bin/sh -c {shlex.quote(kill)}"


def remote_command(python: str, argv: Sequence[str], cwd: str) -> str:
    """The command line for sshd or ``docker exec``: whatever the login shell, ``sh`` replaces it,
    changes to ``cwd`` and replaces itself with ``argv`` under the reaper (which prints the group to
    signal). The settings go on its stdin (:func:`env_payload`), never on a command line: every
    user of the host can read a process's command line, the token and the plan among it."""
    script = f"cd {shlex.quote(cwd)} && exec {shlex.join(supervised(python, argv, env_on_stdin=True))}"
    return f"exec /bin/sh -c {shlex.quote(script)}"


def read_pid_mark(stdout: IO[bytes], timeout: float) -> int | None:
    """The process group a started process names on its first line (see ``supervised``); None
    when it says something else or nothing within ``timeout`` seconds."""
    ready, _, _ = select.select([stdout], [], [], timeout)
    line = stdout.readline() if ready else b""
    return int(line[len(PID_MARK):]) if line.startswith(PID_MARK) and line[len(PID_MARK):].strip().isdigit() else None


def started_group(popen: subprocess.Popen[bytes], what: str, timeout: float) -> int:
    """The process group a local ``popen`` (a rank, or a ``docker exec`` of one) names on its first
    line; when it names none, it is killed and RunError says ``what`` failed, and why."""
    assert popen.stdout is not None
    pgid = read_pid_mark(popen.stdout, timeout)
    if pgid is None:
        popen.kill()
        _, err = popen.communicate(timeout=timeout)
        reason = (err.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1]
        raise RunError(f"{what}: {reason}")
    return pgid


RUN_DIR_MARK = "lab-run-dir:"  # the line that names the run directory a host made


def make_run_dir_command(run_name: str, subdirs: Sequence[str], then: Sequence[str] = ()) -> str:
    """A command for the host's ``/bin/sh`` (whatever the login shell): make ``run_name`` and its
    ``subdirs`` in the host's temp directory, private to the user, and print its path; then run
    ``then`` there, fed the command's stdin (what it leaves unread is read to its end, so a sender
    of a large stdin is never cut off), its status the command's."""
    dirs = " ".join(shlex.quote(d) for d in sorted(set(subdirs)))
    script = (f'umask 077 && d="${{TMPDIR:-/tmp}}"/{shlex.quote(run_name)} && mkdir -p -- "$d" && cd "$d" && '
              + (f"mkdir -p -- {dirs} && " if dirs else "") + f'printf "{RUN_DIR_MARK}%s\\n" "$(pwd -P)"')
    if then:
        script = (f"{{ {script}; }} || {{ cat >/dev/null; exit 1; }}; "
                  f"{shlex.join(then)} || {{ s=$?; cat >/dev/null; exit $s; }}")
    return f"/bin/sh -c {shlex.quote(script)}"


def keep_command(run_dir: str) -> str:
    """A command for the host's ``/bin/sh`` that marks ``run_dir`` kept (the user was told to look
    there): the runs that sweep what killed runs left behind pass it by (``lab.rank.reaper``)."""
    return f"/bin/sh -c {shlex.quote(f': > {shlex.quote(posixpath.join(run_dir, KEPT))}')}"


def made_run_dir(output: str) -> str | None:
    """The run directory a host printed (after whatever its login scripts print)."""
    return next((line[len(RUN_DIR_MARK):] for line in output.splitlines() if line.startswith(RUN_DIR_MARK)), None)


def upload_bytes(source: Upload, relative: str, who: str) -> bytes:
    """What an upload (the run's ``relative``) holds; RunError naming ``who`` when its file cannot be read."""
    if isinstance(source, bytes):
        return source
    try:
        return source.read_bytes()
    except OSError as exc:
        raise RunError(f"{who}: cannot upload {source} to the run's {relative}: {exc.strerror or exc}") from None


def archive(uploads: Mapping[str, Upload], who: str) -> bytes:
    """The uploads as one tar stream (path in the run directory -> file), each file private to its owner."""
    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        for relative, source in uploads.items():
            data = upload_bytes(source, relative, who)
            info = tarfile.TarInfo(relative)
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return stream.getvalue()


def removable(paths: Sequence[str | None]) -> list[str]:
    """The paths that may be ``rm -rf``-ed: absolute, and not the root."""
    return [p for p in paths if p and posixpath.isabs(p) and posixpath.normpath(p) != "/"]


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # lab/ (this file is lab/transport/base.py)
# What runs on the hosts: the rank side and the exercise programs, never the checkers (lab.suite.checks,
# the registry): a rank cannot import what the checker expects.
UPLOADED = ("rank", "suite/exercises")
REAPER_CODE = _reaper_code()


def code_uploads() -> dict[str, Path]:
    """The lab's code that runs on the hosts, as every run carries it there (``code/lab/...``):
    the rank side and the exercise programs, nothing of the controller's or the checkers'."""
    files = [PACKAGE_DIR / "__init__.py", PACKAGE_DIR / "suite" / "__init__.py",
             *(p for sub in UPLOADED for p in sorted((PACKAGE_DIR / sub).rglob("*.py"))
               if "__pycache__" not in p.parts)]
    return {f"code/lab/{p.relative_to(PACKAGE_DIR).as_posix()}": p for p in files}


def release(transport: Transport, keep: bool = False, also: Sequence[str] = ()) -> None:
    """Clean up what the transport made on its host (see ``Transport.cleanup``) and close it."""
    try:
        transport.cleanup(keep, also)
    finally:
        transport.close()


Item = TypeVar("Item")
Result = TypeVar("Result")
MAX_PARALLEL = 32  # hosts handled at once


def for_each_host(items: Mapping[str, Item], action: Callable[[Item], Result]) -> dict[str, Result | Exception]:
    """Run ``action`` on every item (one per host name) at once; each host's result, or the
    exception it raised, by name. Every host is tried: one failure never stops the others."""
    if not items:
        return {}

    def attempt(item: Item) -> Result | Exception:
        try:
            return action(item)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items))) as pool:
        futures = {name: pool.submit(attempt, item) for name, item in items.items()}
    return {name: future.result() for name, future in futures.items()}
