"""Which transport reaches a host: ``transport_for`` picks one from the host's ``connection``;
``with_master_address`` asks rank 0's host for the address its peers reach it at, when the inventory
gives none.
"""
from __future__ import annotations

import ipaddress
import logging
from dataclasses import replace

from lab.inventory.model import Host, Inventory
from lab.transport.base import Transport
from lab.transport.local import LocalTransport
from lab.transport.slurm import SlurmTransport
from lab.transport.ssh.settings import SSHSettings

log = logging.getLogger(__name__)


def with_master_address(inventory: Inventory, ssh: SSHSettings | None = None) -> Inventory:
    """The inventory with rank 0's data-plane address filled in, asked of the host itself,
    when the inventory gives none and names the host by a name its peers may not resolve
    (an ssh-config alias, say). MASTER_ADDR is that address."""
    host = inventory.hosts[0] if inventory.hosts else None
    if host is None or host.is_local or host.data_address or _is_ip(host.address):
        return inventory
    transport = transport_for(host, ssh)
    try:
        found = transport.own_address()
    finally:
        transport.close()
    if not found:
        return inventory
    log.info("host %s: MASTER_ADDR is its address %s (asked of the host)", host.name, found)
    return Inventory(inventory.path, (replace(host, data_address=found), *inventory.hosts[1:]))


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def transport_for(host: Host, ssh: SSHSettings | None = None) -> Transport:
    """The transport that reaches ``host`` (``ssh`` settings apply to SSH hosts)."""
    if host.connection == "local":
        return LocalTransport(host)
    if host.connection == "docker":
        # (imported here: the Docker SDK is a fifth of the CLI's start)
        from lab.transport.docker.transport import DockerTransport

        return DockerTransport(host)
    if host.connection == "slurm":
        return SlurmTransport(host)
    from lab.transport.ssh.transport import SSHTransport  # (here: paramiko is a quarter of the CLI's start)

    return SSHTransport(host, ssh or SSHSettings())
