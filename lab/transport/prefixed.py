"""Transports whose every command on the host is a local process: a prefix (``docker exec -i
CONTAINER``, ``srun ... --nodelist NODE``) and the command after it, as pyinfra's docker connector
reuses a local process.

Each rank is such a process whose streams are the rank's. The rank's reaper prints its process
group first (lab.rank.reaper), which ``signal`` and ``kill`` address with a second command. The
prefix keeps the rank's stdin open: the worker kills its own group when the controller goes
away, which killing the local process alone may not do. Files go in through ``tar`` on the host.
"""
from __future__ import annotations

import contextlib
import logging
import shlex
import subprocess
from abc import abstractmethod
from collections.abc import Mapping, Sequence

from lab.errors import RunError
from lab.transport.base import (
    RankProcess,
    Transport,
    Upload,
    archive,
    env_payload,
    keep_command,
    kill_command,
    made_run_dir,
    make_run_dir_command,
    remote_command,
    removable,
    started_group,
)

log = logging.getLogger(__name__)

COMMAND_TIMEOUT = 30  # seconds for one short command (a kill, making the run directory, the files)
START_TIMEOUT = 30.0  # seconds for a rank's shell to print its pid


class PrefixedProcess(RankProcess):
    def __init__(self, transport: PrefixedTransport, popen: subprocess.Popen[bytes], pgid: int) -> None:
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        self._transport, self._popen, self.pgid = transport, popen, pgid
        self.stdin, self.stdout, self.stderr = popen.stdin, popen.stdout, popen.stderr

    def poll(self) -> int | None:
        return self._popen.poll()

    def exited(self) -> bool:
        return self._popen.poll() is not None  # (the local process ends when the reaper does)

    def signal(self, signum: int) -> None:
        if not self.exited():
            self._transport.signal_groups([self.pgid], signum)

    def release(self) -> None:
        self.close_stdin()
        self._popen.kill()
        self._popen.wait()


class PrefixedTransport(Transport):
    """A host reached by a local command with a prefix (see the module)."""

    @abstractmethod
    def prefix(self) -> list[str]:
        """The local command that runs the rest of its arguments on the host, stdin passed on;
        RunError or HostUnreachable (one line) when the host cannot be reached that way."""

    def exec(self, command: str) -> str:
        """Run a short shell command on the host; its output (errors logged, not raised)."""
        try:
            done = subprocess.run([*self.prefix(), "/bin/sh", "-c", command], capture_output=True,
                                  timeout=COMMAND_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired, RunError) as exc:
            log.warning("host %s: %s failed: %s", self.host.name, command, exc)
            return ""
        if done.returncode != 0:
            log.debug("host %s: %s: exit %s: %s", self.host.name, command, done.returncode, done.stderr)
        return done.stdout.decode("utf-8", "replace")

    def signal_groups(self, pgids: Sequence[int], signum: int) -> None:
        """One ``kill`` on the host for every group (a single command, however many ranks)."""
        if pgids:
            self.exec(kill_command(pgids, signum))

    def prepare(self, run_name: str, uploads: Mapping[str, Upload]) -> str:
        prefix = self.prefix()  # HostUnreachable, in one line, when it is not there
        run_dir = made_run_dir(self.exec(make_run_dir_command(run_name, [])))
        if run_dir is None:
            raise RunError(f"host {self.host.name}: cannot make the run directory {run_name} in its temp directory")
        self.run_dir = run_dir
        files = archive(uploads, f"host {self.host.name}")
        untar = [*prefix, "tar", "-x", "--no-same-owner", "-C", run_dir]
        try:
            done = subprocess.run(untar, input=files, capture_output=True, timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RunError(f"host {self.host.name}: copying the run's files to {run_dir} took over "
                           f"{COMMAND_TIMEOUT}s") from None
        if done.returncode != 0:
            error = done.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit {done.returncode}"]
            raise RunError(f"host {self.host.name}: cannot copy the run's files to {run_dir}: {error[-1]}")
        return run_dir

    def cleanup(self, keep: bool = False, also: Sequence[str] = ()) -> None:
        directories = removable([self.run_dir, *also])
        if directories and self.run_dir is not None:
            self.exec(keep_command(self.run_dir) if keep else f"rm -rf -- {shlex.join(directories)}")

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> RankProcess:
        prefix = self.prefix()  # fail early, and with one line, when it is not there
        command = remote_command(self.python, argv, cwd)
        popen = subprocess.Popen([*prefix, "/bin/sh", "-c", command],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # (it ended at once: started_group says why)
            popen.stdin.write(env_payload(env))
            popen.stdin.flush()
        return PrefixedProcess(self, popen, started_group(popen, f"host {self.host.name}: cannot start a rank",
                                                          START_TIMEOUT))
