"""The container lab's shape: names, networks and addresses, and the inventory it writes. Pure.

Containers and networks get deterministic names and the label ``lab.managed``, so ``status``
and ``down`` find them again without a state file. The lab's state on this machine (its SSH
key pair, known_hosts, the wheelhouse) is its name's, in the user's lab state
(``lab.containerlab.state``), wherever the inventory ``up`` writes is.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import yaml

from lab.containerlab import state
from lab.errors import UsageError
from lab.inventory.hosts import LAB_NAME

LABEL = "lab.managed"
NAME_LABEL = "lab.name"  # which lab a container, network or volume belongs to
ROLE = "lab.role"
TOPOLOGY_LABEL = "lab.topology"
SCHEDULER_LABEL = "lab.scheduler"
SLOTS_LABEL = "lab.slots"
SHAPED_LABEL = "lab.shapes"  # a sidecar's (a shaper's, an overlay's): the host container it serves
SHARE_ROLE = "share"  # a share's door to a host (lab.containerlab.sharehosts), and the share's network
SIDECAR_ROLES = ("shaper", "overlay", SHARE_ROLE)  # containers in a host's namespaces (`lab net`, shares), not hosts
SANDBOX_ROLE = "sandbox"  # lab grade's throwaway container for one submission (lab.grading.sandbox)
OWNER_LABEL = "lab.owner"  # a sandbox's: "<hostname>:<pid>" of the grader that made it
SHAPE_LABEL = "lab.shape"  # a shaper's: the shape it set (JSON)
DEFAULT_LAB = "lab"
FIRST_HOST = 11  # node1 is .11, node2 .12, ...
GATEWAY_HOST = 2  # the cross-VPC NAT gateway is .2 on every network
USER = "lab"
# The users of lab grade's shares on a lab host (images/lab-host), one per share, so the
# submissions graded at once on one host cannot read or signal each other.
GRADE_USERS = tuple(f"share{i}" for i in range(1, 9))
SHARED_DIR = "/shared"
PYTHON = "/usr/local/bin/lab-python"
TopologyKind = Literal["plain", "cross-vpc"]
TOPOLOGIES: tuple[TopologyKind, ...] = get_args(TopologyKind)
Scheduler = Literal["none", "slurm"]  # what else runs on the hosts: a Slurm cluster (lab.containerlab.slurm)
SCHEDULERS: tuple[Scheduler, ...] = get_args(Scheduler)
# The subnets a lab takes when they are free on the engine (up picks others when they are not):
# plain, one network; cross-vpc, VPC a, VPC b and the "internet" of the external addresses.
DEFAULT_SUBNETS: dict[TopologyKind, tuple[str, ...]] = {
    "plain": ("10.213.0.0/24",), "cross-vpc": ("10.10.0.0/24", "10.20.0.0/24", "10.99.0.0/24")}


def check_lab_name(name: str) -> str:
    """A lab's name names its containers, networks and volume: lowercase letters, digits, '-'."""
    if not LAB_NAME.match(name):
        raise UsageError(f"--name {name!r}: a lab's name is a lowercase letter, then up to 23 lowercase "
                         "letters, digits or '-'")
    return name


@dataclass(frozen=True)
class HostLimits:
    """What a lab host's container may use (``lab up --memory/--pids``), and the capabilities
    it keeps: those sshd needs to log users in (switch user, chroot its privilege separation,
    bind port 22, signal its sessions, audit), no other; no-new-privileges besides."""

    memory_mb: int = 4096
    pids: int = 2048

    CAPABILITIES = ("CHOWN", "SETUID", "SETGID", "SYS_CHROOT", "KILL", "NET_BIND_SERVICE", "AUDIT_WRITE")

    def __post_init__(self) -> None:
        if self.memory_mb < 256:
            raise UsageError(f"--memory {self.memory_mb}: a lab host needs at least 256 MB")
        if self.pids < 64:
            raise UsageError(f"--pids {self.pids}: a lab host needs at least 64 processes")


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


class HostNames:
    """How a lab's hosts are named (``nodeI``, from 1) and their containers (``LAB-nodeI``), on one
    engine (:class:`Topology`) or across machines (``lab.containerlab.machines_lab.Spread``)."""

    lab: str

    def name(self, i: int) -> str:
        return f"node{i}"

    def container(self, i: int) -> str:
        return f"{self.lab}-node{i}"


@dataclass(frozen=True)
class Topology(HostNames):
    """Which lab, how many hosts, the ranks each gets, and how they are wired.

    ``plain``: every host on one network. ``cross-vpc``: the first half of the hosts in
    one private network, the rest in another, no route between them; each host has an
    external address on a third network, reached through a 1:1 NAT gateway (as a cloud
    VM's external IP), and inside a host only its private address is visible.

    Every name starts with the lab's (``lab-node1``, ``lab-net``...), so labs of other
    names stand side by side on one engine, each on subnets of its own (``subnets``:
    empty means the kind's defaults; ``lab up`` chooses free ones).
    """

    hosts: int = 4
    slots: int = 1
    kind: TopologyKind = "plain"
    lab: str = DEFAULT_LAB
    subnets: tuple[str, ...] = ()
    scheduler: Scheduler = "none"

    def __post_init__(self) -> None:
        check_lab_name(self.lab)
        if self.scheduler == "slurm" and self.kind != "plain":
            raise UsageError("--scheduler slurm needs --topology plain (Slurm across the NAT of the "
                             "cross-VPC lab is not supported yet)")
        if not self.subnets:
            object.__setattr__(self, "subnets", DEFAULT_SUBNETS[self.kind])
        if len(self.subnets) != len(DEFAULT_SUBNETS[self.kind]):
            raise ValueError(f"a {self.kind} lab has {len(DEFAULT_SUBNETS[self.kind])} subnet(s), got {self.subnets}")
        if self.hosts < 1 or self.slots < 1:
            raise UsageError("--hosts and --slots must be at least 1")
        if self.hosts > self.max_hosts:
            raise UsageError(f"--hosts {self.hosts}: the lab's networks hold at most {self.max_hosts} hosts "
                             f"(node i is .{FIRST_HOST - 1}+i of a /24)")

    @property
    def max_hosts(self) -> int:
        """The most hosts the networks hold: one address each from .FIRST_HOST up, the broadcast left out."""
        return min(ipaddress.ip_network(n.subnet).num_addresses - 1 - FIRST_HOST for n in self.networks())

    def shaper(self, i: int) -> str:
        """The helper that shapes host i's links (``lab net shape``)."""
        return f"{self.lab}-shape-node{i}"

    @property
    def gateway_container(self) -> str:
        """The cross-VPC lab's NAT gateway."""
        return f"{self.lab}-gw"

    @property
    def volume(self) -> str:
        """Mounted on every host at SHARED_DIR: the lab's "NFS", for file:// rendezvous."""
        return f"{self.lab}-shared"

    def labels(self, role: str) -> dict[str, str]:
        """What marks a container of this lab (``lab up`` compares them, compose/lab.yml sets them)."""
        return {LABEL: "1", NAME_LABEL: self.lab, ROLE: role, TOPOLOGY_LABEL: self.kind,
                SCHEDULER_LABEL: self.scheduler}

    def network(self, i: int) -> Net:
        if self.kind == "plain":
            return self.networks()[0]
        vpc_a, vpc_b, _ = self.networks()
        return vpc_a if i <= (self.hosts + 1) // 2 else vpc_b

    def address(self, i: int) -> str:
        """The host's own (private) address: the one SSH reaches from the engine's host."""
        return self.network(i).at(FIRST_HOST - 1 + i)

    def external(self, i: int) -> str | None:
        """The address other hosts reach it at through the NAT gateway (cross-vpc only)."""
        return self.networks()[2].at(FIRST_HOST - 1 + i) if self.kind == "cross-vpc" else None

    def networks(self) -> tuple[Net, ...]:
        """plain: the one network; cross-vpc: VPC a, VPC b, and the "internet"."""
        names = ("net",) if self.kind == "plain" else ("vpc-a", "vpc-b", "internet")
        return tuple(Net(f"{self.lab}-{name}", subnet) for name, subnet in zip(names, self.subnets))

    def indices(self) -> range:
        return range(1, self.hosts + 1)

    # compose/lab.yml and the tests speak of the plain lab's one network
    @property
    def subnet(self) -> str:
        return self.networks()[0].subnet

    @property
    def gateway(self) -> str:
        return self.networks()[0].gateway


def default_inventory(lab: str) -> str:
    """The inventory ``lab up`` writes: inventory.yaml for the default lab, NAME.inventory.yaml else."""
    return "inventory.yaml" if lab == DEFAULT_LAB else f"{lab}.inventory.yaml"


@dataclass(frozen=True)
class LabPaths:
    """Where a lab's files live on this machine: its inventory, where ``up`` writes it, and the
    lab's state, which belongs to its name (``lab.containerlab.state``): what labs share (the
    wheelhouse) and the lab's own folder (its key, known_hosts, ...)."""

    inventory: Path
    lab: str = DEFAULT_LAB

    @property
    def state(self) -> Path:
        return state.home()

    @property
    def own(self) -> Path:
        return state.lab_dir(self.lab)

    @property
    def key(self) -> Path:
        return self.own / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.own / "known_hosts"

    @property
    def machines_record(self) -> Path:
        """For a lab across Docker machines: the path of its machines file, as ``lab up`` was given
        it (``down`` and ``status`` find the machines there)."""
        return self.own / "machines"

    @property
    def munge_key(self) -> Path:
        """The lab's munge key (``--scheduler slurm``): made by ``lab up``, never in the image."""
        return self.own / "munge.key"

    @property
    def slurm_conf(self) -> Path:
        return self.own / "slurm.conf"


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
    hosts: dict[str, dict[str, object]] = {}
    for i in topology.indices():
        hosts[topology.name(i)] = {"ansible_host": topology.address(i)}
        external = topology.external(i)
        if external:  # peers use the external address, as with cloud VMs in other VPCs
            hosts[topology.name(i)]["data_address"] = external
    named = "" if topology.lab == DEFAULT_LAB else f" --name {topology.lab}"
    return lab_inventory(topology.lab, topology.slots, hosts, f"The container lab's hosts ({topology.kind}), written "
                         f"by `python -m lab up{named}` (make lab-up).", shared=True)


def lab_inventory(lab: str, slots: int, hosts: dict[str, dict[str, object]], about: str, shared: bool) -> str:
    """An inventory of lab hosts (``hosts``: name -> its variables), with the variables every lab
    host has in common; ``shared``: they all mount the lab's SHARED_DIR. The lab's key and
    known_hosts are named where its state keeps them (under the user's home as ``~/...``)."""
    own = state.shown(state.lab_dir(lab))
    common: dict[str, object] = {
        "ansible_user": USER, "ansible_ssh_private_key_file": f"{own}/ssh/id_ed25519",
        "ssh_known_hosts_file": f"{own}/known_hosts", "ansible_python_interpreter": PYTHON}
    if shared:
        common["shared_dir"] = SHARED_DIR
    common.update({"slots": slots, "grade_users": list(GRADE_USERS)})
    header = f"# {about}\n# The key and known_hosts under {own}/ are made by `lab up`; run it first.\n"
    return header + yaml.safe_dump({"all": {"vars": common, "hosts": hosts}}, sort_keys=False,
                                   default_flow_style=False)
