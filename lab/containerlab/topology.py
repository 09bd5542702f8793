"""The container lab's shape: names, networks and addresses, and the inventory it writes. Pure.

Containers and networks get deterministic names and the label ``lab.managed``, so ``status``
and ``down`` find them again without a state file. The lab's state on this machine (its SSH
key pair, known_hosts, the wheelhouse) lives in ``.lab/`` beside the inventory ``up`` writes.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import yaml

from lab.errors import UsageError

LABEL = "lab.managed"
ROLE = "lab.role"
TOPOLOGY_LABEL = "lab.topology"
FIRST_HOST = 11  # node1 is .11, node2 .12, ...
GATEWAY_HOST = 2  # the cross-VPC NAT gateway is .2 on every network
USER = "lab"
SHARED_VOLUME = "lab-shared"  # mounted on every host: the lab's "NFS", for file:// rendezvous
SHARED_DIR = "/shared"
PYTHON = "/usr/local/bin/lab-python"
TopologyKind = Literal["plain", "cross-vpc"]
TOPOLOGIES: tuple[TopologyKind, ...] = get_args(TopologyKind)


@dataclass(frozen=True)
class Net:
    """A lab network: a Docker bridge whose .1 is the engine's host."""

    name: str
    subnet: str

    def at(self, host: int) -> str:
        return str(ipaddress.ip_network(self.subnet)[host])

    @property
    def gateway(self) -> str:
        return self.at(1)


LAB_NET = Net("lab-net", "10.213.0.0/24")
VPC_A = Net("lab-vpc-a", "10.10.0.0/24")
VPC_B = Net("lab-vpc-b", "10.20.0.0/24")
INTERNET = Net("lab-internet", "10.99.0.0/24")  # where the hosts' external addresses live
NETWORK, SUBNET = LAB_NET.name, LAB_NET.subnet


@dataclass(frozen=True)
class Topology:
    """How many hosts, the ranks each gets, and how they are wired.

    ``plain``: every host on one network. ``cross-vpc``: the first half of the hosts in
    one private network, the rest in another, no route between them; each host has an
    external address on a third network, reached through a 1:1 NAT gateway (as a cloud
    VM's external IP), and inside a host only its private address is visible.
    """

    hosts: int = 4
    slots: int = 1
    kind: TopologyKind = "plain"

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.slots < 1:
            raise UsageError("--hosts and --slots must be at least 1")
        if self.hosts > self.max_hosts:
            raise UsageError(f"--hosts {self.hosts}: the lab's networks hold at most {self.max_hosts} hosts "
                             f"(node i is .{FIRST_HOST - 1}+i of a /24)")

    @property
    def max_hosts(self) -> int:
        """The most hosts the networks hold: one address each from .FIRST_HOST up, the broadcast left out."""
        return min(ipaddress.ip_network(n.subnet).num_addresses - 1 - FIRST_HOST for n in self.networks())

    def name(self, i: int) -> str:
        return f"node{i}"

    def container(self, i: int) -> str:
        return f"lab-node{i}"

    def network(self, i: int) -> Net:
        if self.kind == "plain":
            return LAB_NET
        return VPC_A if i <= (self.hosts + 1) // 2 else VPC_B

    def address(self, i: int) -> str:
        """The host's own (private) address: the one SSH reaches from the engine's host."""
        return self.network(i).at(FIRST_HOST - 1 + i)

    def external(self, i: int) -> str | None:
        """The address other hosts reach it at through the NAT gateway (cross-vpc only)."""
        return INTERNET.at(FIRST_HOST - 1 + i) if self.kind == "cross-vpc" else None

    def networks(self) -> tuple[Net, ...]:
        return (LAB_NET,) if self.kind == "plain" else (VPC_A, VPC_B, INTERNET)

    def indices(self) -> range:
        return range(1, self.hosts + 1)

    # compose/lab.yml and the tests speak of the plain lab's one network
    @property
    def subnet(self) -> str:
        return self.networks()[0].subnet

    @property
    def gateway(self) -> str:
        return self.networks()[0].gateway


@dataclass(frozen=True)
class LabPaths:
    """Where the lab's files live on this machine."""

    inventory: Path

    @property
    def state(self) -> Path:
        return self.inventory.parent / ".lab"

    @property
    def key(self) -> Path:
        return self.state / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"


def peer_names(topology: Topology, i: int) -> list[str]:
    """/etc/hosts lines (``name:address``) for the addresses a host's peers may show up with.

    cross-vpc: every host's private and external address, also in the IPv4-mapped IPv6
    form in which a dual-stack listener (torch's TCPStore) sees them. The plain lab's DNS
    already answers for its one network.
    """
    if topology.kind == "plain":
        return []
    names = [(topology.name(j), topology.address(j)) for j in topology.indices() if j != i]
    names += [(f"{topology.name(j)}-ext", str(topology.external(j))) for j in topology.indices()]
    names += [(n.name + "-gw", n.at(GATEWAY_HOST)) for n in topology.networks()]
    names += [(n.name + "-engine", n.gateway) for n in topology.networks()]
    return [f"{name}:{form}" for name, address in names for form in (address, f"::ffff:{address}")]


def inventory_text(topology: Topology) -> str:
    """The inventory of the lab, as `up` writes it (and the repository carries the plain one)."""
    hosts: dict[str, dict[str, str]] = {}
    for i in topology.indices():
        hosts[topology.name(i)] = {"ansible_host": topology.address(i)}
        external = topology.external(i)
        if external:  # peers use the external address, as with cloud VMs in other VPCs
            hosts[topology.name(i)]["data_address"] = external
    data = {"all": {
        "vars": {"ansible_user": USER, "ansible_ssh_private_key_file": ".lab/ssh/id_ed25519",
                 "ssh_known_hosts_file": ".lab/known_hosts", "ansible_python_interpreter": PYTHON,
                 "shared_dir": SHARED_DIR, "slots": topology.slots},
        "hosts": hosts,
    }}
    header = (f"# The container lab's hosts ({topology.kind}), written by `python -m lab up` (make lab-up).\n"
              "# The key and known_hosts under .lab/ are made by `lab up`; run it first.\n")
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
