"""The docker transport: ranks are processes in a named container, started with ``docker exec``.

For containers without sshd. Like pyinfra's docker connector it reuses a local process:
each rank is a local ``docker exec -i`` whose streams are the rank's. The rank's reaper
prints its process group first (lab.rank.reaper), which ``signal`` and ``kill`` address with
a second exec. The
``-i`` keeps the rank's stdin open: the worker kills its own group when the controller
goes away, which a killed ``docker exec`` client alone would not do. Files go in through
``tar`` in the container (which sees its tmpfs mounts, unlike the engine's archive API).
"""
from __future__ import annotations

import io
import logging
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.models.containers import Container

from lab.core.inventory import Host
from lab.errors import HostUnreachable, RunError
from lab.transport.base import (
    RankProcess,
    Transport,
    kill_command,
    made_run_dir,
    make_run_dir_command,
    remote_command,
    removable,
    started_group,
)

log = logging.getLogger(__name__)

API_TIMEOUT = 30  # seconds for one engine call
START_TIMEOUT = 30.0  # seconds for a rank's shell to print its pid


class DockerProcess(RankProcess):
    def __init__(self, transport: DockerTransport, popen: subprocess.Popen[bytes], pgid: int) -> None:
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        self._transport, self._popen, self.pgid = transport, popen, pgid
        self.stdin, self.stdout, self.stderr = popen.stdin, popen.stdout, popen.stderr

    def poll(self) -> int | None:
        return self._popen.poll()

    def exited(self) -> bool:
        return self._popen.poll() is not None  # (``docker exec`` ends when the reaper does)

    def signal(self, signum: int) -> None:
        if not self.exited():
            self._transport.signal_groups([self.pgid], signum)

    def release(self) -> None:
        self.close_stdin()
        self._popen.kill()
        self._popen.wait()


class DockerTransport(Transport):
    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self.container_name = host.container or host.name
        self._container: Container | None = None

    def running(self) -> Container:
        """The running container (looked up once); HostUnreachable when it is not there."""
        if self._container is None:
            try:
                found = docker.from_env(version="auto", timeout=API_TIMEOUT).containers.get(self.container_name)
            except NotFound:
                raise HostUnreachable(
                    self.host.name, f"host {self.host.name}: no container {self.container_name}") from None
            except DockerException as exc:
                raise HostUnreachable(
                    self.host.name, f"host {self.host.name}: the Docker engine does not answer: {exc}") from None
            if found.status != "running":
                raise HostUnreachable(
                    self.host.name, f"host {self.host.name}: container {self.container_name} is {found.status}")
            self._container = found
        return self._container

    def exec(self, command: str) -> str:
        """Run a short shell command in the container; its output (errors logged, not raised)."""
        try:
            code, out = self.running().exec_run(["/bin/sh", "-c", command], user=self.host.user or "")
        except (APIError, HostUnreachable) as exc:
            log.warning("host %s: %s failed: %s", self.host.name, command, exc)
            return ""
        if code != 0:
            log.debug("host %s: %s: exit %s: %s", self.host.name, command, code, out)
        return bytes(out).decode("utf-8", "replace")

    def signal_groups(self, pgids: Sequence[int], signum: int) -> None:
        """One ``kill`` in the container for every group (a single exec, however many ranks)."""
        if pgids:
            self.exec(kill_command(pgids, signum))

    def prepare(self, run_name: str, uploads: Mapping[str, Path]) -> str:
        self.running()  # HostUnreachable, in one line, when it is not there
        run_dir = made_run_dir(self.exec(make_run_dir_command(run_name, [])))
        if run_dir is None:
            raise RunError(f"host {self.host.name}: cannot make the run directory {run_name} in its temp directory")
        self.run_dir = run_dir
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            for relative, source in uploads.items():
                tar.add(str(source), arcname=relative)
        # tar in the container, not the engine's archive API: that one cannot see a tmpfs /tmp
        untar = [*self._exec_argv(self._docker_cli()), "tar", "-x", "--no-same-owner", "-C", run_dir]
        try:
            done = subprocess.run(untar, input=archive.getvalue(), capture_output=True, timeout=API_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RunError(f"host {self.host.name}: copying the run's files to {run_dir} took over "
                           f"{API_TIMEOUT}s") from None
        if done.returncode != 0:
            error = done.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit {done.returncode}"]
            raise RunError(f"host {self.host.name}: cannot copy the run's files to {run_dir}: {error[-1]}")
        return run_dir

    def cleanup(self, keep: bool = False, also: Sequence[str] = ()) -> None:
        directories = removable([self.run_dir, *also])
        if not keep and directories and self._container is not None:
            self.exec(f"rm -rf -- {shlex.join(directories)}")

    def _docker_cli(self) -> str:
        docker_cli = shutil.which("docker")
        if docker_cli is None:
            raise RunError(f"host {self.host.name}: the docker command is needed for ansible_connection docker")
        return docker_cli

    def _exec_argv(self, docker_cli: str) -> list[str]:
        """``docker exec -i`` into the container, as the inventory's user if it names one."""
        user = ["--user", self.host.user] if self.host.user else []
        return [docker_cli, "exec", "-i", *user, self.container_name]

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> RankProcess:
        docker_cli = self._docker_cli()
        self.running()  # fail early, and with one line, when it is not there
        command = remote_command(self.python, argv, env, cwd)
        popen = subprocess.Popen([*self._exec_argv(docker_cli), "/bin/sh", "-c", command],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        what = f"host {self.host.name}: cannot start a rank in {self.container_name}"
        return DockerProcess(self, popen, started_group(popen, what, START_TIMEOUT))
