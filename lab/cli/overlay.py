"""``lab net overlay up / down / show``: a WireGuard mesh across a container lab's hosts (``--name``),
or across hosts reached over SSH (``--hosts``), and the inventory that runs on it."""
from __future__ import annotations

import argparse
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lab.cli.common import Commands, Parser
from lab.cli.views import labs as views
from lab.cli.views import screen
from lab.containerlab import containers, engine, state
from lab.containerlab import overlay as lab_overlay
from lab.containerlab.topology import LabPaths
from lab.errors import ExitCode, UsageError
from lab.inventory.hosts import load_inventory
from lab.net import overlay_hosts, wireguard
from lab.net.overlay import HostOverlay, Say
from lab.transport.ssh.settings import SSHSettings


def add_overlay(net_commands: Commands) -> tuple[argparse.ArgumentParser, ...]:
    """``net overlay`` and its commands (returned: the lab's --name is accepted after each)."""
    overlay = net_commands.add_parser(
        "overlay", help="join the hosts with an encrypted WireGuard mesh and write an inventory that runs on it",
        description="The third way across two VPCs, beside peering them: every host gets a WireGuard interface "
                    f"({wireguard.INTERFACE}) with an address on an overlay /24 of its own, a key made on the host, "
                    "each peer's endpoint the address the others reach it at (across VPCs: its NAT'd one), a "
                    "persistent keepalive for the NAT, and an MTU under the path's. A container lab's hosts (--name) "
                    "stay unprivileged: a sidecar with NET_ADMIN beside each runs wireguard-go. Hosts reached over "
                    "SSH (--hosts) are set up as root (logged in as root, or sudo -n where ansible_become is true): "
                    "the kernel's WireGuard where it has it, else wireguard-go.")
    what = overlay.add_subparsers(dest="overlay_command", required=True, metavar="WHAT", parser_class=Parser)
    up = what.add_parser("up", help="make the overlay (in place of the one there was), wait for every pair's "
                                    "handshake, write its inventory")
    up.add_argument("--inventory", metavar="FILE", help="where to write the overlay's inventory, whose hosts' "
                    "data_address and network_interface are the overlay's (default: NAME.overlay.inventory.yaml "
                    "beside the lab's own; with --hosts, STEM.overlay.yaml beside INVENTORY)")
    up.add_argument("--subnet", metavar="CIDR", type=_overlay_subnet, help="the overlay's /24 (default: a free one, "
                    f"{wireguard.DEFAULT_SUBNET} first)")
    up.add_argument("--mtu", type=int, metavar="BYTES", help=f"the interfaces' MTU (default: the path's less "
                    f"{wireguard.OVERHEAD}, WireGuard's overhead)")
    up.add_argument("--port", type=int, default=wireguard.PORT, metavar="PORT",
                    help=f"the UDP port every host listens on (default {wireguard.PORT})")
    down = what.add_parser("down", help="remove every interface, key and process the overlay made")
    show = what.add_parser("show", help="each host's interface, and per peer its endpoint, last handshake and bytes "
                                        "moved")
    for parser in (up, down, show):
        parser.add_argument("--hosts", metavar="INVENTORY", help="hosts reached over SSH (VMs) in place of a "
                            "container lab's")
        parser.add_argument("--accept-new-host-keys", action="store_true",
                            help="--hosts: trust and record a host key seen for the first time")
    return overlay, up, down, show


def _overlay_subnet(text: str) -> str:
    try:
        network = ipaddress.ip_network(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a network (10.77.0.0/24)") from None
    if network.version != 4 or network.prefixlen > 24 or not network.is_private:
        raise argparse.ArgumentTypeError(f"{text}: the overlay needs a private IPv4 network of a /24 or more")
    return str(network)


@dataclass(frozen=True)
class _Place:
    """Where the overlay is made: a container lab's hosts or an inventory's, and what each step is there."""

    where: str
    up: Callable[[Say], tuple[list[HostOverlay], Path]]  # the hosts' ends, and the inventory written
    down: Callable[[Say], int]
    show: Callable[[], list[HostOverlay]]


def _on_hosts(args: argparse.Namespace) -> _Place:
    inventory = load_inventory(args.hosts)
    settings = SSHSettings(accept_new_host_keys=args.accept_new_host_keys)

    def up(say: Say) -> tuple[list[HostOverlay], Path]:
        source = Path(args.hosts)
        written = Path(args.inventory or source.with_name(f"{source.stem}.overlay{source.suffix or '.yaml'}"))
        return overlay_hosts.up(inventory, settings, written, say, args.subnet, args.mtu, args.port), written

    return _Place(f"the hosts of {args.hosts}", up, lambda say: overlay_hosts.down(inventory, settings, say),
                  lambda: overlay_hosts.show(inventory, settings))


def _on_lab(args: argparse.Namespace) -> _Place:
    client = engine.client()
    topology = containers.running_topology(client, args.name)

    def up(say: Say) -> tuple[list[HostOverlay], Path]:
        written = Path(args.inventory or f"{args.name}.overlay.inventory.yaml")
        if not state.check_file(LabPaths(written, args.name).key):
            raise UsageError(f"lab {args.name} has no key in {state.lab_dir(args.name)}: was it made on this "
                             "machine, by this user (`python -m lab up --name NAME`)?")
        ends = lab_overlay.up(client, topology, say, args.subnet, args.mtu, args.port)
        written.write_text(lab_overlay.inventory_text(topology, ends))
        return ends, written

    return _Place(f"lab {args.name}", up, lambda say: lab_overlay.down(client, topology, say),
                  lambda: lab_overlay.show(client, topology))


def cmd_overlay(args: argparse.Namespace) -> int:
    if args.overlay_command == "up" and args.mtu is not None and not wireguard.MIN_MTU <= args.mtu <= 9000:
        raise UsageError(f"--mtu {args.mtu}: from {wireguard.MIN_MTU} to 9000")
    if args.overlay_command == "up" and not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a UDP port, from 1 to 65535")
    console = screen.console()
    say = screen.sayer(console)
    place = _on_hosts(args) if args.hosts else _on_lab(args)
    if args.overlay_command == "down":
        if not place.down(say):
            say(f"{place.where}: no overlay to take down")
        return ExitCode.OK
    if args.overlay_command == "up":
        ends, written = place.up(say)
        views.print_overlay(console, ends)
        say(f"wrote {written}: run on the overlay with `python -m lab run all --hosts {written}`")
        return ExitCode.OK
    ends = place.show()
    if not ends:
        say(f"{place.where}: no overlay (`python -m lab net overlay up` makes one)")
    views.print_overlay(console, ends)
    return ExitCode.OK


