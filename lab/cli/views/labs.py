"""What the lab commands show: each host of a lab and whether sshd answers (and its Slurm nodes),
the labs on the engine and across machines, the hosts' link shapes."""
from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from lab.cli.views.screen import say_line
from lab.containerlab.containers import LabSummary
from lab.containerlab.lifecycle import ACROSS_MACHINES_HINT, HostStatus
from lab.containerlab.shaping import Shape
from lab.containerlab.slurm import Health
from lab.containerlab.topology import DEFAULT_LAB, default_inventory
from lab.core.slurm import WORKING
from lab.errors import HostUnreachable
from lab.net.overlay import HostOverlay
from lab.net.wireguard import INTERFACE, STALE


def no_lab(lab: str) -> str:
    start = "`make lab-up`" if lab == DEFAULT_LAB else f"`python -m lab up --name {lab}`"
    return f"no lab named {lab} is running on this machine's engine; start one with {start} ({ACROSS_MACHINES_HINT})"


def print_hosts(console: Console, found: list[HostStatus]) -> None:
    table = Table("container", "hostname", "state", "addresses", "ssh")
    for h in found:
        table.add_row(h.container, h.hostname, h.state, ", ".join(h.addresses), _answers(h.ssh))
    console.print(table)


def print_hosts_across_machines(console: Console, lab: str, found: list[HostStatus],
                                lost: list[HostUnreachable]) -> None:
    table = Table("machine", "container", "state", "ssh at", "data address", "ssh")
    for h in found:
        table.add_row(h.machine, h.container, h.state, h.ssh_at, h.data_address, _answers(h.ssh))
    console.print(table if found else f"no host of lab {lab} on the machines that answered")
    print_problems(console, [str(error) for error in lost])


def print_slurm(console: Console, health: Health) -> None:
    """The lab's Slurm cluster: a row per node."""
    table = Table("slurm node", "state", "munge key")
    for node, same in health.keys.items():
        state = health.states.get(node, "?")
        table.add_row(node, Text(state, style="green" if state in WORKING else "red"),
                      Text({True: "the lab's", False: "another", None: "?"}[same],
                           style="green" if same else "red"))
    console.print(table)


def print_problems(console: Console, problems: list[str] | tuple[str, ...]) -> None:
    for problem in problems:
        say_line(console, f"lab: {problem}", style="red")


def print_labs(console: Console, found: list[LabSummary], across: dict[str, str]) -> None:
    """The labs on this machine's engine, and those across machines (name -> their machines file)."""
    if not found and not across:
        console.print("no lab is running; start one with `make lab-up` or `python -m lab up --name NAME`")
        return
    if found:
        table = Table("name", "topology", "scheduler", "hosts", "slots", "state", "subnets", "inventory")
        for lab in found:
            table.add_row(lab.name, lab.kind, lab.scheduler, str(lab.hosts), str(lab.slots),
                          Text(lab.state, style="green" if lab.state == "running" else "yellow"),
                          ", ".join(lab.subnets), default_inventory(lab.name))
        console.print(table)
    if across:
        table = Table("name", "machines", "inventory", title="labs across Docker machines (their state: "
                      "`python -m lab status --name NAME`)", title_justify="left")
        for name, machines in sorted(across.items()):
            table.add_row(name, machines, default_inventory(name))
        console.print(table)


def print_shapes(shapes: dict[str, Shape | None]) -> None:
    for host, shape in shapes.items():
        print(f"{host}: {shape or 'none'}")


def print_overlay(console: Console, ends: Sequence[HostOverlay]) -> None:
    """A row per host and peer: the host's overlay address and MTU, the peer's endpoint, the age
    of their last handshake and the bytes each way."""
    if not ends:
        return
    table = Table(box=None, pad_edge=False)
    for column in ("host", INTERFACE, "mtu", "peer", "endpoint", "handshake", "received", "sent"):
        table.add_column(column, justify="right" if column in ("mtu", "received", "sent") else "left",
                         overflow="fold")
    now = time.time()
    for end in ends:
        first = True
        for name, peer in end.peers or (("", None),):
            row = [end.host, end.address, str(end.mtu)] if first else ["", "", ""]
            first = False
            if peer is None:
                table.add_row(*row, Text("no peers", style="red"), "", "", "", "")
                continue
            age = peer.age(now)
            handshake = (Text("never", style="red") if age is None else
                         Text(f"{age:.0f}s ago", style="red" if age > STALE else "green"))
            table.add_row(*row, name, peer.endpoint, handshake, _bytes(peer.received), _bytes(peer.sent))
    console.print(table)


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def _answers(ssh: bool) -> Text:
    return Text("answers", style="green") if ssh else Text("no answer", style="red")
