"""The inventory's model: the hosts the lab runs on, how each is reached and what it holds.

Data only, and the standard library only: ``lab.inventory.hosts`` reads an inventory file into
it, ``lab.transport`` reaches the hosts it names, and everything above passes it around.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Connection = Literal["ssh", "local", "docker", "slurm"]
CONNECTIONS: tuple[Connection, ...] = get_args(Connection)
DEFAULT_PYTHON = "python3"


@dataclass(frozen=True)
class Host:
    """One machine (or container) the lab starts ranks on."""

    name: str
    address: str  # ansible_host, else the name
    port: int = 22
    user: str | None = None
    key_file: str | None = None  # absolute path
    known_hosts: str | None = None  # absolute path of the lab's known_hosts file for this host
    connection: Connection = "ssh"
    python: str = DEFAULT_PYTHON
    slots: int = 1  # ranks on this host
    gpus: int = 0
    data_address: str | None = None  # the address peers use for the data plane, if not `address`
    network_interface: str | None = None  # the NIC for the data plane (GLOO_SOCKET_IFNAME)
    shared_dir: str | None = None  # a directory every host mounts (NFS...): file:// rendezvous
    container: str | None = None  # the container name, for connection docker
    machine: str | None = None  # the Docker machine the host's container runs on (lab up --machines)
    overlay: str | None = None  # the container lab whose WireGuard overlay carries its data plane
    become: bool = False  # root by `sudo -n` where the lab needs root there (ansible_become)
    grade_users: tuple[str, ...] = ()  # lab grade's share N logs in as the Nth (else as `user`)
    env: tuple[tuple[str, str], ...] = ()  # settings for the host's ranks (the inventory's `env:`), in order
    requirements: str | None = None  # a requirements file on this machine (absolute): what its ranks need beyond torch
    groups: tuple[str, ...] = ()  # every group the host is in, `all` left out, in file order
    source: str = ""  # "inventory.yaml:12": where the host is defined

    @property
    def is_local(self) -> bool:
        return self.connection == "local"

    @property
    def peer_address(self) -> str:
        """The address peers use to reach the host: its data plane's, else its own; a local host's
        is loopback."""
        return "127.0.0.1" if self.is_local else self.data_address or self.address


@dataclass(frozen=True)
class Inventory:
    path: str
    hosts: tuple[Host, ...]  # in file order (first appearance)

    @property
    def world_size(self) -> int:
        return sum(host.slots for host in self.hosts)
