"""``lab net overlay up / down / show`` on a container lab: a WireGuard mesh across its hosts, the
third way across two VPCs (beside peering them, and beside nothing: the failure).

This machine's kernel has no WireGuard, so each host gets a sidecar: a container that shares the
host's network namespace, holds NET_ADMIN and /dev/net/tun (nothing else) and runs ``wireguard-go``
(userspace) in the foreground; the host itself stays unprivileged and cannot change the interface.
The sidecar makes the host's private key in its own filesystem (the host cannot read it) and is
the interface's life: when it goes, the interface goes with it. ``down`` (and ``lab down``, which
removes every container of the lab) removes the sidecars, and so every interface, key and process.

The interface's state is read from the interface itself (``wg show``, its address and MTU), never
from a record that could disagree with it; the sidecars' labels say only which host each serves
and the overlay's subnet (so that another lab's overlay takes another).
"""
from __future__ import annotations

import ipaddress
import time
from collections.abc import Sequence

import docker
from docker.errors import APIError, NotFound
from docker.models.containers import Container

from lab.containerlab import helper
from lab.containerlab.engine import EngineError, Say, reason
from lab.containerlab.networks import engine_subnets, host_routes
from lab.containerlab.resources import lab_containers
from lab.containerlab.topology import (
    NAME_LABEL,
    ROLE,
    SHAPED_LABEL,
    Topology,
    lab_inventory,
)
from lab.net import overlay, wireguard
from lab.net.overlay import End, HostOverlay
from lab.net.subnets import free_subnets
from lab.net.wireguard import INTERFACE

ROLE_NAME = "overlay"
SUBNET_LABEL = "lab.overlay.subnet"
START_WAIT = 15.0  # seconds for wireguard-go to make its interface
SIDECAR_MEMORY = "256m"  # wireguard-go's buffers, with room
SIDECAR_PIDS = 128  # its threads, and the execs of wg and ip
POLL = 0.3


class Sidecar(End):
    """Host i's end: a sidecar container in its network namespace with NET_ADMIN and /dev/net/tun
    only, running wireguard-go in the foreground (the key is made in its filesystem); the host's
    /etc/hosts is written from inside the host, as root by ``docker exec``."""

    def __init__(self, client: docker.DockerClient, topology: Topology, i: int, subnet: str = "") -> None:
        super().__init__(topology.name(i), topology.external(i) or topology.address(i))
        self.client, self.topology, self.i, self.subnet = client, topology, i, subnet

    @property
    def container(self) -> str:
        return f"{self.topology.lab}-wg-node{self.i}"

    def start(self) -> None:
        host = helper.running_host(self.client, self.topology, self.i)
        labels = {**self.topology.labels(ROLE_NAME), SHAPED_LABEL: host.name, SUBNET_LABEL: self.subnet}
        try:
            sidecar = self.client.containers.run(
                host.image.id, ["sh", "-c", f"{wireguard.USERSPACE_ENV} exec wireguard-go -f {INTERFACE}"],
                entrypoint=[], name=self.container, network_mode=f"container:{host.id}", cap_drop=["ALL"],
                cap_add=["NET_ADMIN"], devices=["/dev/net/tun:/dev/net/tun:rwm"], security_opt=["no-new-privileges"],
                mem_limit=SIDECAR_MEMORY, pids_limit=SIDECAR_PIDS, init=True, detach=True, labels=labels)
        except APIError as exc:
            raise EngineError(f"host {self.name}: cannot start its WireGuard sidecar: {reason(exc)}") from None
        deadline = time.monotonic() + START_WAIT
        while True:
            sidecar.reload()
            if sidecar.status != "running":
                there = helper.in_namespace(self.client, self.topology, self.i,
                                            f"ip -d -o link show {INTERFACE} 2>/dev/null || true")
                known = f" (an interface {INTERFACE} is there already, not WireGuard's)" if there.strip() else ""
                raise EngineError(f"host {self.name}: wireguard-go cannot start: {_last_line(sidecar)}{known}")
            try:
                if sidecar.exec_run(["wg", "show", INTERFACE, "listen-port"])[0] == 0:
                    return
            except APIError:  # stopped since the reload, most likely: the next pass says why
                pass
            if time.monotonic() > deadline:
                raise EngineError(f"host {self.name}: wireguard-go made no {INTERFACE} within {START_WAIT:g}s: "
                                  f"{_last_line(sidecar)}")
            time.sleep(POLL)

    def sh(self, script: str) -> str:
        try:
            code, out = self.client.containers.get(self.container).exec_run(["sh", "-c", script])
        except (APIError, NotFound) as exc:
            raise EngineError(f"host {self.name}: its WireGuard sidecar is gone ({reason(exc)}): run "
                              f"`python -m lab net overlay up --name {self.topology.lab}` again") from None
        text = bytes(out).decode("utf-8", "replace")
        if code != 0:
            lines = text.strip().splitlines()
            raise EngineError(f"host {self.name}: {lines[-1] if lines else f'exit {code}'}")
        return text

    def set_hosts(self, script: str) -> None:
        helper.in_host(self.client, self.topology, self.i, script)

    def remove(self) -> bool:
        try:
            sidecar = self.client.containers.get(self.container)
        except NotFound:
            return False
        if sidecar.labels.get(ROLE) != ROLE_NAME or sidecar.labels.get(NAME_LABEL) != self.topology.lab:
            raise EngineError(f"host {self.name}: a container named {self.container} is not lab "
                              f"{self.topology.lab}'s overlay sidecar: remove or rename it")
        self.set_hosts(wireguard.hosts_script([]))
        sidecar.remove(force=True)  # its interface and key go with it
        return True


def sidecars(client: docker.DockerClient, topology: Topology, subnet: str = "") -> list[Sidecar]:
    """An end for every host of the lab."""
    return [Sidecar(client, topology, i, subnet) for i in topology.indices()]


def up(client: docker.DockerClient, topology: Topology, say: Say, subnet: str | None = None,
       mtu: int | None = None, port: int = wireguard.PORT) -> list[HostOverlay]:
    """The lab's hosts on an overlay of their own (see lab.net.overlay.up)."""
    subnet = subnet or free_subnet(client, topology)
    return overlay.up(sidecars(client, topology, subnet), subnet, say, mtu, port)


def down(client: docker.DockerClient, topology: Topology, say: Say) -> int:
    """Remove the lab's sidecars, and with them every interface, key and process; on how many hosts."""
    return overlay.down(sidecars(client, topology), say)


def show(client: docker.DockerClient, topology: Topology) -> list[HostOverlay]:
    """Each host's end of the overlay (hosts without one are left out)."""
    running = {c.labels.get(SHAPED_LABEL) for c in lab_containers(client, topology.lab)
               if c.labels.get(ROLE) == ROLE_NAME}
    return overlay.show([end for end in sidecars(client, topology) if topology.container(end.i) in running])


def free_subnet(client: docker.DockerClient, topology: Topology) -> str:
    """A /24 that no network of the engine, route of its host or other lab's overlay overlaps (the
    lab's own overlay, being replaced, keeps its subnet)."""
    taken = engine_subnets(client) + host_routes() + [
        ipaddress.ip_network(c.labels[SUBNET_LABEL]) for c in lab_containers(client, None)
        if c.labels.get(ROLE) == ROLE_NAME and c.labels.get(SUBNET_LABEL) and c.labels.get(NAME_LABEL) != topology.lab]
    return free_subnets((wireguard.DEFAULT_SUBNET,), taken)[0]


def inventory_text(topology: Topology, ends: Sequence[HostOverlay]) -> str:
    """The lab's inventory with each host's data plane on the overlay: its data_address the
    overlay's, network_interface the overlay's interface (so MASTER_ADDR and gloo use it)."""
    by_host = {end.host: end for end in ends}
    hosts: dict[str, dict[str, object]] = {}
    for i in topology.indices():
        end = by_host[topology.name(i)]
        hosts[topology.name(i)] = {"ansible_host": topology.address(i), "data_address": end.address.split("/")[0],
                                   "network_interface": INTERFACE, "overlay": topology.lab}
    return lab_inventory(topology.lab, topology.slots, hosts, f"The container lab {topology.lab}'s hosts on its "
                         f"WireGuard overlay, written by `python -m lab net overlay up --name {topology.lab}`.",
                         shared=True)


def _last_line(sidecar: Container) -> str:
    """What wireguard-go last said (its error, where it gave one)."""
    return wireguard.wireguard_go_said(bytes(sidecar.logs()).decode("utf-8", "replace")) or \
        f"it exited ({sidecar.attrs['State'].get('ExitCode')})"
