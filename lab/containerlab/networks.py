"""The container lab's networks: subnets of their own (free on the engine and among the routes of
its host), made, checked and removed on the engine."""
from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Collection
from dataclasses import replace

import docker
from docker.errors import APIError, NotFound
from docker.models.networks import Network

from lab.containerlab.crossvpc import untrack_bridge
from lab.containerlab.engine import EngineError, Say
from lab.containerlab.resources import lab_containers, lab_networks
from lab.containerlab.topology import DEFAULT_LAB, DEFAULT_SUBNETS, LABEL, NAME_LABEL, ROLE, SHARE_ROLE, Topology
from lab.net.subnets import Subnet, free_subnets, routes_in

ROUTES_COMMAND = ["ip", "-j", "-4", "route"]
CLAIM_TRIES = 5  # times a lab chooses its subnets again after another took one between its choice and its network


def subnets_of(net: Network) -> list[str]:
    return [c["Subnet"] for c in (net.attrs.get("IPAM") or {}).get("Config") or [] if c.get("Subnet")]


def with_free_subnets(client: docker.DockerClient, topology: Topology, refused: Collection[str] = ()) -> Topology:
    """The topology on subnets of its own: those its networks have where they all exist already,
    else /24s that no other network of the engine, and no route of the engine's host, overlaps
    (the kind's defaults first). A lab of another name than the default keeps off the default plain
    lab's subnet, so that the default lab comes up where the repository's inventory.yaml and
    compose/lab.yml say it is, whichever lab came up first; and off ``refused``, those the engine
    refused it already."""
    own = {n.name: subnets_of(n) for n in lab_networks(client, topology.lab)}
    wanted = [n.name for n in topology.networks()]
    if all(own.get(name) for name in wanted):
        return replace(topology, subnets=tuple(own[name][0] for name in wanted))
    taken = engine_subnets(client, spare=own) + host_routes() + [ipaddress.ip_network(s) for s in refused]
    if topology.lab != DEFAULT_LAB:
        taken += [ipaddress.ip_network(s) for s in DEFAULT_SUBNETS["plain"]]
    return replace(topology, subnets=free_subnets(DEFAULT_SUBNETS[topology.kind], taken))


def claim_networks(client: docker.DockerClient, topology: Topology, say: Say) -> Topology:
    """The topology's networks made on subnets free on the engine (:func:`with_free_subnets`), and the
    topology on them. Two labs started at once (by two commands, or two controllers of one engine) may
    choose the same free subnet: the engine refuses the second one's network ("Pool overlaps": the
    first one's may not be listed yet, as the engine makes it), and that lab chooses again, off the
    subnets refused."""
    refused: list[str] = []
    for attempt in range(1, CLAIM_TRIES + 1):
        chosen = with_free_subnets(client, topology, refused)
        try:
            ensure_networks(client, chosen, say)
            return chosen
        except APIError as exc:
            if "overlap" not in str(exc.explanation or exc).lower() or attempt == CLAIM_TRIES:
                raise EngineError(f"cannot create the networks of lab {topology.lab} on "
                                  f"{', '.join(chosen.subnets)}: {exc.explanation or exc}") from None
            say(f"another network took one of {', '.join(chosen.subnets)} as lab {topology.lab} chose it: "
                "choosing again")
            refused += chosen.subnets
    raise AssertionError("unreachable")  # (the last attempt returns or raises)


def claim_network(client: docker.DockerClient, name: str, labels: dict[str, str], near: str, say: Say) -> Network:
    """Network ``name`` (a bridge) with ``labels``, made where there is none on a /24 free on the
    engine and among its host's routes (the first after ``near`` in the lab's pool; never the default
    plain lab's, which comes up where inventory.yaml says), and chosen again when another network takes
    that subnet as it is made (as :func:`claim_networks`)."""
    try:
        return client.networks.get(name)
    except NotFound:
        pass
    refused = [ipaddress.ip_network(s) for s in DEFAULT_SUBNETS["plain"]]
    for attempt in range(1, CLAIM_TRIES + 1):
        subnet = free_subnets([near], engine_subnets(client) + host_routes() + refused)[0]
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(
            subnet=subnet, gateway=str(ipaddress.ip_network(subnet)[1]))])
        try:
            say(f"creating network {name} ({subnet})")
            return client.networks.create(name, driver="bridge", ipam=ipam, labels=labels)
        except APIError as exc:
            if "already exists" in str(exc.explanation or exc):
                return client.networks.get(name)  # (made by another grader of the lab meanwhile)
            if "overlap" not in str(exc.explanation or exc).lower() or attempt == CLAIM_TRIES:
                raise EngineError(f"cannot create network {name} on {subnet}: {exc.explanation or exc}") from None
            refused.append(ipaddress.ip_network(subnet))
    raise AssertionError("unreachable")  # (the last attempt returns or raises)


def engine_subnets(client: docker.DockerClient, spare: Collection[str] = ()) -> list[Subnet]:
    """The subnets of the engine's networks, but those named in ``spare``."""
    return [ipaddress.ip_network(s, strict=False) for n in client.networks.list()
            if n.name not in spare for s in subnets_of(n)]


def host_routes() -> list[Subnet]:
    """The networks the engine's host routes to (``ip -j route``), so a lab network shadows none."""
    try:
        done = subprocess.run(ROUTES_COMMAND, capture_output=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return routes_in(done.stdout)


def ensure_networks(client: docker.DockerClient, topology: Topology, say: Say) -> None:
    """The topology's networks, each with its subnet; the lab's other networks are removed."""
    wanted = {n.name: n for n in topology.networks()}
    for existing in lab_networks(client, topology.lab):
        if existing.name not in wanted and (existing.attrs.get("Labels") or {}).get(ROLE) != SHARE_ROLE:
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
