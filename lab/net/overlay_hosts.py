"""``lab net overlay up / down / show --hosts INVENTORY``: the WireGuard mesh on hosts reached over SSH
(VMs), each set up as root: logged in as root, or with ``sudo -n`` where the inventory says
``ansible_become: true``. The kernel's WireGuard where the host has it, else wireguard-go (installed
with apt-get where it can be); the key in /run/lab-wg (root's only), never read back but for its
public half. ``down`` deletes the interface (wireguard-go ends with it), the key and the /etc/hosts
lines.
"""
from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from lab.errors import LabError, UsageError
from lab.inventory.hosts import inventory_text
from lab.inventory.model import Host, Inventory
from lab.net import overlay, wireguard
from lab.net.overlay import End, HostOverlay, Say
from lab.net.subnets import Subnet, free_subnets, routes_in
from lab.transport.ssh.settings import SSHSettings
from lab.transport.ssh.transport import SSHTransport

ROUTES = "ip -j -4 route"


class SSHHost(End):
    """A host's end over SSH: root's shell is the login's (root) or ``sudo -n``'s."""

    def __init__(self, host: Host, settings: SSHSettings) -> None:
        super().__init__(host.name, host.peer_address)
        self.host = host
        self.ssh = SSHTransport(host, settings)

    def run(self, command: str) -> tuple[int, str]:
        return self.ssh.run(self.ssh.connection(), command)

    def sh(self, script: str) -> str:
        status, out = self._as_root(script)
        if status != 0:
            raise self._failed(status, out)
        return out

    def start(self) -> None:
        status, out = self._as_root(wireguard.host_start_script())
        if status == wireguard.WIREGUARD_GO_FAILED:
            raise LabError(f"host {self.name}: wireguard-go cannot start: {wireguard.wireguard_go_said(out)}")
        if status != 0:
            raise self._failed(status, out)

    def _failed(self, status: int, out: str) -> LabError:
        lines = out.strip().splitlines()
        last = lines[-1] if lines else f"exit {status}"
        hint = " (ansible_become needs passwordless sudo)" if "sudo:" in last and "password" in last else ""
        return LabError(f"host {self.name}: {last}{hint}")

    def _as_root(self, script: str) -> tuple[int, str]:
        command = f"sh -c {shlex.quote(script)}"
        if self.host.user != "root":
            if not self.host.become:
                raise LabError(f"host {self.name}: WireGuard needs root there: log in as root, or set "
                               f"ansible_become: true (passwordless sudo)")
            command = f"sudo -n {command}"
        return self.run(command)

    def set_hosts(self, script: str) -> None:
        self.sh(script)

    def remove(self) -> bool:
        return self.sh(wireguard.host_remove_script()).strip().endswith("1")

    def routes(self) -> list[Subnet]:
        status, out = self.run(ROUTES)
        return routes_in(out, but_dev=wireguard.INTERFACE) if status == 0 else []  # (its own: it is replaced)

    def close(self) -> None:
        self.ssh.close()


def ends(inventory: Inventory, settings: SSHSettings) -> list[SSHHost]:
    """An end for every host; one line for a host the overlay cannot be made on."""
    wrong = [h for h in inventory.hosts if h.connection != "ssh"]
    if wrong:
        raise UsageError(f"{inventory.path}: host {wrong[0].name} is reached by {wrong[0].connection}: "
                         f"`lab net overlay --hosts` sets up hosts reached over SSH (a container lab's: --name)")
    return [SSHHost(host, settings) for host in inventory.hosts]


def up(inventory: Inventory, settings: SSHSettings, written: Path, say: Say, subnet: str | None = None,
       mtu: int | None = None, port: int = wireguard.PORT) -> list[HostOverlay]:
    """The hosts on an overlay (a /24 that none of them routes to already, unless given), and the
    inventory that runs on it written to ``written``."""
    found = ends(inventory, settings)
    try:
        if subnet is None:
            taken = [route for routes in overlay.on_each(found, SSHHost.routes) for route in routes]
            subnet = free_subnets((wireguard.DEFAULT_SUBNET,), taken)[0]
        made = overlay.up(found, subnet, say, mtu, port)
    finally:
        _close(found)
    by_host = {end.host: end.address.split("/")[0] for end in made}
    written.write_text(inventory_text(inventory.hosts, f"{inventory.path}'s hosts on their WireGuard overlay, "
                                      f"written by `python -m lab net overlay up --hosts {inventory.path}`",
                                      {h.name: {"data_address": by_host[h.name],
                                                "network_interface": wireguard.INTERFACE} for h in inventory.hosts}))
    return made


def down(inventory: Inventory, settings: SSHSettings, say: Say) -> int:
    found = ends(inventory, settings)
    try:
        return overlay.down(found, say)
    finally:
        _close(found)


def show(inventory: Inventory, settings: SSHSettings) -> list[HostOverlay]:
    found = ends(inventory, settings)
    try:
        return overlay.show(found)
    finally:
        _close(found)


def _close(found: Sequence[SSHHost]) -> None:
    for end in found:
        end.close()
