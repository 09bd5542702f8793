"""The cross-VPC wiring: a NAT gateway between two private networks and an "internet".

As with cloud VMs in two VPCs: each host knows only its private address; its external
address lives on the gateway, which translates 1:1 (DNAT in, SNAT out, hairpin included).
Without peering, the gateway drops traffic between the private ranges that it did not
translate, so a peer is reachable only at its external address. Peering allows it.

Only the gateway has NET_ADMIN. The hosts stay unprivileged: their default route is set
by a short-lived helper container that joins a host's network namespace.

The netfilter trap (../shared/ENVIRONMENT.md): with bridge netfilter on, the engine's host
tracks the bridged legs of the translated flows and breaks them; a raw-table NOTRACK
rule per lab bridge fixes it, and ``untrack_bridge(remove=True)`` takes it away again.
"""
from __future__ import annotations

import logging
import shlex
import shutil
import subprocess

import docker
from docker.errors import NotFound
from docker.models.containers import Container
from docker.models.networks import Network

from lab.containerlab import helper
from lab.containerlab.engine import EngineError, Say
from lab.containerlab.topology import GATEWAY_HOST, Topology

log = logging.getLogger(__name__)


def untrack_bridge(net: Network, remove: bool = False) -> None:
    """Add (or remove) the engine host's NOTRACK rule for a lab network's bridge."""
    iptables = shutil.which("iptables") or shutil.which("iptables", path="/usr/sbin:/sbin")
    if iptables is None:
        if not remove:
            raise EngineError("iptables is missing on the engine's host (Debian: apt-get install iptables)")
        return
    rule = ["PREROUTING", "-i", f"br-{net.id[:12]}", "-j", "NOTRACK"]

    def iptables_raw(action: str) -> bool:
        return subprocess.run([iptables, "-t", "raw", action, *rule], capture_output=True,
                              timeout=30).returncode == 0

    if remove:
        while iptables_raw("-D"):
            pass
    elif not iptables_raw("-C") and not iptables_raw("-I"):
        raise EngineError(f"cannot add the NOTRACK rule for {net.name} (iptables -t raw -I {' '.join(rule)})")


def start_gateway(client: docker.DockerClient, topology: Topology, image: str, peering: bool, say: Say) -> Container:
    """The NAT gateway on all three networks at .2, configured for ``topology``."""
    name = topology.gateway_container
    try:
        client.containers.get(name).remove(force=True)
    except NotFound:
        pass
    say(f"starting {name}, the NAT gateway (the only container with NET_ADMIN)")
    nets = topology.networks()
    host_config = client.api.create_host_config(
        cap_add=["NET_ADMIN"], init=True,
        sysctls={"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "0"})
    first = nets[0]
    created = client.api.create_container(
        image, name=name, hostname="gateway", command=["sleep", "infinity"], detach=True,
        labels=topology.labels("gateway"), host_config=host_config,
        networking_config=client.api.create_networking_config(
            {first.name: client.api.create_endpoint_config(ipv4_address=first.at(GATEWAY_HOST))}))
    for net in nets[1:]:
        client.api.connect_container_to_network(created["Id"], net.name, ipv4_address=net.at(GATEWAY_HOST))
    client.api.start(created["Id"])
    gateway = client.containers.get(name)
    _gateway_sh(gateway, nat_script(topology))
    set_peering(client, topology, peering)
    for net in nets:
        untrack_bridge(client.networks.get(net.name))
    return gateway


def route_hosts_through_gateway(client: docker.DockerClient, topology: Topology, image: str) -> None:
    """Each host's default route -> its network's gateway, set from a helper container that
    joins the host's network namespace (the host itself gets no NET_ADMIN)."""
    for i in topology.indices():
        helper.in_namespace(client, topology, i, f"ip route replace default via {topology.network(i).at(GATEWAY_HOST)}",
                            image)


def nat_script(topology: Topology) -> str:
    """Shell for the gateway: the external addresses, and 1:1 NAT for every host."""
    lines = ["set -e",
             f"inet=$(ip -o -4 addr show | awk '$4 ~ /^{topology.networks()[2].at(GATEWAY_HOST)}\\// {{print $2}}')",
             "iptables -t nat -F"]
    for i in topology.indices():
        private, external = topology.address(i), topology.external(i)
        assert external is not None
        lines += [
            f"ip addr replace {external}/24 dev $inet",
            f"iptables -t nat -A PREROUTING -d {external} -j DNAT --to-destination {private}",
            # a translated flow (a peer, or the host itself: hairpin) sees the external source
            f"iptables -t nat -A POSTROUTING -s {private} -m conntrack --ctstate DNAT -j SNAT --to-source {external}",
            f"iptables -t nat -A POSTROUTING -s {private} -o $inet -j SNAT --to-source {external}",
        ]
    return "\n".join(lines)


def set_peering(client: docker.DockerClient, topology: Topology, on: bool) -> None:
    """Peering off: the gateway drops untranslated traffic between the private ranges."""
    gateway = _gateway(client, topology)
    vpc_a, vpc_b, _ = topology.networks()
    script = ["iptables -F FORWARD"]
    if not on:
        for a, b in ((vpc_a, vpc_b), (vpc_b, vpc_a)):
            script.append(f"iptables -A FORWARD -s {a.subnet} -d {b.subnet} "
                          f"-m conntrack ! --ctstate DNAT -j DROP")
    _gateway_sh(gateway, "\n".join(script))


def peering(client: docker.DockerClient, topology: Topology) -> bool:
    """Whether the private networks are peered now."""
    return "DROP" not in _gateway_sh(_gateway(client, topology), "iptables -S FORWARD")


def _gateway(client: docker.DockerClient, topology: Topology) -> Container:
    if topology.kind != "cross-vpc":
        raise EngineError(f"lab {topology.lab} is {topology.kind}, not cross-vpc: it has no gateway "
                          "(start one with `python -m lab up --topology cross-vpc`)")
    try:
        return client.containers.get(topology.gateway_container)
    except NotFound:
        raise EngineError(f"lab {topology.lab} has no gateway {topology.gateway_container}: "
                          "run `python -m lab up --topology cross-vpc` again") from None


def _gateway_sh(gateway: Container, script: str) -> str:
    code, out = gateway.exec_run(["sh", "-c", script])
    text = bytes(out).decode("utf-8", "replace")
    if code != 0:
        raise EngineError(f"the gateway could not run {shlex.quote(script.splitlines()[-1])}: {text.strip()[-200:]}")
    return text
