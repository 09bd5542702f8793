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

from .engine import EngineError, Say

log = logging.getLogger(__name__)

LABEL = "lab.managed"
ROLE = "lab.role"
KEY = "lab.key"  # the fingerprint of the public key a host trusts: a new key means a new host
NETWORK = "lab-net"
SUBNET = "10.213.0.0/24"
FIRST_HOST = 11  # node1 is .11, node2 .12, ...
USER = "lab"
SHARED_VOLUME = "lab-shared"  # mounted on every host: the lab's "NFS", for file:// rendezvous
SHARED_DIR = "/shared"
PYTHON = "/usr/local/bin/lab-python"
SSH_WAIT = 60.0
SSH_PROBE_TIMEOUT = 3.0


@dataclass(frozen=True)
class Topology:
    """How many hosts, and the ranks each gets."""

    hosts: int = 4
    slots: int = 1
    subnet: str = SUBNET

    def name(self, i: int) -> str:
        return f"node{i}"

    def container(self, i: int) -> str:
        return f"lab-node{i}"

    def address(self, i: int) -> str:
        return str(ipaddress.ip_network(self.subnet)[FIRST_HOST - 1 + i])

    @property
    def gateway(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    def indices(self) -> range:
        return range(1, self.hosts + 1)


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


def ensure_network(client: docker.DockerClient, topology: Topology, say: Say) -> None:
    try:
        net = client.networks.get(NETWORK)
        subnets = [c.get("Subnet") for c in net.attrs.get("IPAM", {}).get("Config", [])]
        if topology.subnet in subnets:
            return
        say(f"network {NETWORK} has subnet {subnets}, not {topology.subnet}: recreating it")
        net.remove()
    except NotFound:
        pass
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=topology.subnet,
                                                                       gateway=topology.gateway)])
    say(f"creating network {NETWORK} ({topology.subnet})")
    client.networks.create(NETWORK, driver="bridge", ipam=ipam, labels={LABEL: "1"})


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
    name, address = topology.container(i), topology.address(i)
    labels = {LABEL: "1", ROLE: "host", KEY: _fingerprint(paths.key.with_suffix(".pub"))}
    try:
        c = client.containers.get(name)
        same = (image in c.image.tags and all(c.labels.get(k) == v for k, v in labels.items()) and
                c.attrs["NetworkSettings"]["Networks"].get(NETWORK, {}).get("IPAMConfig", {}).get("IPv4Address") == address)
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
        shm_size="1g", init=True,
        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None)
    created = client.api.create_container(
        image, name=name, hostname=topology.name(i), detach=True, labels=labels,
        host_config=host_config,
        networking_config=client.api.create_networking_config({NETWORK: endpoint}))
    client.api.start(created["Id"])
    return client.containers.get(name)


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
    """The inventory of the lab, as `up` writes it (and the repository carries it)."""
    data = {"all": {
        "vars": {"ansible_user": USER, "ansible_ssh_private_key_file": ".lab/ssh/id_ed25519",
                 "ssh_known_hosts_file": ".lab/known_hosts", "ansible_python_interpreter": PYTHON,
                 "shared_dir": SHARED_DIR, "slots": topology.slots},
        "hosts": {topology.name(i): {"ansible_host": topology.address(i)} for i in topology.indices()},
    }}
    header = ("# The container lab's hosts, written by `python -m lab up` (make lab-up).\n"
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
        try:
            net.remove()
        except (APIError, NotFound) as exc:
            raise EngineError(f"cannot remove network {net.name}: {exc}") from None
        say(f"removed network {net.name}")
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
