"""A lab's lifecycle, one interface for both places a lab runs: ``up``, ``down`` and ``status``.

A lab is on this machine's Docker engine (``engine_lab.EngineLab``) or across the Docker
machines of a machines file, joined in a Swarm (``machines_lab.MachinesLab``); ``labs.find_lab``
says which a lab is, so no caller asks. Each ``up`` is idempotent (a second one of the same lab
changes only what differs) and, when it fails or is interrupted, removes what it made and leaves
what was there before as it was. ``status`` is one row type for both, each row with what its
place knows.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, get_args

from lab.containerlab.engine import Say
from lab.containerlab.image import DEFAULT_BASE, Progress
from lab.containerlab.slurm import Health
from lab.containerlab.topology import HostLimits, LabPaths, Scheduler, TopologyKind
from lab.errors import HostUnreachable, UsageError

GpuChoice = Literal["auto", "all", "none"]
NetworkMode = Literal["overlay", "host"]
NETWORK_MODES: tuple[NetworkMode, ...] = get_args(NetworkMode)
ACROSS_MACHINES_HINT = ("a lab across machines is found by its name in this user's lab state, or by its "
                        "--machines file")


@dataclass(frozen=True)
class UpRequest:
    """What ``lab up`` is asked for. What a lab's place cannot do is refused by its ``up``, before
    anything starts."""

    hosts: int | None = None  # None: 4 on one engine; across machines, one per machine or its lab_hosts
    slots: int = 1
    topology: TopologyKind = "plain"
    scheduler: Scheduler = "none"
    peering: bool = False  # cross-vpc: route between the private networks
    network: NetworkMode = "overlay"  # across machines: how the hosts are wired
    base: str = DEFAULT_BASE
    gpus: GpuChoice = "auto"  # auto: when the engine has the nvidia runtime
    limits: HostLimits = HostLimits()  # what each host's container may use
    accept_new_host_keys: bool = False  # across machines: trust a machine's SSH host key seen for the first time

    def __post_init__(self) -> None:
        if self.peering and self.topology != "cross-vpc":
            raise UsageError("--peering is for --topology cross-vpc")

    def refuse_machine_options(self) -> None:
        """UsageError when it asks for what only a lab across machines has."""
        if self.network != "overlay" or self.accept_new_host_keys:
            raise UsageError("--network and --accept-new-host-keys are for a lab across --machines")


@dataclass(frozen=True)
class HostStatus:
    """One host of a lab as ``lab status`` shows it: its container, the container's state and
    whether its sshd answers; on one engine also its hostname, addresses and scheduler, across
    machines its machine, where SSH reaches it and its data address."""

    container: str
    state: str
    ssh: bool
    hostname: str = ""
    addresses: tuple[str, ...] = ()  # "address (network)", each network's
    scheduler: str = "none"
    machine: str = ""
    ssh_at: str = ""  # the machine's address:port
    data_address: str = ""


@dataclass(frozen=True)
class LabStatus:
    """A lab's hosts, the machines that did not answer (across machines), and its Slurm cluster
    where it runs one."""

    hosts: list[HostStatus]
    unanswered: list[HostUnreachable]
    slurm: Health | None = None


@dataclass(frozen=True)
class Lab(ABC):
    """One lab, by name, and the inventory ``up`` writes for it (its state, key and known_hosts
    are its name's: ``paths``, lab.containerlab.state)."""

    name: str
    inventory: Path  # as given: lines name it so

    across_machines: ClassVar[bool] = False  # (which table `lab status` shows, which words `lab up` says)

    @property
    def paths(self) -> LabPaths:
        return LabPaths(self.inventory.resolve(), self.name)

    @abstractmethod
    def up(self, request: UpRequest, say: Say, progress: Progress) -> Path:
        """Start the lab ``request`` asks for and write its inventory; the inventory's path."""

    @abstractmethod
    def down(self, say: Say) -> int:
        """Remove everything of the lab, saying so; how many things went."""

    @abstractmethod
    def status(self) -> LabStatus:
        """The lab's hosts as they are now."""
