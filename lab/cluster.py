"""The container lab: hosts as containers with their own addresses and sshd.

Containers and networks get deterministic names and the label ``lab.managed``, so
``status`` and ``down`` find them again without a state file. The lab's state on this
machine (its SSH key pair, known_hosts, the wheelhouse) lives in ``.lab/`` beside the
inventory that ``up`` writes.
"""
from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import docker
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from docker.errors import APIError, NotFound
from docker.models.containers import Container
from docker.models.networks import Network

from .engine import EngineError, Say

log = logging.getLogger(__name__)

LABEL = "lab.managed"
ROLE = "lab.role"
KEY = "lab.key"  # the fingerprint of the public key a host trusts: a new key means a new host
TOPOLOGY_LABEL = "lab.topology"
FIRST_HOST = 11  # node1 is .11, node2 .12, ...
GATEWAY_HOST = 2  # the cross-VPC NAT gateway is .2 on every network
USER = "lab"
SHARED_VOLUME = "lab-shared"  # mounted on every host: the lab's "NFS", for file:// rendezvous
SHARED_DIR = "/shared"
PYTHON = "/usr/local/bin/lab-python"
SSH_WAIT = 60.0
SSH_PROBE_TIMEOUT = 3.0
TOPOLOGIES = ("plain", "cross-vpc")


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
    kind: str = "plain"

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


def ensure_key(path: Path, say: Say) -> Path:
    """An ed25519 key pair for the lab (private key 0600); made once, never put in an image."""
    if path.exists() and path.with_suffix(".pub").exists():
        return path
    say(f"making the lab's SSH key {path}")
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    path.with_suffix(".pub").write_bytes(public + b" lab\n")
    return path


def ensure_networks(client: docker.DockerClient, topology: Topology, say: Say) -> None:
    """The topology's networks, each with its subnet; other lab networks are removed."""
    wanted = {n.name: n for n in topology.networks()}
    for existing in client.networks.list(filters={"label": LABEL}):
        if existing.name not in wanted:
            for c in lab_containers(client):
                c.remove(force=True)
            remove_network(existing, say)
    for net in wanted.values():
        try:
            existing = client.networks.get(net.name)
            subnets = [c.get("Subnet") for c in existing.attrs.get("IPAM", {}).get("Config", [])]
            if net.subnet in subnets:
                continue
            say(f"network {net.name} has subnet {subnets}, not {net.subnet}: recreating it")
            remove_network(existing, say)
        except NotFound:
            pass
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=net.subnet, gateway=net.gateway)])
        say(f"creating network {net.name} ({net.subnet})")
        client.networks.create(net.name, driver="bridge", ipam=ipam, labels={LABEL: "1"})


def remove_network(net: Network, say: Say) -> None:
    """Remove a lab network and anything the lab added for it on the engine's host."""
    from .crossvpc import untrack_bridge

    untrack_bridge(net, remove=True)
    for c in net.attrs.get("Containers") or {}:
        try:
            net.disconnect(c, force=True)
        except (APIError, NotFound):
            pass
    try:
        net.remove()
    except (APIError, NotFound) as exc:
        raise EngineError(f"cannot remove network {net.name}: {exc}") from None
    say(f"removed network {net.name}")


def ensure_shared_volume(client: docker.DockerClient) -> None:
    try:
        client.volumes.get(SHARED_VOLUME)
    except NotFound:
        client.volumes.create(SHARED_VOLUME, labels={LABEL: "1"})


def start_hosts(client: docker.DockerClient, topology: Topology, image: str, paths: LabPaths,
                gpus: bool, say: Say) -> list[Container]:
    """One container per host, recreated when its image or address is not the wanted one."""
    stale = [c for c in lab_containers(client) if c.name not in {topology.container(i) for i in topology.indices()}]
    for c in stale:
        say(f"removing {c.name} (not in a {topology.hosts}-host lab)")
        c.remove(force=True)
    ensure_shared_volume(client)
    containers = []
    for i in topology.indices():
        containers.append(_start_host(client, topology, i, image, paths, gpus, say))
    return containers


def _start_host(client: docker.DockerClient, topology: Topology, i: int, image: str, paths: LabPaths,
                gpus: bool, say: Say) -> Container:
    name, address, net = topology.container(i), topology.address(i), topology.network(i)
    labels = {LABEL: "1", ROLE: "host", TOPOLOGY_LABEL: topology.kind,
              KEY: _fingerprint(paths.key.with_suffix(".pub"))}
    try:
        c = client.containers.get(name)
        same = (image in c.image.tags and all(c.labels.get(k) == v for k, v in labels.items()) and
                c.attrs["NetworkSettings"]["Networks"].get(net.name, {}).get("IPAMConfig", {}).get("IPv4Address") == address)
        if same and c.status == "running":
            return c
        c.remove(force=True)
    except NotFound:
        pass
    say(f"starting {name} ({topology.name(i)}, {address})")
    endpoint = client.api.create_endpoint_config(ipv4_address=address, aliases=[topology.name(i)])
    host_config = client.api.create_host_config(
        binds={str(paths.key.with_suffix(".pub").resolve()): {"bind": "/etc/lab/authorized_keys", "mode": "ro"},
               SHARED_VOLUME: {"bind": SHARED_DIR, "mode": "rw"}},
        # Every peer address answers from /etc/hosts at once: a reverse lookup that waits for
        # an unreachable resolver stalls torch's rendezvous by 10 s or more.
        shm_size="1g", init=True, extra_hosts=peer_names(topology, i),
        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None)
    created = client.api.create_container(
        image, name=name, hostname=topology.name(i), detach=True, labels=labels,
        host_config=host_config,
        networking_config=client.api.create_networking_config({net.name: endpoint}))
    client.api.start(created["Id"])
    return client.containers.get(name)


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


def _fingerprint(public_key: Path) -> str:
    return hashlib.sha256(public_key.read_bytes()).hexdigest()[:16]


def lab_containers(client: docker.DockerClient) -> list[Container]:
    return sorted(client.containers.list(all=True, filters={"label": LABEL}), key=lambda c: c.name)


def collect_host_keys(containers: list[Container], topology: Topology, paths: LabPaths) -> None:
    """Record each host's key in the lab known_hosts, read through the engine (a channel
    we already trust), so SSH can verify every host from its first connection."""
    lines = []
    for i, c in zip(topology.indices(), containers):
        key = _wait_for_host_key(c)
        lines.append(f"{topology.address(i)} {key}\n")
    paths.known_hosts.parent.mkdir(parents=True, exist_ok=True)
    paths.known_hosts.write_text("".join(lines))


def _wait_for_host_key(c: Container) -> str:
    deadline = time.monotonic() + SSH_WAIT
    while True:
        code, out = c.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"])
        if code == 0 and out.strip():
            return " ".join(out.decode().split()[:2])
        c.reload()
        if c.status != "running" or time.monotonic() > deadline:
            logs = c.logs(tail=5).decode(errors="replace").strip().splitlines()
            raise EngineError(f"host container {c.name} did not start sshd ({c.status}): "
                              f"{logs[-1] if logs else 'no output'}")
        time.sleep(0.3)


def wait_for_ssh(topology: Topology) -> None:
    """Until every host's sshd answers with its banner (bounded)."""
    deadline = time.monotonic() + SSH_WAIT
    pending = set(topology.indices())
    while pending:
        pending = {i for i in pending if not ssh_answers(topology.address(i))}
        if pending and time.monotonic() > deadline:
            raise EngineError(f"sshd did not answer on {', '.join(topology.name(i) for i in sorted(pending))}")
        if pending:
            time.sleep(0.3)


def ssh_answers(address: str, port: int = 22, timeout: float = SSH_PROBE_TIMEOUT) -> bool:
    """True when an SSH server greets on address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


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


def down(client: docker.DockerClient, say: Say) -> int:
    """Remove every container, network and volume of the lab; returns how many."""
    removed = 0
    for c in lab_containers(client):
        c.remove(force=True, v=True)
        say(f"removed container {c.name}")
        removed += 1
    for net in client.networks.list(filters={"label": LABEL}):
        remove_network(client.networks.get(net.id), say)
        removed += 1
    for volume in client.volumes.list(filters={"label": LABEL}):
        volume.remove(force=True)
        say(f"removed volume {volume.name}")
        removed += 1
    return removed


@dataclass(frozen=True)
class HostStatus:
    container: str
    hostname: str
    state: str
    addresses: tuple[str, ...]
    ssh: bool


def status(client: docker.DockerClient) -> list[HostStatus]:
    containers = lab_containers(client)

    def one(c: Container) -> HostStatus:
        nets = c.attrs["NetworkSettings"]["Networks"]
        addresses = tuple(f"{n['IPAddress']} ({name})" for name, n in nets.items() if n.get("IPAddress"))
        first = next((n["IPAddress"] for n in nets.values() if n.get("IPAddress")), None)
        return HostStatus(c.name, c.attrs["Config"]["Hostname"], c.status, addresses,
                          bool(first) and c.status == "running" and ssh_answers(first))

    with ThreadPoolExecutor(max_workers=max(1, len(containers))) as pool:
        return list(pool.map(one, containers))
