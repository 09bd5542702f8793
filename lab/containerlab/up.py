"""``lab up``: the container lab, from the engine to the inventory that reaches it.

The steps, each idempotent (a second ``up`` of the same lab takes seconds): the engine (installed
and started where allowed), the lab's SSH key, the host image, the networks, the hosts, the
cross-VPC gateway, the hosts' keys into known_hosts, sshd answering, Slurm (``--scheduler
slurm``: lab.containerlab.slurm), the inventory written.

A ``lab up`` that fails or is interrupted removes every container, network and volume it
created, and leaves what was there before it as it was. Labs of other names on the engine are
never touched: each has its own names, subnets (chosen free on the engine), key and labels.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lab.containerlab import crossvpc, engine, hosts, image, slurm
from lab.containerlab.engine import Say
from lab.containerlab.image import Progress
from lab.containerlab.topology import HostLimits, LabPaths, Topology, inventory_text

GpuChoice = Literal["auto", "all", "none"]


@dataclass(frozen=True)
class UpRequest:
    topology: Topology
    inventory: Path  # where to write the lab's inventory; the lab's state goes beside it (.lab/)
    base: str = image.DEFAULT_BASE
    gpus: GpuChoice = "auto"  # auto: when the engine has the nvidia runtime
    peering: bool = False  # cross-vpc: route between the private networks
    limits: HostLimits = HostLimits()  # what each host's container may use


def bring_up(request: UpRequest, say: Say, progress: Progress) -> Path:
    """Start the lab ``request`` asks for and write its inventory; the inventory's path."""
    paths = LabPaths(request.inventory.resolve(), request.topology.lab)
    client = engine.ensure_engine(say)
    topology = hosts.with_free_subnets(client, request.topology)
    hosts.ensure_key(paths.key, say)
    tag = image.ensure_image(client, request.base, paths.state, say, progress)
    gpus = request.gpus == "all" or (request.gpus == "auto" and "nvidia" in client.info().get("Runtimes", {}))
    before = hosts.lab_resources(client, topology.lab)
    if topology.scheduler == "slurm":
        slurm.write_files(topology, paths)
    try:
        hosts.ensure_networks(client, topology, say)
        containers = hosts.start_hosts(client, topology, tag, paths, gpus, say, request.limits)
        if topology.kind == "cross-vpc":
            crossvpc.start_gateway(client, topology, tag, request.peering, say)
            crossvpc.route_hosts_through_gateway(client, topology, tag)
        hosts.collect_host_keys(containers, topology, paths)
        hosts.wait_for_ssh({topology.name(i): (topology.address(i), 22) for i in topology.indices()},
                           {topology.name(i): c for i, c in zip(topology.indices(), containers)})
        if topology.scheduler == "slurm":
            slurm.start(topology, paths, say)
    except BaseException:
        removed = hosts.down(client, say, topology.lab, spare=before)
        say(f"lab up did not finish: removed the {removed} container(s), network(s) and volume(s) it created")
        raise
    paths.inventory.write_text(inventory_text(topology))
    say(f"wrote {request.inventory}: lab {topology.lab}, {topology.hosts} hosts x {topology.slots} slot(s), "
        f"{topology.kind} on {', '.join(topology.subnets)}")
    return paths.inventory
