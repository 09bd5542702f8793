"""A throwaway container for one submission: where ``lab grade`` runs a student's code.

The container is made from the lab's host image (it has the pinned torch) and can reach nothing
the grader trusts: no network but its own loopback (its ranks talk over 127.0.0.1), a read-only
root with a small tmpfs scratch at /tmp (the run's files go there), user ``nobody``, every
capability dropped, no new privileges, a clean environment (the image's own), and the limits of
:class:`Limits`: memory and processes for its ranks together, a CPU a rank (at most the
machine's), scratch space, and what its PID 1 writes kept to LOG_MAX by the engine. The grader starts
the ranks in it through the docker transport (one ``docker exec`` each) and removes it after:
whatever the submission started, daemons included, goes with it. Sandboxes carry the lab's
labels (role ``sandbox``), so one a killed grader left behind is removed by ``lab down``; one whose
grader still runs is not the lab's (``lab down`` and ``lab up`` leave it to its grader).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import LogConfig

from lab.containerlab import image
from lab.containerlab.engine import EngineError, Say
from lab.containerlab.image import HOST_IMAGE, Progress
from lab.containerlab.resources import alive
from lab.containerlab.topology import DEFAULT_LAB, LABEL, NAME_LABEL, OWNER_LABEL, ROLE, SANDBOX_ROLE
from lab.inventory.model import Host, Inventory
from lab.rank.wire import Mode as WireMode

log = logging.getLogger(__name__)

IMAGE = f"{HOST_IMAGE}:latest"
ROLE_NAME = SANDBOX_ROLE
PYTHON = "/usr/bin/python3"  # the image's interpreter, with torch
OVERHEAD_MB = 256  # the reapers, the port holder, docker-init
LOG_MAX = "1m"  # of what the sandbox's PID 1 writes, kept by the engine (a rank can write there: /proc/1/fd/1)


@dataclass(frozen=True)
class Limits:
    """What one submission may use; memory and processes are per rank. Each rank's memory limit is
    its own (the worker sets RLIMIT_DATA); the sandbox holds all the ranks and gets the sum, and
    OVERHEAD_MB for the lab's own processes in it, as a second fence."""

    memory_mb: int = 1024
    pids: int = 64
    scratch_mb: int = 256

    def check(self) -> None:
        for name, value, least in (("memory", self.memory_mb, 128), ("pids", self.pids, 8),
                                   ("scratch", self.scratch_mb, 16)):
            if value < least:
                raise ValueError(f"--{name} must be at least {least}, got {value}")

    def memory_mb_for(self, ranks: int) -> int:
        """The memory of a sandbox of ``ranks`` ranks."""
        return self.memory_mb * ranks + OVERHEAD_MB

    @staticmethod
    def cpus_for(ranks: int) -> float:
        """The CPUs a sandbox of ``ranks`` ranks may use: one a rank, at most the machine's."""
        return float(min(ranks, os.cpu_count() or 1))

    def check_room(self, sandboxes: int, ranks: int, machine_mb: int) -> None:
        """ValueError when ``sandboxes`` sandboxes at once could take more memory than the machine has."""
        need = sandboxes * self.memory_mb_for(ranks)
        if need > machine_mb:
            raise ValueError(f"{sandboxes} sandbox(es) of {ranks} rank(s) at {self.memory_mb} MB each (and "
                             f"{OVERHEAD_MB} MB for the lab's own) may take {need} MB, more than the {machine_mb} MB "
                             f"of the engine's machine: lower --parallel or --memory")


class Sandbox:
    """One running sandbox for ``ranks`` ranks; a context manager that removes it."""

    def __init__(self, client: docker.DockerClient, ranks: int, limits: Limits) -> None:
        self.client, self.ranks, self.limits = client, ranks, limits
        self.name = f"lab-sandbox-{secrets.token_hex(4)}"
        self._container_id: str | None = None

    def __enter__(self) -> Sandbox:
        memory = f"{self.limits.memory_mb_for(self.ranks)}m"
        try:
            container = self.client.containers.run(
                IMAGE, ["sleep", "infinity"], entrypoint=[], name=self.name, hostname=ROLE_NAME, detach=True,
                extra_hosts={ROLE_NAME: "127.0.0.1"},
                labels={LABEL: "1", NAME_LABEL: DEFAULT_LAB, ROLE: ROLE_NAME, OWNER_LABEL: owner()},
                network_mode="none", read_only=True, user="65534:65534", working_dir="/tmp",
                tmpfs={"/tmp": f"rw,nosuid,nodev,size={self.limits.scratch_mb}m,mode=1777"},
                mem_limit=memory, memswap_limit=memory, pids_limit=self.limits.pids * self.ranks,
                nano_cpus=int(self.limits.cpus_for(self.ranks) * 1e9),
                log_config=LogConfig(type="json-file", config={"max-size": LOG_MAX, "max-file": "1"}),
                cap_drop=["ALL"], security_opt=["no-new-privileges"], init=True)
        except ImageNotFound:
            raise EngineError(f"no lab image {IMAGE} on the Docker engine (it was removed while grading)") from None
        except (APIError, DockerException) as exc:
            raise EngineError(f"cannot start a sandbox: {exc}") from None
        self._container_id = container.id
        return self

    def __exit__(self, *_: object) -> None:
        if self._container_id is not None:
            with contextlib.suppress(NotFound, APIError, DockerException):
                self.client.api.remove_container(self._container_id, force=True)
            self._container_id = None

    @property
    def inventory(self) -> Inventory:
        """The sandbox as a one-host cluster, reached with ``docker exec``."""
        host = Host(name=ROLE_NAME, address="127.0.0.1", connection="docker", container=self.name,
                    python=PYTHON, slots=self.ranks, network_interface="lo", source=f"sandbox {self.name}")
        return Inventory(f"sandbox {self.name}", (host,))

    def leftovers(self) -> list[str]:
        """Nothing: whatever the submission started goes with the sandbox."""
        return []

    def unclean(self) -> str:
        """Nothing stays: the sandbox goes after each submission, its files and memory with it."""
        return ""

    @property
    def own_users(self) -> bool:
        """No: every sandbox runs as ``nobody`` (its processes are bounded by the container's pids limit)."""
        return False

    @property
    def wire(self) -> WireMode:
        """Every TCP socket in the sandbox's network namespace is the submission's."""
        return "netns"

    def memory_kills(self) -> int:
        """How many processes the kernel killed in the sandbox for want of memory."""
        command = "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null"
        try:
            _, output = self.client.containers.get(self.name).exec_run(["/bin/sh", "-c", command])
        except (NotFound, APIError, DockerException):
            return 0
        counts = re.findall(rb"^oom_kill (\d+)$", bytes(output), re.MULTILINE)
        return max((int(n) for n in counts), default=0)


def ensure_sandbox_image(client: docker.DockerClient, state_dir: Path, say: Say, progress: Progress) -> None:
    """The lab image the sandboxes start from, built as ``lab up`` builds it if there is none (any
    build will do: the sandboxes need its python and torch; each run carries the lab's code)."""
    try:
        client.images.get(IMAGE)
    except ImageNotFound:
        say(f"no {IMAGE} on the engine: building it once for the sandboxes")
        image.ensure_image(client, image.DEFAULT_BASE, state_dir, say, progress)


def maker(client: docker.DockerClient, ranks: int, limits: Limits) -> Callable[[], Sandbox]:
    """A fresh sandbox for each submission (lab.grading.places' PlaceMaker)."""
    return lambda: Sandbox(client, ranks, limits)


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def remove_orphans(client: docker.DockerClient) -> int:
    """Remove the sandboxes of graders on this machine that are gone (killed before they could)."""
    removed = 0
    here = socket.gethostname()
    for c in client.containers.list(all=True, ignore_removed=True, filters={"label": [f"{ROLE}={ROLE_NAME}"]}):
        host, _, pid = c.labels.get(OWNER_LABEL, "").rpartition(":")
        if host == here and pid.isdigit() and not alive(int(pid)):
            with contextlib.suppress(NotFound, APIError):
                c.remove(force=True)
                removed += 1
    return removed


@contextlib.contextmanager
def sandboxes_of(client: docker.DockerClient) -> Iterator[None]:
    """Clean up after an earlier grader that was killed, and after this one, whatever happens."""
    remove_orphans(client)
    try:
        yield
    finally:
        for c in client.containers.list(all=True, ignore_removed=True, filters={"label": [f"{OWNER_LABEL}={owner()}"]}):
            with contextlib.suppress(NotFound, APIError):
                c.remove(force=True)
