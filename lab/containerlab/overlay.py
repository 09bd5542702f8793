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
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import APIError, NotFound
from docker.models.containers import Container

from lab.containerlab import helper
from lab.containerlab.engine import EngineError, Say, each, reason
from lab.containerlab.networks import engine_subnets, free_subnets, host_routes
from lab.containerlab.resources import lab_containers
from lab.containerlab.topology import (
    ROLE,
    SHAPED_LABEL,
    LabPaths,
    Topology,
    lab_inventory,
    state_subdir,
)
from lab.core import wireguard
from lab.core.wireguard import INTERFACE, Member, PeerState
from lab.errors import HostUnreachable

ROLE_NAME = "overlay"
SUBNET_LABEL = "lab.overlay.subnet"
KEY_FILE = "/run/lab-wg/private.key"  # in the sidecar's own filesystem
START_WAIT = 15.0  # seconds for wireguard-go to make its interface
HANDSHAKE_WAIT = 20.0  # seconds for every pair of hosts to complete a handshake
POLL = 0.3
_LOG_PREFIX = re.compile(r"^ERROR: \(\S+\) \S+ \S+ ")  # wireguard-go's: ERROR: (labwg0) 2026/11/26 00:21:48


@dataclass(frozen=True)
class HostOverlay:
    """One host's end of the overlay as its interface says: its address (with the prefix), MTU,
    public key, and each peer it has (the member it is, where known)."""

    host: str
    address: str
    mtu: int
    public_key: str
    peers: tuple[tuple[str, PeerState], ...]  # (the peer's host name, or its key's start), its state


def sidecar_name(topology: Topology, i: int) -> str:
    return f"{topology.lab}-wg-node{i}"


def endpoint(topology: Topology, i: int) -> str:
    """Where the other hosts reach host i: its external address across VPCs, else its own."""
    return topology.external(i) or topology.address(i)


def up(client: docker.DockerClient, topology: Topology, say: Say, subnet: str | None = None,
       mtu: int | None = None, port: int = wireguard.PORT) -> list[HostOverlay]:
    """Give every host of the lab an interface on the overlay (in place of the one it had), wait
    until every pair has completed a handshake, and return each host's end. On any failure every
    sidecar is removed, and with it every interface and key."""
    removed = down(client, topology)
    if removed:
        say(f"lab {topology.lab}: replacing its overlay")
    subnet = subnet or free_subnet(client, topology)
    network = ipaddress.ip_network(subnet)
    addresses = wireguard.member_addresses(subnet, topology.hosts)
    indices = list(topology.indices())
    try:
        keys = each(lambda i: _start(client, topology, i, subnet), indices)
        members = [Member(topology.name(i), endpoint(topology, i), addresses[k], keys[k], port)
                   for k, i in enumerate(indices)]
        if mtu is None:
            mtu = wireguard.overlay_mtu([m for i in indices for m in _path_mtus(client, topology, i, members)])
        each(lambda k: _sidecar_sh(client, topology, indices[k], wireguard.configure_script(
            members[k], [m for m in members if m is not members[k]], network.prefixlen, mtu, KEY_FILE)),
            range(len(indices)))
        say(f"lab {topology.lab}: {INTERFACE} on {subnet}, MTU {mtu}, UDP port {port}; waiting for every "
            f"pair's handshake")
        _wait_for_handshakes(client, topology, members)
        each(lambda i: helper.in_host(client, topology, i, wireguard.hosts_script(members)), indices)
        return show(client, topology)
    except BaseException:
        down(client, topology)
        raise


def down(client: docker.DockerClient, topology: Topology, say: Say | None = None) -> int:
    """Remove the lab's sidecars (their interfaces and keys go with them); how many there were."""
    sidecars = _sidecars(client, topology.lab)
    served = {s.labels.get(SHAPED_LABEL) for s in sidecars}
    each(lambda i: helper.in_host(client, topology, i, wireguard.hosts_script([])),
         [i for i in topology.indices() if topology.container(i) in served])
    for sidecar in sidecars:
        sidecar.remove(force=True)
        if say:
            say(f"{sidecar.labels.get(SHAPED_LABEL, sidecar.name)}: removed {INTERFACE} and its key "
                f"({sidecar.name})")
    return len(sidecars)


def show(client: docker.DockerClient, topology: Topology) -> list[HostOverlay]:
    """Each host's end of the overlay, as its interface says (hosts without one are left out)."""
    by_host = {s.labels.get(SHAPED_LABEL): s for s in _sidecars(client, topology.lab)}
    indices = [i for i in topology.indices() if topology.container(i) in by_host]
    ends = each(lambda i: _read_end(client, topology, i), indices)
    names = {end.public_key: end.host for end in ends}
    return [HostOverlay(end.host, end.address, end.mtu, end.public_key,
                        tuple(sorted((names.get(peer.public_key, peer.public_key[:8] + "..."), peer)
                                     for _, peer in end.peers)))
            for end in ends]


def free_subnet(client: docker.DockerClient, topology: Topology) -> str:
    """A /24 that no network of the engine, route of its host or other lab's overlay overlaps."""
    taken = engine_subnets(client) + host_routes() + [
        ipaddress.ip_network(c.labels[SUBNET_LABEL]) for c in lab_containers(client, None)
        if c.labels.get(ROLE) == ROLE_NAME and c.labels.get(SUBNET_LABEL)]
    return free_subnets((wireguard.DEFAULT_SUBNET,), taken)[0]


def inventory_text(topology: Topology, ends: Sequence[HostOverlay], written_at: Path, lab_paths: LabPaths) -> str:
    """The lab's inventory with each host's data plane on the overlay: its data_address the
    overlay's, network_interface the overlay's interface (so MASTER_ADDR and gloo use it)."""
    by_host = {end.host: end for end in ends}
    hosts: dict[str, dict[str, object]] = {}
    for i in topology.indices():
        end = by_host[topology.name(i)]
        hosts[topology.name(i)] = {"ansible_host": topology.address(i), "data_address": end.address.split("/")[0],
                                   "network_interface": INTERFACE, "overlay": topology.lab}
    text = lab_inventory(topology.lab, topology.slots, hosts, f"The container lab {topology.lab}'s hosts on its "
                         f"WireGuard overlay, written by `python -m lab net overlay up --name {topology.lab}`.",
                         shared=True)
    own = state_subdir(topology.lab)
    if written_at.resolve().parent != lab_paths.inventory.parent:  # the key paths are relative to the file
        text = text.replace(f": {own}/", f": {lab_paths.own}/")
    return text


# -- one host's sidecar -----------------------------------------------------------------------


def _sidecars(client: docker.DockerClient, lab: str) -> list[Container]:
    return [c for c in lab_containers(client, lab) if c.labels.get(ROLE) == ROLE_NAME]


def _start(client: docker.DockerClient, topology: Topology, i: int, subnet: str) -> str:
    """Start host i's sidecar and its wireguard-go, make the host's key there; its public key."""
    host = helper.running_host(client, topology, i)
    labels = {**topology.labels(ROLE_NAME), SHAPED_LABEL: host.name, SUBNET_LABEL: subnet}
    try:
        sidecar = client.containers.run(
            host.image.id, ["sh", "-c", f"{wireguard.USERSPACE_ENV} exec wireguard-go -f {INTERFACE}"],
            entrypoint=[], name=sidecar_name(topology, i), network_mode=f"container:{host.id}", cap_drop=["ALL"],
            cap_add=["NET_ADMIN"], devices=["/dev/net/tun:/dev/net/tun:rwm"], init=True, detach=True,
            labels=labels)
    except APIError as exc:
        raise EngineError(f"host {topology.name(i)}: cannot start its WireGuard sidecar: {reason(exc)}") from None
    deadline = time.monotonic() + START_WAIT
    while True:
        sidecar.reload()
        if sidecar.status != "running":
            there = helper.in_namespace(client, topology, i, f"ip -d -o link show {INTERFACE} 2>/dev/null || true")
            known = f" (an interface {INTERFACE} is there already, not WireGuard's)" if there.strip() else ""
            raise EngineError(f"host {topology.name(i)}: wireguard-go cannot start: {_last_line(sidecar)}{known}")
        code, _ = sidecar.exec_run(["wg", "show", INTERFACE, "listen-port"])
        if code == 0:
            break
        if time.monotonic() > deadline:
            raise EngineError(f"host {topology.name(i)}: wireguard-go made no {INTERFACE} within {START_WAIT:g}s: "
                              f"{_last_line(sidecar)}")
        time.sleep(POLL)
    return _sidecar_sh(client, topology, i, wireguard.keygen_script(KEY_FILE)).strip()


def _path_mtus(client: docker.DockerClient, topology: Topology, i: int, members: Sequence[Member]) -> list[int]:
    others = [m.endpoint for m in members if m.name != topology.name(i)] or [endpoint(topology, i)]
    out = _sidecar_sh(client, topology, i, wireguard.path_mtu_script(others))
    return [int(line) for line in out.split()]


def _read_end(client: docker.DockerClient, topology: Topology, i: int) -> HostOverlay:
    out = _sidecar_sh(client, topology, i, f"echo key $(wg show {INTERFACE} public-key) && "
                      f"echo address $(ip -o -4 address show dev {INTERFACE} | awk '{{print $4}}') && "
                      f"echo mtu $(cat /sys/class/net/{INTERFACE}/mtu) && {wireguard.show_script()}")
    fields = dict(line.partition(" ")[::2] for line in out.splitlines() if "\t" not in line)
    return HostOverlay(topology.name(i), fields.get("address", ""), int(fields.get("mtu") or 0), fields.get("key", ""),
                       tuple(("", peer) for peer in wireguard.parse_peers(out)))


def _sidecar_sh(client: docker.DockerClient, topology: Topology, i: int, script: str) -> str:
    """Run ``script`` in host i's sidecar; its output (else one line naming the host)."""
    try:
        sidecar = client.containers.get(sidecar_name(topology, i))
        code, out = sidecar.exec_run(["sh", "-c", script])
    except (APIError, NotFound) as exc:
        raise EngineError(f"host {topology.name(i)}: its WireGuard sidecar is gone ({reason(exc)}): "
                          f"run `python -m lab net overlay up --name {topology.lab}` again") from None
    text = bytes(out).decode("utf-8", "replace")
    if code != 0:
        lines = text.strip().splitlines()
        raise EngineError(f"host {topology.name(i)}: {lines[-1] if lines else 'exit ' + str(code)}")
    return text


def _last_line(sidecar: Container) -> str:
    """What wireguard-go last said (its error, where it gave one), without its banner's box."""
    lines = [line.strip() for line in bytes(sidecar.logs()).decode("utf-8", "replace").splitlines()
             if line.strip() and not any("\u2500" <= c <= "\u257f" for c in line)]
    errors = [_LOG_PREFIX.sub("", line) for line in lines if line.startswith("ERROR:")]
    if errors or lines:
        return (errors or lines)[-1]
    return f"it exited ({sidecar.attrs['State'].get('ExitCode')})"


# -- every pair's handshake -------------------------------------------------------------------


def _wait_for_handshakes(client: docker.DockerClient, topology: Topology, members: Sequence[Member]) -> None:
    """Wait until every host has completed a handshake with every other; else one line naming the
    host that reached no peer (or the pairs that did not meet)."""
    index = {m.name: i for i, m in zip(topology.indices(), members)}
    by_key = {m.public_key: m.name for m in members}
    deadline = time.monotonic() + HANDSHAKE_WAIT
    while True:
        dumps = each(lambda m: _sidecar_sh(client, topology, index[m.name], wireguard.show_script()), members)
        met = {(m.name, by_key.get(p.public_key, "")) for m, dump in zip(members, dumps)
               for p in wireguard.parse_peers(dump) if p.latest_handshake}
        missing = sorted({tuple(sorted((a.name, b.name))) for a in members for b in members
                          if a is not b and (a.name, b.name) not in met})
        if not missing:
            return
        if time.monotonic() > deadline:
            raise _no_handshake(missing, members)
        time.sleep(POLL)


def _no_handshake(missing: Sequence[tuple[str, ...]], members: Sequence[Member]) -> Exception:
    at = {m.name: f"{m.endpoint}:{m.port}" for m in members}
    alone = [m.name for m in members if sum(m.name in pair for pair in missing) == len(members) - 1]
    if len(members) > 2 and len(alone) == 1:
        name = alone[0]
        return HostUnreachable(name, f"host {name}: no WireGuard handshake with any peer within {HANDSHAKE_WAIT:g}s: "
                                     f"the others do not reach it at its endpoint {at[name]} (UDP), or it does not "
                                     f"reach them")
    pairs = "; ".join(f"{a} ({at[a]}) and {b} ({at[b]})" for a, b in missing)
    return EngineError(f"no WireGuard handshake within {HANDSHAKE_WAIT:g}s between {pairs}: UDP between them is "
                       f"blocked, or an endpoint is not where the other reaches it")
