"""The doctor on hosts whose data plane is a lab's WireGuard overlay (the inventory `lab net overlay up`
writes names it: ``overlay``): the overlay as its interfaces say, one finding per host (its interface,
address, MTU, and each peer's last handshake), and an error where a host has no interface or a peer
no recent handshake. The hosts cannot say it themselves (reading an interface's peers takes root);
the lab's engine can.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

from lab.inventory.model import Host
from lab.net.overlay import HostOverlay
from lab.net.wireguard import INTERFACE, STALE
from lab.netcheck.model import Finding

UP_FIX = "run `python -m lab net overlay up --name {lab}` (and run on the inventory it writes)"


def overlay_findings(hosts: Sequence[Host]) -> list[Finding]:
    """What the overlays the hosts name say of them (none when no host names one)."""
    labs = sorted({h.overlay for h in hosts if h.overlay})
    if not labs:
        return []
    # (the lab's engine, and with it the Docker SDK, only where a host names an overlay: a tenth of a
    # second of every command that may diagnose, else)
    from lab.containerlab import containers, engine, overlay
    from lab.containerlab.engine import EngineError

    found: list[Finding] = []
    for lab in labs:
        try:
            client = engine.client()
            ends = overlay.show(client, containers.running_topology(client, lab))
        except EngineError as exc:
            found.append(Finding("error", "overlay", "cluster", f"the overlay of lab {lab} cannot be read: {exc}",
                                 "the inventory says the hosts' data plane is that lab's overlay",
                                 UP_FIX.format(lab=lab)))
            continue
        found += _host_findings([h for h in hosts if h.overlay == lab], lab, {end.host: end for end in ends})
    return found


def _host_findings(hosts: Sequence[Host], lab: str, ends: dict[str, HostOverlay]) -> list[Finding]:
    found = []
    now = time.time()
    for host in hosts:
        end = ends.get(host.name)
        if end is None:
            found.append(Finding("error", "overlay", host.name, f"{host.name} has no {INTERFACE}: lab {lab}'s overlay "
                                 f"is down there, and its data address {host.data_address} leads nowhere",
                                 "the overlay was taken down (or the host made anew) after its inventory was "
                                 "written", UP_FIX.format(lab=lab)))
            continue
        handshakes = []
        stale = []
        for name, peer in end.peers:
            age = peer.age(now)
            handshakes.append(f"{name} {'never' if age is None else f'{age:.0f}s ago'}")
            if age is None or age > STALE:
                stale.append(name)
        found.append(Finding("info", "overlay", host.name, f"{INTERFACE} {end.address} MTU {end.mtu} (lab {lab}'s "
                             f"WireGuard overlay); last handshake with {', '.join(handshakes) or 'no peer'}"))
        if stale:
            found.append(Finding("error", "overlay", host.name, f"{host.name} has had no WireGuard handshake with "
                                 f"{', '.join(stale)} for {STALE:g}s or more",
                                 "the peers do not reach each other at their endpoints (UDP), or a peer's "
                                 "interface was made anew with another key", UP_FIX.format(lab=lab)))
    return found
