"""A lab on this machine's Docker engine: ``lab up``, ``down`` and ``status`` without --machines.

The steps of ``up``, each idempotent (a second ``up`` of the same lab takes seconds): the engine
(installed and started where allowed), the lab's SSH key, the host image, the networks, the
hosts, the cross-VPC gateway, the hosts' keys into known_hosts, sshd answering, Slurm
(``--scheduler slurm``: lab.containerlab.slurm), the inventory written.

A ``lab up`` that fails or is interrupted removes every container, network and volume it
created, and leaves what was there before it as it was. Labs of other names on the engine are
never touched: each has its own names, subnets (chosen free on the engine), key and labels.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import NotFound
from docker.models.containers import Container

from lab.containerlab import containers, crossvpc, engine, image, networks, slurm, sshd
from lab.containerlab.containers import HostContainer
from lab.containerlab.engine import Say
from lab.containerlab.image import Progress
from lab.containerlab.lifecycle import ACROSS_MACHINES_HINT, Lab, LabStatus, UpRequest
from lab.containerlab.resources import lab_containers, lab_resources
from lab.containerlab.topology import (
    LABEL,
    NAME_LABEL,
    ROLE,
    SHAPED_LABEL,
    SHARE_ROLE,
    SHARED_DIR,
    SLOTS_LABEL,
    HostLimits,
    LabPaths,
    Topology,
    inventory_text,
    peer_names,
)

DEFAULT_HOSTS = 4


@dataclass(frozen=True)
class EngineLab(Lab):
    """A lab on this machine's Docker engine."""

    def up(self, request: UpRequest, say: Say, progress: Progress) -> Path:
        request.refuse_machine_options()
        topology = Topology(request.hosts or DEFAULT_HOSTS, request.slots, request.topology, self.name,
                            scheduler=request.scheduler)  # (checked before anything starts)
        paths = self.paths
        client = engine.ensure_engine(say)
        sshd.ensure_key(paths.key, say)
        tag = image.ensure_image(client, request.base, paths.state, say, progress)
        gpus = request.gpus == "all" or (request.gpus == "auto" and "nvidia" in client.info().get("Runtimes", {}))
        before = lab_resources(client, topology.lab)
        if topology.scheduler == "slurm":
            slurm.write_files(topology, paths)
        try:
            topology = networks.claim_networks(client, topology, say)
            hosts = list(zip(topology.indices(), _start_hosts(client, topology, tag, paths, gpus, request.limits, say)))
            if topology.kind == "cross-vpc":
                crossvpc.start_gateway(client, topology, tag, request.peering, say)
                crossvpc.route_hosts_through_gateway(client, topology, tag)
            sshd.collect_host_keys(paths.known_hosts, {topology.address(i): c for i, c in hosts})
            sshd.wait_for_ssh({topology.name(i): (topology.address(i), 22) for i in topology.indices()},
                              {topology.name(i): c for i, c in hosts})
            if topology.scheduler == "slurm":
                slurm.start(topology, paths, say)
        except BaseException:
            removed = containers.down(client, say, topology.lab, spare=before)
            say(f"lab up did not finish: removed the {removed} container(s), network(s) and volume(s) it created")
            raise
        paths.inventory.write_text(inventory_text(topology))
        say(f"wrote {self.inventory}: lab {topology.lab}, {topology.hosts} hosts x {topology.slots} slot(s), "
            f"{topology.kind} on {', '.join(topology.subnets)}")
        return paths.inventory

    def down(self, say: Say) -> int:
        removed = containers.down(engine.client(), say, self.name)
        say(f"lab {self.name} is down ({removed} removed)" if removed else
            f"lab {self.name}: nothing to remove on this machine's engine ({ACROSS_MACHINES_HINT})")
        return removed

    def status(self) -> LabStatus:
        client = engine.client()
        hosts = containers.status(client, self.name)
        health = None
        if hosts and hosts[0].scheduler == "slurm":
            health = slurm.health(containers.running_topology(client, self.name), self.paths)
        return LabStatus(hosts, [], health)


def _start_hosts(client: docker.DockerClient, topology: Topology, tag: str, paths: LabPaths, gpus: bool,
                 limits: HostLimits, say: Say) -> list[Container]:
    """One container per host, made anew when its image, address or limits are not the wanted ones."""
    wanted = {topology.container(i) for i in topology.indices()}
    for c in lab_containers(client, topology.lab):
        kept_share_host = c.labels.get(ROLE) == SHARE_ROLE and c.labels.get(SHAPED_LABEL) in wanted  # (see kept)
        if c.name not in wanted and not kept_share_host:
            say(f"removing {c.name} (not in a {topology.hosts}-host lab)")
            c.remove(force=True)
    _ensure_shared_volume(client, topology)
    return containers.start_hosts([(client, _host(topology, i, tag, paths, gpus, limits)) for i in topology.indices()],
                                  say)


def _host(topology: Topology, i: int, tag: str, paths: LabPaths, gpus: bool, limits: HostLimits) -> HostContainer:
    """Host i's container: on its network at its address, the lab's key file and shared volume
    mounted (and slurm.conf, with Slurm); every peer address answers from /etc/hosts at once (a
    reverse lookup that waits for an unreachable resolver stalls torch's rendezvous by 10 s or more)."""
    mounts = {topology.volume: {"bind": SHARED_DIR, "mode": "rw"}}
    if topology.scheduler == "slurm":
        mounts[str(paths.slurm_conf.resolve())] = {"bind": slurm.CONF_PATH, "mode": "ro"}
    public_key = paths.key.with_suffix(".pub")
    labels = {**topology.labels("host"), SLOTS_LABEL: str(topology.slots)}  # compose/lab.yml sets the same
    return HostContainer(
        topology.container(i), topology.name(i), labels,
        tag, limits, gpus, public_key.read_bytes(), network=topology.network(i).name, address=topology.address(i),
        key_file=public_key, mounts=mounts, extra_hosts=tuple(peer_names(topology, i)))


def _ensure_shared_volume(client: docker.DockerClient, topology: Topology) -> None:
    try:
        client.volumes.get(topology.volume)
    except NotFound:
        client.volumes.create(topology.volume, labels={LABEL: "1", NAME_LABEL: topology.lab})
