"""The container lab's host containers on an engine: kept or made anew (one way, on this machine's
engine or on a Docker machine), listed, and removed with the rest of their lab; and the labs an
engine runs, as their containers and networks say."""
from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.models.containers import Container

from lab.containerlab.engine import EngineError, Say, each, reason
from lab.containerlab.lifecycle import HostStatus
from lab.containerlab.networks import remove_network, subnets_of
from lab.containerlab.resources import claim, lab_containers, lab_networks, lab_volumes, of_lab
from lab.containerlab.sshd import ssh_answers
from lab.containerlab.topology import (
    DEFAULT_LAB,
    NAME_LABEL,
    ROLE,
    SCHEDULER_LABEL,
    SHAPED_LABEL,
    SHARE_ROLE,
    SIDECAR_ROLES,
    SLOTS_LABEL,
    TOPOLOGY_LABEL,
    HostLimits,
    Scheduler,
    Topology,
    TopologyKind,
)

KEY_IN_HOST = "/etc/lab/authorized_keys"
NOT_ATTACHED = "attaching to network failed"  # what an engine says when it cannot attach a container to an overlay


@dataclass(frozen=True)
class HostContainer:
    """A lab host's container as ``lab up`` wants it, on this machine's engine or on a Docker
    machine: what differs between the two places is data here; :func:`kept` and
    :func:`start_host` are the one way to keep or make it."""

    name: str  # the container's: lab-node1
    node: str  # the host's name in the lab: its hostname, and its alias on ``network``
    labels: Mapping[str, str]  # its lab's, compose/lab.yml sets the same on one engine
    image: str
    limits: HostLimits
    gpus: bool
    public_key: bytes  # the lab's, which logs in to it
    network: str | None = None  # the network it is on, at ``address``; None: its machine's own (network mode host)
    address: str | None = None
    machine: str | None = None  # the Docker machine it runs on; None: this machine's engine
    key_file: Path | None = None  # the public key's file, mounted; None: the key is copied in before it starts
    mounts: Mapping[str, Mapping[str, str]] | None = None  # more of this machine's files and volumes it mounts
    extra_hosts: Sequence[str] | None = None  # /etc/hosts lines (name:address)
    publish_ssh: bool = False  # its sshd on a port of its machine that the engine picks
    ssh_port: int | None = None  # network mode host: the port its sshd listens on
    attach_wait: float = 0.0  # seconds its engine may fail to attach it to ``network`` before up gives up

    @property
    def lab(self) -> str:
        return self.labels[NAME_LABEL]

    @property
    def on_machine(self) -> str:
        return f" on machine {self.machine}" if self.machine else ""

    @property
    def about(self) -> str:
        """What lines about it name: the container, the host, where it is."""
        if self.machine is None:
            return f"{self.name} ({self.node}, {self.address})"
        return f"{self.name} ({self.node}){self.on_machine}" + (
            f" at {self.address}" if self.address else f" on {self.network}" if self.network
            else ", in its network namespace")

    @property
    def place(self) -> str:
        """Where it is, as a failure names it."""
        return self.on_machine if self.machine else f" at {self.address} on {self.network}"


def temp_mounts(limits: HostLimits) -> dict[str, str]:
    """A lab host's temporary folders: in memory, so that what a process writes there is charged to
    its memory group (a share's files to its share's part of the host: lab.containerlab.shares);
    programs may run from them (``exec``: Docker's default for a tmpfs is noexec, and a program's
    own compiled code, a JIT's or a copied package's, is loaded from there)."""
    return {path: f"rw,exec,nosuid,nodev,mode=1777,size={limits.memory_mb}m" for path in ("/tmp", "/var/tmp")}


def host_config(client: docker.DockerClient, limits: HostLimits, gpus: bool, **more: Any) -> dict[str, Any]:
    """What every lab host's container runs with: unprivileged (sshd's capabilities only, no new
    privileges), an init, a large /dev/shm, temporary folders in memory, the memory and process
    limits, the engine's GPUs when asked; ``more``: the rest of create_host_config's arguments
    (binds, networking)."""
    return dict(client.api.create_host_config(
        shm_size="1g", tmpfs=temp_mounts(limits), init=True, cap_drop=["ALL"], cap_add=list(HostLimits.CAPABILITIES),
        security_opt=["no-new-privileges"], mem_limit=limits.memory_mb << 20, memswap_limit=limits.memory_mb << 20,
        pids_limit=limits.pids,
        device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None, **more))


def differs(c: Container, host: HostContainer) -> str:
    """How a host's container differs from what ``lab up`` would make now ("" where it does not):
    running, its image, labels, limits, no capability but sshd's, on its network, at its address
    where it has a fixed one, and logging in the lab's current key (a key made anew is a new file
    the running container does not see)."""
    config = c.attrs["HostConfig"]
    endpoint = c.attrs["NetworkSettings"]["Networks"].get(host.network) or {} if host.network else {}
    address = (endpoint.get("IPAMConfig") or {}).get("IPv4Address")
    labels = sorted(k for k, v in host.labels.items() if c.labels.get(k) != v)
    if c.status != "running":
        return f"it is {c.status}"
    if host.image not in c.image.tags:
        return f"it runs {', '.join(c.image.tags) or c.image.short_id}, not {host.image}"
    if labels:
        return f"its label(s) {', '.join(labels)} differ"
    if config.get("Memory") != host.limits.memory_mb << 20:
        return f"its memory limit is {(config.get('Memory') or 0) >> 20} MB, not {host.limits.memory_mb}"
    if config.get("PidsLimit") != host.limits.pids:
        return f"its process limit is {config.get('PidsLimit')}, not {host.limits.pids}"
    if config.get("CapDrop") != ["ALL"] or config.get("Tmpfs") != temp_mounts(host.limits):
        return "it was made with other capabilities or temporary folders"
    if host.network is not None and not endpoint:
        return f"it is not on network {host.network}"
    if host.address is not None and address != host.address:
        return f"its address is {address}, not {host.address}"
    code, out = c.exec_run(["cat", KEY_IN_HOST])
    if code != 0:
        return f"its key cannot be read (status {code})"
    return "" if bytes(out).strip() == host.public_key.strip() else "it logs in another key than the lab's"


def kept(client: docker.DockerClient, host: HostContainer, say: Say) -> Container | None:
    """The host's container when it is as wanted (see differs); one that is not is removed (None),
    with the shapers in its network namespace, and a line says why; one of another's of that name is
    an error."""
    try:
        c = client.containers.get(host.name)
        claim(c, host.lab, host.on_machine)
        why = differs(c, host)
        if not why:
            return c
        say(f"host {host.node}: making {host.name} anew: {why}")
        shaped = {"label": f"{SHAPED_LABEL}={host.name}"}
        for shaper in client.containers.list(all=True, ignore_removed=True, filters=shaped):
            shaper.remove(force=True)  # (in the namespace of the container going away)
        c.remove(force=True)
    except NotFound:
        pass
    except DockerException as exc:
        raise EngineError(f"host {host.node}: cannot check {host.name}{host.place}: {reason(exc)}") from None
    return None


def start_host(client: docker.DockerClient, host: HostContainer, say: Say) -> Container:
    """The host's container made and started (where there is none of its name)."""
    say(f"starting {host.about}")
    binds = {**({str(host.key_file.resolve()): {"bind": KEY_IN_HOST, "mode": "ro"}} if host.key_file else {}),
             **(host.mounts or {})}
    config = host_config(client, host.limits, host.gpus, binds=binds or None, extra_hosts=host.extra_hosts,
                         port_bindings={22: None} if host.publish_ssh else None,
                         network_mode=None if host.network else "host")
    networking = client.api.create_networking_config({host.network: client.api.create_endpoint_config(
        ipv4_address=host.address, aliases=[host.node])}) if host.network else None
    deadline = time.monotonic() + host.attach_wait
    try:
        while True:
            created = client.api.create_container(
                host.image, name=host.name, hostname=host.node if host.network else None, detach=True,
                labels=dict(host.labels), ports=[22] if host.publish_ssh else None, host_config=config,
                networking_config=networking,
                environment={"LAB_SSH_PORT": str(host.ssh_port)} if host.ssh_port else None)
            if host.key_file is None:
                client.api.put_archive(created["Id"], str(Path(KEY_IN_HOST).parent),
                                       _one_file_tar(Path(KEY_IN_HOST).name, host.public_key))
            try:
                client.api.start(created["Id"])
                return client.containers.get(host.name)
            except APIError as exc:
                # A machine back up after going down with lab hosts running is "ready" in the swarm at
                # once, but for about half a minute its engine's attachments to the overlay time out (20 s)
                if NOT_ATTACHED not in str(exc) or time.monotonic() >= deadline:
                    raise
                client.api.remove_container(created["Id"], force=True)
                say(f"machine {host.machine}: its engine cannot attach {host.name} to the overlay network yet (as "
                    "after the machine came back up); trying again")
    except DockerException as exc:
        raise EngineError(f"host {host.node}: cannot start {host.name}{host.place}: {reason(exc)}") from None


def start_hosts(hosts: Sequence[tuple[docker.DockerClient, HostContainer]], say: Say) -> list[Container]:
    """Each host's container (on the engine beside it), kept or made anew. Every container that goes
    is gone before any is made: an engine that removes the last container it had on an overlay
    while it attaches another fails that one ("network not found") and keeps its attachment task
    for good, which then holds the network (no `lab down` could remove it; only leaving the swarm
    does: moby/moby#31068)."""
    found = each(lambda placed: kept(*placed, say), hosts)
    return each(lambda i: found[i] or start_host(*hosts[i], say), range(len(hosts)))


def _one_file_tar(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def down(client: docker.DockerClient, say: Say, lab: str | None = DEFAULT_LAB, spare: Collection[str] = ()) -> int:
    """Remove every container, network and volume of ``lab`` (None: of every lab) but those in
    ``spare`` (see :func:`resources.lab_resources`); returns how many."""
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
    for volume in lab_volumes(client, lab):
        if volume.name not in spare:
            volume.remove(force=True)
            say(f"removed volume {volume.name}")
            removed += 1
    return removed


def status(client: docker.DockerClient, lab: str = DEFAULT_LAB) -> list[HostStatus]:
    """The lab's hosts on the engine (not the sidecars of `lab net`), each with its addresses."""
    containers = [c for c in lab_containers(client, lab) if c.labels.get(ROLE) not in SIDECAR_ROLES]

    def one(c: Container) -> HostStatus:
        nets = c.attrs["NetworkSettings"]["Networks"]
        addresses = tuple(f"{n['IPAddress']} ({name})" for name, n in nets.items() if n.get("IPAddress"))
        first = next((n["IPAddress"] for n in nets.values() if n.get("IPAddress")), None)
        return HostStatus(c.name, c.status, first is not None and c.status == "running" and ssh_answers(first),
                          hostname=c.attrs["Config"]["Hostname"], addresses=addresses,
                          scheduler=c.labels.get(SCHEDULER_LABEL, "none"))

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
                       tuple(s for n in nets if of_lab(n.attrs.get("Labels"), name)
                             and (n.attrs.get("Labels") or {}).get(ROLE) != SHARE_ROLE for s in subnets_of(n)),
                       found[0].labels.get(SCHEDULER_LABEL, "none"))
            for name, found in sorted(by_lab.items())]


def running_topology(client: docker.DockerClient, lab: str) -> Topology:
    """The topology of the lab running under ``lab``, as its containers and networks say."""
    summary = next((s for s in labs(client) if s.name == lab), None)
    if summary is None:
        raise EngineError(f"no lab named {lab} is running: start one with `python -m lab up --name {lab}`")
    kind: TopologyKind = "cross-vpc" if summary.kind == "cross-vpc" else "plain"
    subnets = {n.name: subnets_of(n) for n in lab_networks(client, lab)}
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
