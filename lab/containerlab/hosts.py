"""The container lab's hosts: containers with their own addresses and sshd, started, listed
and removed on the engine, found again by their labels (``topology``): every function here
works on one lab, by its name, and leaves the other labs on the engine alone."""
from __future__ import annotations

import ipaddress
import itertools
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import docker
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from docker.errors import APIError, NotFound
from docker.models.containers import Container
from docker.models.networks import Network

from lab.containerlab import slurm
from lab.containerlab.crossvpc import untrack_bridge
from lab.containerlab.engine import EngineError, Say, each, reason
from lab.containerlab.topology import (
    DEFAULT_LAB,
    DEFAULT_SUBNETS,
    LABEL,
    NAME_LABEL,
    ROLE,
    SCHEDULER_LABEL,
    SHAPED_LABEL,
    SHARED_DIR,
    SLOTS_LABEL,
    TOPOLOGY_LABEL,
    HostLimits,
    LabPaths,
    Scheduler,
    Topology,
    TopologyKind,
    peer_names,
)

log = logging.getLogger(__name__)

SSH_WAIT = 60.0
SSH_PROBE_TIMEOUT = 3.0
START_POLL = 0.05  # seconds between looks at a starting host (its key, its sshd): sshd starts in a few tenths


def ensure_key(path: Path, say: Say) -> Path:
    """An ed25519 key pair for the lab (private key 0600, even one an older run or a copy left
    readable); made once, never put in an image."""
    if path.exists() and path.with_suffix(".pub").exists():
        os.chmod(path.parent, 0o700)
        os.chmod(path, 0o600)
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


def _of_lab(labels: Mapping[str, str] | None, lab: str | None) -> bool:
    """Whether something with these labels belongs to ``lab`` (None: to any lab). Things made
    before labs had names belong to the default lab."""
    return lab is None or (labels or {}).get(NAME_LABEL, DEFAULT_LAB) == lab


def claim(c: Container, lab: str, where: str = "") -> None:
    """EngineError unless ``c`` is a container of ``lab``: one of the same name that is not is
    someone else's, and the lab never removes it."""
    if LABEL not in c.labels or not _of_lab(c.labels, lab):
        raise EngineError(f"a container named {c.name}{where} is not lab {lab}'s: remove or rename it, or give "
                          f"the lab another --name")


def lab_containers(client: docker.DockerClient, lab: str | None = DEFAULT_LAB) -> list[Container]:
    """The containers of ``lab`` (None: of every lab), by name."""
    found = client.containers.list(all=True, filters={"label": LABEL})
    return sorted((c for c in found if _of_lab(c.labels, lab)), key=lambda c: c.name)


def lab_networks(client: docker.DockerClient, lab: str | None = DEFAULT_LAB) -> list[Network]:
    return [n for n in client.networks.list(filters={"label": LABEL}) if _of_lab(n.attrs.get("Labels"), lab)]


def _subnets(net: Network) -> list[str]:
    return [c["Subnet"] for c in (net.attrs.get("IPAM") or {}).get("Config") or [] if c.get("Subnet")]


def with_free_subnets(client: docker.DockerClient, topology: Topology) -> Topology:
    """The topology on subnets of its own: those its networks have where they all exist already,
    else /24s that no other network of the engine, and no route of the engine's host, overlaps
    (the kind's defaults first)."""
    own = {n.name: _subnets(n) for n in lab_networks(client, topology.lab)}
    wanted = [n.name for n in topology.networks()]
    if all(own.get(name) for name in wanted):
        return replace(topology, subnets=tuple(own[name][0] for name in wanted))
    taken = engine_subnets(client, spare=own) + host_routes()
    return replace(topology, subnets=free_subnets(DEFAULT_SUBNETS[topology.kind], taken))


Subnet = ipaddress.IPv4Network | ipaddress.IPv6Network


def engine_subnets(client: docker.DockerClient, spare: Collection[str] = ()) -> list[Subnet]:
    """The subnets of the engine's networks, but those named in ``spare``."""
    return [ipaddress.ip_network(s, strict=False) for n in client.networks.list()
            if n.name not in spare for s in _subnets(n)]


def free_subnets(defaults: Sequence[str], taken: Sequence[Subnet]) -> tuple[str, ...]:
    """A /24 for each of ``defaults``: itself where nothing in ``taken`` (nor one chosen before)
    overlaps it, else the next free one of the pool."""
    chosen: list[Subnet] = []
    for default in defaults:
        free = (n for n in map(ipaddress.ip_network, itertools.chain([default], _pool()))
                if not any(n.overlaps(other) for other in (*taken, *chosen)))
        found = next(free, None)
        if found is None:
            raise EngineError("no free /24 is left in 10.0.0.0/8 for the lab's networks")
        chosen.append(found)
    return tuple(str(n) for n in chosen)


def _pool() -> Iterator[str]:
    """The /24s a lab takes when its defaults are taken: 10.213.0.0/16 first, then the rest of 10/8."""
    for second in (213, *range(214, 256), *range(1, 213)):
        for third in range(256):
            yield f"10.{second}.{third}.0/24"


def host_routes() -> list[Subnet]:
    """The networks the engine's host routes to (``ip -j route``), so a lab network shadows none."""
    try:
        done = subprocess.run(ROUTES_COMMAND, capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return routes_in(done.stdout)


ROUTES_COMMAND = ["ip", "-j", "-4", "route"]


def routes_in(output: bytes | str) -> list[Subnet]:
    """The destinations in ``ip -j route``'s output."""
    try:
        routes = [r.get("dst", "") for r in json.loads(output)]
    except (ValueError, AttributeError):
        return []
    found = []
    for dst in routes:
        try:
            found.append(ipaddress.ip_network(dst, strict=False))
        except ValueError:  # "default"
            continue
    return found


def ensure_networks(client: docker.DockerClient, topology: Topology, say: Say) -> None:
    """The topology's networks, each with its subnet; the lab's other networks are removed."""
    wanted = {n.name: n for n in topology.networks()}
    for existing in lab_networks(client, topology.lab):
        if existing.name not in wanted:
            for c in lab_containers(client, topology.lab):
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
        client.networks.create(net.name, driver="bridge", ipam=ipam, labels={LABEL: "1", NAME_LABEL: topology.lab})


def remove_network(net: Network, say: Say) -> None:
    """Remove a lab network and anything the lab added for it on the engine's host (this machine's:
    a bridge; an overlay's are the swarm's)."""
    if net.attrs.get("Driver") == "bridge":
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


def ensure_shared_volume(client: docker.DockerClient, topology: Topology) -> None:
    try:
        client.volumes.get(topology.volume)
    except NotFound:
        client.volumes.create(topology.volume, labels={LABEL: "1", NAME_LABEL: topology.lab})


def start_hosts(client: docker.DockerClient, topology: Topology, image: str, paths: LabPaths,
                gpus: bool, say: Say, limits: HostLimits = HostLimits()) -> list[Container]:
    """One container per host, recreated when its image, address or limits are not the wanted ones."""
    wanted = {topology.container(i) for i in topology.indices()}
    for c in lab_containers(client, topology.lab):
        if c.name not in wanted:
            say(f"removing {c.name} (not in a {topology.hosts}-host lab)")
            c.remove(force=True)
    ensure_shared_volume(client, topology)
    return each(lambda i: _start_host(client, topology, i, image, paths, gpus, limits, say), topology.indices())


def _start_host(client: docker.DockerClient, topology: Topology, i: int, image: str, paths: LabPaths,
                gpus: bool, limits: HostLimits, say: Say) -> Container:
    name, address, net = topology.container(i), topology.address(i), topology.network(i)
    labels = {**topology.labels("host"), SLOTS_LABEL: str(topology.slots)}  # compose/lab.yml sets the same
    try:
        c = client.containers.get(name)
        if keeps(c, image, labels, limits, paths.key.with_suffix(".pub").read_bytes(), net.name, address):
            return c
        claim(c, topology.lab)
        for shaper in client.containers.list(all=True, filters={"label": f"{SHAPED_LABEL}={name}"}):
            shaper.remove(force=True)  # (in the namespace of the container going away)
        c.remove(force=True)
    except NotFound:
        pass
    say(f"starting {name} ({topology.name(i)}, {address})")
    endpoint = client.api.create_endpoint_config(ipv4_address=address, aliases=[topology.name(i)])
    binds = {str(paths.key.with_suffix(".pub").resolve()): {"bind": "/etc/lab/authorized_keys", "mode": "ro"},
             topology.volume: {"bind": SHARED_DIR, "mode": "rw"}}
    if topology.scheduler == "slurm":
        binds[str(paths.slurm_conf.resolve())] = {"bind": slurm.CONF_PATH, "mode": "ro"}
    # Every peer address answers from /etc/hosts at once: a reverse lookup that waits for an
    # unreachable resolver stalls torch's rendezvous by 10 s or more.
    config = host_config(client, limits, gpus, binds=binds, extra_hosts=peer_names(topology, i))
    try:
        created = client.api.create_container(
            image, name=name, hostname=topology.name(i), detach=True, labels=labels,
            host_config=config,
            networking_config=client.api.create_networking_config({net.name: endpoint}))
        client.api.start(created["Id"])
        return client.containers.get(name)
    except APIError as exc:
        raise EngineError(f"host {topology.name(i)}: cannot start {name} at {address} on {net.name}: "
                          f"{reason(exc)}") from None


def host_config(client: docker.DockerClient, limits: HostLimits, gpus: bool, **more: Any) -> dict[str, Any]:
    """What every lab host's container runs with: unprivileged (sshd's capabilities only, no new
    privileges), an init, a large /dev/shm, the memory and process limits, the engine's GPUs
    when asked; ``more``: the rest of create_host_config's arguments (binds, networking)."""
    return dict(client.api.create_host_config(
        shm_size="1g", init=True, cap_drop=["ALL"], cap_add=list(HostLimits.CAPABILITIES),
        security_opt=["no-new-privileges"], mem_limit=limits.memory_mb << 20, memswap_limit=limits.memory_mb << 20,
        pids_limit=limits.pids,
        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None, **more))


def keeps(c: Container, image: str, labels: Mapping[str, str], limits: HostLimits, public_key: bytes,
          network: str | None = None, address: str | None = None) -> bool:
    """Whether a host's running container is as ``lab up`` would make it now (image, labels,
    limits, no capability but sshd's, and on ``network`` at ``address``) and logs in the lab's
    current key (a key made anew is a new file the running container does not see)."""
    config = c.attrs["HostConfig"]
    endpoint = c.attrs["NetworkSettings"]["Networks"].get(network) or {} if network else {}
    if not (c.status == "running" and image in c.image.tags and all(c.labels.get(k) == v for k, v in labels.items())
            and config.get("Memory") == limits.memory_mb << 20 and config.get("PidsLimit") == limits.pids
            and config.get("CapDrop") == ["ALL"]
            and (network is None or (endpoint.get("IPAMConfig") or {}).get("IPv4Address") == address)):
        return False
    code, out = c.exec_run(["cat", "/etc/lab/authorized_keys"])
    return code == 0 and bytes(out).strip() == public_key.strip()


def collect_host_keys(containers: list[Container], topology: Topology, paths: LabPaths) -> None:
    """Record each host's key in the lab known_hosts, read through the engine (a channel
    we already trust), so SSH can verify every host from its first connection."""
    keys = each(host_key, containers)
    paths.known_hosts.parent.mkdir(parents=True, exist_ok=True)
    paths.known_hosts.write_text("".join(f"{topology.address(i)} {key}\n" for i, key in zip(topology.indices(), keys)))


def host_key(c: Container) -> str:
    """The host's SSH key (``type base64``), once its entrypoint has made it (bounded)."""
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
        time.sleep(START_POLL)


def wait_for_ssh(targets: Mapping[str, tuple[str, int]], containers: Mapping[str, Container] | None = None) -> None:
    """Until every host's sshd (name -> address, port) answers with its banner (bounded). With the
    hosts' ``containers`` (by name), a host whose container has stopped (its sshd could not
    listen, say) is an error at once, with the container's last line."""
    deadline, looked = time.monotonic() + SSH_WAIT, time.monotonic()
    pending = dict(targets)
    while pending:
        pending = {name: at for name, at in pending.items() if not ssh_answers(*at)}
        if pending and containers and time.monotonic() - looked > 1:
            looked = time.monotonic()
            for name in sorted(pending):
                c = containers[name]
                c.reload()
                if c.status != "running":
                    logs = c.logs(tail=3).decode(errors="replace").strip().splitlines()
                    raise EngineError(f"host {name}: its container {c.name} stopped ({c.status}): "
                                      f"{logs[-1] if logs else 'no output'}")
        if pending and time.monotonic() > deadline:
            where = (f"{name} ({address}:{port})" for name, (address, port) in sorted(pending.items()))
            raise EngineError(f"sshd did not answer on {', '.join(where)}")
        if pending:
            time.sleep(START_POLL)


def ssh_answers(address: str, port: int = 22, timeout: float = SSH_PROBE_TIMEOUT) -> bool:
    """True when an SSH server greets on address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _lab_volumes(client: docker.DockerClient, lab: str | None) -> list[docker.models.volumes.Volume]:
    return [v for v in client.volumes.list(filters={"label": LABEL}) if _of_lab(v.attrs.get("Labels"), lab)]


def lab_resources(client: docker.DockerClient, lab: str | None = DEFAULT_LAB) -> set[str]:
    """The ids (names for volumes) of every container, network and volume of ``lab``."""
    return ({c.id for c in lab_containers(client, lab)} | {n.id for n in lab_networks(client, lab)}
            | {v.name for v in _lab_volumes(client, lab)})


def down(client: docker.DockerClient, say: Say, lab: str | None = DEFAULT_LAB, spare: Collection[str] = ()) -> int:
    """Remove every container, network and volume of ``lab`` (None: of every lab) but those in
    ``spare`` (see :func:`lab_resources`); returns how many."""
    removed = 0
    for c in lab_containers(client, lab):
        if c.id not in spare:
            c.remove(force=True, v=True)
            say(f"removed container {c.name}")
            removed += 1
    for net in lab_networks(client, lab):
        if net.id not in spare:
            remove_network(client.networks.get(net.id), say)
            removed += 1
    for volume in _lab_volumes(client, lab):
        if volume.name not in spare:
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
    scheduler: str = "none"


def status(client: docker.DockerClient, lab: str = DEFAULT_LAB) -> list[HostStatus]:
    containers = [c for c in lab_containers(client, lab) if c.labels.get(ROLE) != "shaper"]  # (lab net show)

    def one(c: Container) -> HostStatus:
        nets = c.attrs["NetworkSettings"]["Networks"]
        addresses = tuple(f"{n['IPAddress']} ({name})" for name, n in nets.items() if n.get("IPAddress"))
        first = next((n["IPAddress"] for n in nets.values() if n.get("IPAddress")), None)
        return HostStatus(c.name, c.attrs["Config"]["Hostname"], c.status, addresses,
                          first is not None and c.status == "running" and ssh_answers(first),
                          c.labels.get(SCHEDULER_LABEL, "none"))

    return each(one, containers)


@dataclass(frozen=True)
class LabSummary:
    """One lab on the engine, as ``lab ls`` shows it."""

    name: str
    kind: str
    hosts: int
    slots: int
    running: int  # hosts whose container runs
    subnets: tuple[str, ...]
    scheduler: str = "none"

    @property
    def state(self) -> str:
        return "running" if self.running == self.hosts else f"{self.running}/{self.hosts} running"


def labs(client: docker.DockerClient) -> list[LabSummary]:
    """Every lab on the engine, by name."""
    by_lab: dict[str, list[Container]] = {}
    for c in lab_containers(client, None):
        if c.labels.get(ROLE) == "host":
            by_lab.setdefault(c.labels.get(NAME_LABEL, DEFAULT_LAB), []).append(c)
    nets = lab_networks(client, None)
    return [LabSummary(name, found[0].labels.get(TOPOLOGY_LABEL, "?"), len(found),
                       int(found[0].labels.get(SLOTS_LABEL, "1")), sum(c.status == "running" for c in found),
                       tuple(s for n in nets if _of_lab(n.attrs.get("Labels"), name) for s in _subnets(n)),
                       found[0].labels.get(SCHEDULER_LABEL, "none"))
            for name, found in sorted(by_lab.items())]


def running_topology(client: docker.DockerClient, lab: str) -> Topology:
    """The topology of the lab running under ``lab``, as its containers and networks say."""
    summary = next((s for s in labs(client) if s.name == lab), None)
    if summary is None:
        raise EngineError(f"no lab named {lab} is running: start one with `python -m lab up --name {lab}`")
    kind: TopologyKind = "cross-vpc" if summary.kind == "cross-vpc" else "plain"
    subnets = {n.name: _subnets(n) for n in lab_networks(client, lab)}
    scheduler: Scheduler = "slurm" if summary.scheduler == "slurm" else "none"
    shape = Topology(summary.hosts, summary.slots, kind, lab, scheduler=scheduler)
    return replace(shape, subnets=tuple((subnets.get(n.name) or [n.subnet])[0] for n in shape.networks()))


def lab_with_hosts(client: docker.DockerClient, addresses: Collection[str]) -> str | None:
    """The lab whose hosts have every one of ``addresses`` (an inventory's), if one does."""
    for summary in labs(client):
        topology = running_topology(client, summary.name)
        if set(addresses) <= {topology.address(i) for i in topology.indices()}:
            return summary.name
    return None
