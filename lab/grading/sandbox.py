"""Throwaway containers for one submission: where ``lab grade`` runs a student's code.

A sandbox is made from the lab's host image (it has the pinned torch) and can reach nothing the
grader trusts: no network but its own loopback (its ranks talk over 127.0.0.1), a read-only root
with a small tmpfs scratch at /tmp (the run's files go there), no new privileges, a clean
environment (the image's own), and the limits of :class:`Limits`: memory and processes for its
ranks, a CPU a rank (at most the machine's), scratch space, and what its PID 1 writes kept to
LOG_MAX by the engine. By default it is one container for the submission's ranks, forked from one
launcher that imported torch once, each rank a user of its own with its own /tmp, /dev/shm, message
queues and System V IPC (``lab.rank.isolation``): no rank can read, signal or trace another, nor
the lab's processes. Those run as root with APART_CAPABILITIES alone, what keeping the ranks apart
takes; the ranks have no capability, and their seccomp filter takes back what SYS_ADMIN opens in
Docker's profile (new namespaces, mounts). (An exercise whose ranks meet in a file, file://, runs
them all as ``nobody`` with every capability dropped: torch's FileStore makes its file for its own
user alone.) ``--sandbox ranks`` gives each rank a container of its own as ``nobody`` with every
capability dropped (files, /tmp, /dev/shm, System V IPC, a process namespace), the others joining
rank 0's network namespace, so that the ranks reach each other only by the loopback, as in one
container; it costs a torch import a rank. An exercise whose ranks meet in a file (file://) then
gets a folder they all mount, in memory. The
grader starts the ranks through the docker transport and removes the containers after: whatever
the submission started, daemons included, goes with them. Sandboxes carry the lab's labels (role
``sandbox``), so one a killed grader left behind is removed by ``lab down``; one whose grader still
runs is not the lab's (``lab down`` and ``lab up`` leave it to its grader).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
OVERHEAD_MB = 256  # of a sandbox's container: the launcher, reapers and relays, the port holder, docker-init
LOG_MAX = "1m"  # of what a container's PID 1 writes, kept by the engine (a rank can write there: /proc/1/fd/1)
START_WORKERS = 8  # containers made at once
SHARED_DIR = "/shared"  # where the ranks of an exercise that meets in a file see their folder (per rank)
FIRST_USER, USER_BLOCKS = 100_000, 1 << 20  # the users a one-container sandbox's ranks run as: a block drawn from these
# What the lab's processes in a one-container sandbox need to keep its ranks apart (lab.rank.isolation): mount
# namespaces of the ranks' own (SYS_ADMIN), become their users (SETUID, SETGID), and signal them (KILL).
APART_CAPABILITIES = ("SYS_ADMIN", "SETUID", "SETGID", "KILL")


@dataclass(frozen=True)
class Limits:
    """What one submission may use; memory and processes are per rank. Each rank's memory limit is
    its own (the worker sets RLIMIT_DATA); a sandbox's container holds its ranks and gets the sum, and
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
        """The memory of a container of ``ranks`` ranks."""
        return self.memory_mb * ranks + OVERHEAD_MB

    @staticmethod
    def cpus_for(ranks: int) -> float:
        """The CPUs a container of ``ranks`` ranks may use: one a rank, at most the machine's."""
        return float(min(ranks, os.cpu_count() or 1))

    def check_room(self, sandboxes: int, ranks: int, machine_mb: int, per_rank: bool = False) -> None:
        """ValueError when ``sandboxes`` sandboxes at once could take more memory than the machine has."""
        need = sandboxes * (ranks * self.memory_mb_for(1) if per_rank else self.memory_mb_for(ranks))
        if need > machine_mb:
            raise ValueError(f"{sandboxes} sandbox(es) of {ranks} rank(s) at {self.memory_mb} MB each (and "
                             f"{OVERHEAD_MB} MB a container for the lab's own) may take {need} MB, more than the "
                             f"{machine_mb} MB of the engine's machine: lower --parallel or --memory")


class Sandbox:
    """One running sandbox for ``ranks`` ranks, in one container or (``per_rank``) a container each; a
    context manager that removes it."""

    def __init__(self, client: docker.DockerClient, ranks: int, limits: Limits, per_rank: bool = False,
                 shared: bool = False) -> None:
        self.client, self.ranks, self.limits, self.per_rank = client, ranks, limits, per_rank
        self.name = f"lab-sandbox-{secrets.token_hex(4)}"  # its container's, or (per rank) NAME-rK rank k's
        # For an exercise whose ranks meet in a file (file://), when they have a container each: a folder they
        # all mount, in memory, of the scratch's size (in one container they share its scratch anyway)
        self.shared = f"{self.name}-shared" if shared and per_rank else None
        # In one container, each rank a user of its own (lab.rank.isolation), from a block of users drawn for this
        # sandbox: the kernel's limits per user (pipe buffers, inotify, message queues) are not another's to use
        # up. Not for an exercise whose ranks meet in a file: torch's FileStore makes its file for its user alone.
        self.first_user = FIRST_USER + secrets.randbelow(USER_BLOCKS) * ranks if not per_rank and not shared else None
        self._made: list[str] = []  # the ids of its containers, the first's first
        self._volume: str | None = None

    @property
    def containers(self) -> list[str]:
        """Its containers' names, rank 0's first."""
        return [f"{self.name}-r{k}" for k in range(self.ranks)] if self.per_rank else [self.name]

    def __enter__(self) -> Sandbox:
        try:  # the first container holds the network namespace (no network but its loopback) the others join
            if self.shared:
                memory = {"type": "tmpfs", "device": "tmpfs", "o": f"size={self.limits.scratch_mb}m,mode=1777"}
                self._volume = self.client.volumes.create(self.shared, driver="local", driver_opts=memory,
                                                          labels=self._labels()).name
            first, *others = self.containers
            held = self._run_container(first, network_mode="none", hostname=ROLE_NAME,
                                       extra_hosts={ROLE_NAME: "127.0.0.1"})
            with ThreadPoolExecutor(min(max(len(others), 1), START_WORKERS)) as pool:
                list(pool.map(lambda name: self._run_container(name, network_mode=f"container:{held}"), others))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _run_container(self, name: str, **network: Any) -> str:
        ranks = 1 if self.per_rank else self.ranks
        memory = f"{self.limits.memory_mb_for(ranks)}m"
        # (the lab's processes as root, with what keeping the ranks apart takes, where it does; else all as nobody)
        user = {"user": "0:0", "cap_add": list(APART_CAPABILITIES)} if self.first_user is not None else \
            {"user": "65534:65534"}
        return self._run(name, **user,
                         tmpfs={"/tmp": f"rw,nosuid,nodev,size={self.limits.scratch_mb}m,mode=1777"},
                         mem_limit=memory, memswap_limit=memory, pids_limit=self.limits.pids * ranks,
                         nano_cpus=int(self.limits.cpus_for(ranks) * 1e9),
                         volumes={self.shared: {"bind": SHARED_DIR, "mode": "rw"}} if self.shared else None, **network)

    @staticmethod
    def _labels() -> dict[str, str]:
        return {LABEL: "1", NAME_LABEL: DEFAULT_LAB, ROLE: ROLE_NAME, OWNER_LABEL: owner()}

    def _run(self, name: str, **settings: Any) -> str:
        try:
            container = self.client.containers.run(
                IMAGE, ["sleep", "infinity"], entrypoint=[], name=name, detach=True, working_dir="/tmp",
                labels=self._labels(),
                read_only=True, log_config=LogConfig(type="json-file", config={"max-size": LOG_MAX, "max-file": "1"}),
                cap_drop=["ALL"], security_opt=["no-new-privileges"], init=True, **settings)
        except ImageNotFound:
            raise EngineError(f"no lab image {IMAGE} on the Docker engine (it was removed while grading)") from None
        except (APIError, DockerException) as exc:
            raise EngineError(f"cannot start a sandbox: {exc}") from None
        self._made.append(container.id)
        return str(container.id)

    def __exit__(self, *_: object) -> None:
        for container in reversed(self._made):  # (rank 0's last: the others are in its network namespace)
            with contextlib.suppress(NotFound, APIError, DockerException):
                self.client.api.remove_container(container, force=True)
        self._made = []
        if self._volume is not None:
            with contextlib.suppress(NotFound, APIError, DockerException):
                self.client.api.remove_volume(self._volume, force=True)
            self._volume = None

    @property
    def inventory(self) -> Inventory:
        """The sandbox as a cluster reached with ``docker exec``: one host, or (per rank) one-rank hosts on
        one loopback."""
        if not self.per_rank:
            return Inventory(f"sandbox {self.name}", (Host(
                name=ROLE_NAME, address="127.0.0.1", connection="docker", container=self.name, python=PYTHON,
                slots=self.ranks, network_interface="lo", source=f"sandbox {self.name}"),))
        shared = SHARED_DIR if self.shared else None
        hosts = tuple(Host(name=f"{ROLE_NAME}-r{k}", address="127.0.0.1", connection="docker", container=container,
                           python=PYTHON, slots=1, network_interface="lo", shared_dir=shared,
                           source=f"sandbox {self.name}") for k, container in enumerate(self.containers))
        return Inventory(f"sandbox {self.name}", hosts)

    def leftovers(self) -> list[str]:
        """Nothing: whatever the submission started goes with the sandbox."""
        return []

    def unclean(self) -> str:
        """Nothing stays: the sandbox goes after each submission, its files and memory with it."""
        return ""

    @property
    def own_users(self) -> bool:
        """No: its processes are bounded by the container's pids limit, not by a limit per user (its ranks
        run as ``nobody``, or in one container as users of their own: rank_users)."""
        return False

    @property
    def rank_users(self) -> int | None:
        """In one container, the user its rank 0 runs as (rank K: that + K); None: its ranks run as nobody."""
        return self.first_user

    @property
    def wire(self) -> WireMode:
        """Every TCP socket of the ranks' network namespace is the submission's (per rank, each rank's
        launcher counts them all, and says which namespace it counted: the checker counts it once)."""
        return "netns"

    def memory_kills(self) -> int:
        """How many processes the kernel killed in the sandbox for want of memory."""
        command = "cat /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null"
        kills = 0
        for container in self.containers:
            try:
                _, output = self.client.containers.get(container).exec_run(["/bin/sh", "-c", command])
            except (NotFound, APIError, DockerException):
                continue
            counts = re.findall(rb"^oom_kill (\d+)$", bytes(output), re.MULTILINE)
            kills += max((int(n) for n in counts), default=0)
        return kills


def ensure_sandbox_image(client: docker.DockerClient, state_dir: Path, say: Say, progress: Progress) -> None:
    """The lab image the sandboxes start from, built as ``lab up`` builds it if there is none (any
    build will do: the sandboxes need its python and torch; each run carries the lab's code)."""
    try:
        client.images.get(IMAGE)
    except ImageNotFound:
        say(f"no {IMAGE} on the engine: building it once for the sandboxes")
        image.ensure_image(client, image.DEFAULT_BASE, state_dir, say, progress)


def maker(client: docker.DockerClient, ranks: int, limits: Limits, per_rank: bool = False,
          shared: bool = False) -> Callable[[], Sandbox]:
    """A fresh sandbox for each submission (lab.grading.places' PlaceMaker): a container, or one a rank
    (``per_rank``); ``shared``: with a folder its ranks all see (an exercise that meets in a file)."""
    return lambda: Sandbox(client, ranks, limits, per_rank, shared)


def owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def remove_orphans(client: docker.DockerClient) -> int:
    """Remove the sandboxes of graders on this machine that are gone (killed before they could): their
    containers, then the folders those mounted. How many containers went."""
    return _remove(client, {"label": [f"{ROLE}={ROLE_NAME}"]}, _left_by_a_dead_grader)


@contextlib.contextmanager
def sandboxes_of(client: docker.DockerClient) -> Iterator[None]:
    """Clean up after an earlier grader that was killed, and after this one, whatever happens."""
    remove_orphans(client)
    try:
        yield
    finally:
        _remove(client, {"label": [f"{OWNER_LABEL}={owner()}"]}, lambda labels: True)


def _left_by_a_dead_grader(labels: dict[str, str]) -> bool:
    host, _, pid = labels.get(OWNER_LABEL, "").rpartition(":")
    return host == socket.gethostname() and pid.isdigit() and not alive(int(pid))


def _remove(client: docker.DockerClient, filters: dict[str, list[str]], which: Callable[[dict[str, str]], bool]) -> int:
    """Remove the containers, then the volumes (which they mount), that ``filters`` finds and ``which``
    takes by their labels; how many containers went."""
    removed = 0
    for c in client.containers.list(all=True, ignore_removed=True, filters=filters):
        if which(c.labels):
            with contextlib.suppress(NotFound, APIError):
                c.remove(force=True)
                removed += 1
    for v in client.volumes.list(filters=filters):
        if which(v.attrs.get("Labels") or {}):
            with contextlib.suppress(NotFound, APIError):
                v.remove(force=True)
    return removed
