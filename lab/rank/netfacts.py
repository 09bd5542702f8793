"""What a host knows about its network, as the probe reports it and the doctor reads it:
the data types of the probe's events, and the pure functions that derive facts from them
(which address each backend will advertise, which interface holds an address).

Both sides use it: it travels to the hosts with the probe (standard library only, nothing
of the controller's) and the doctor imports it for the types, not the probe program.
"""
from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

GLOO_LOOPBACK = "127.0.0.1"  # gloo's fallback when the hostname gives no usable address


@dataclass(frozen=True)
class Interface:
    """A network interface and its addresses, IPv4 first (the order getifaddrs lists them)."""

    name: str
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class Advertised:
    """The address a backend tells its peers on this host, the interface it is on, and why."""

    address: str | None
    interface: str | None
    how: str  # "GLOO_SOCKET_IFNAME=eth1", "hostname node2 resolves to it", ...
    error: str | None = None  # the backend cannot start (no such interface, no address)


@dataclass(frozen=True)
class Lookup:
    """One timed name lookup: forward (a name -> addresses) or reverse (an address -> name)."""

    query: str
    answer: tuple[str, ...]
    seconds: float
    error: str | None = None  # None: it answered


@dataclass(frozen=True)
class Target:
    """A listener to connect to: whose (``peer``), at which address, and why (``kind``:
    ``master`` MASTER_ADDR, ``mesh`` the peer's advertised address, ``data`` its data_address)."""

    kind: Literal["master", "mesh", "data"]
    peer: str
    address: str
    port: int


# "slow": the connection was made, but the peer did not answer it in time (a busy host, not a network fault)
LinkFailure = Literal["refused", "timeout", "unreachable", "resolve", "wrong-host", "no-probe", "slow", "error"]


@dataclass(frozen=True)
class Link:
    """The outcome of connecting to one target."""

    target: Target
    ok: bool
    seconds: float
    failure: LinkFailure | None = None
    error: str | None = None  # one line for a person
    seen: str | None = None  # this host's address as the listener saw it
    answered_by: str | None = None
    peer_ip: str | None = None  # the address actually connected to (MASTER_ADDR may be a name)
    large_error: str | None = None  # connected, but a large message did not get through: what happened
    large_acked: int | None = None  # of that message, the bytes the peer acknowledged (None: unknown)
    large_resent: int | None = None  # the segments of it the kernel sent again, unacknowledged (None: unknown)

    @property
    def reached(self) -> bool:
        """Whether the network carried the connection: it was answered, or made to a peer too busy to
        answer in time (which the network is not to blame for)."""
        return self.ok or self.failure == "slow"


# -- what the backends will do --------------------------------------------------------


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(plain_address(address)).is_loopback
    except ValueError:
        return False


def plain_address(address: str) -> str:
    """``::ffff:10.0.0.1`` (an IPv4 peer on a dual-stack socket) -> ``10.0.0.1``; the zone dropped."""
    address = address.split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def family(address: str) -> str | None:
    """``IPv4`` or ``IPv6`` for an address literal; None for a name."""
    try:
        return f"IPv{ipaddress.ip_address(plain_address(address)).version}"
    except ValueError:
        return None


def owner(address: str, interfaces: Sequence[Interface]) -> str | None:
    """The interface that holds ``address`` (any loopback address: the loopback interface)."""
    for interface in interfaces:
        if address in interface.addresses:
            return interface.name
    if is_loopback(address):
        return next((i.name for i in interfaces if any(is_loopback(a) for a in i.addresses)), None)
    return None


def gloo_address(ifname: str | None, hostname: str, resolved: Sequence[str], interfaces: Sequence[Interface],
                 can_bind: Callable[[str], bool]) -> Advertised:
    """What gloo advertises (ProcessGroupGloo's device): with GLOO_SOCKET_IFNAME (a comma list:
    one device each), the first address of the first interface named; else the first
    address the hostname resolves to that can be bound; else 127.0.0.1."""
    if ifname:
        by_name = {i.name: i for i in interfaces}
        names = [n.strip() for n in ifname.split(",") if n.strip()]
        how = f"GLOO_SOCKET_IFNAME={ifname}"
        missing = [n for n in names if n not in by_name]
        if missing:
            return Advertised(None, missing[0], how, f"there is no interface {missing[0]}")
        first = by_name[names[0]]
        if not first.addresses:
            return Advertised(None, first.name, how, f"interface {first.name} has no address")
        return Advertised(first.addresses[0], first.name, how)
    for address in resolved:
        if can_bind(address):
            return Advertised(address, owner(address, interfaces), f"hostname {hostname} resolves to it")
    return Advertised(GLOO_LOOPBACK, owner(GLOO_LOOPBACK, interfaces),
                      f"fallback: hostname {hostname} resolves to no address of this host")


def nccl_address(ifname: str | None, interfaces: Sequence[Interface]) -> Advertised:
    """What NCCL's socket bootstrap advertises: the first address of the first interface
    NCCL_SOCKET_IFNAME selects (prefixes; ``^`` excludes, ``=`` matches exactly); without
    it ib* first, then anything but docker* and lo, then docker*, then lo."""
    usable = [i for i in interfaces if i.addresses]
    if ifname:
        chosen = [i for i in usable if _nccl_selects(ifname, i.name)]
        how = f"NCCL_SOCKET_IFNAME={ifname}"
        if not chosen:
            return Advertised(None, None, how, f"NCCL_SOCKET_IFNAME={ifname} selects no interface with an address")
    else:
        how = "NCCL's default choice"
        chosen = []
        for spec in ("ib", "^docker,lo", "docker", "lo"):
            chosen = [i for i in usable if _nccl_selects(spec, i.name)]
            if chosen:
                break
        if not chosen:
            return Advertised(None, None, how, "no interface has an address")
    return Advertised(chosen[0].addresses[0], chosen[0].name, how)


def _nccl_selects(spec: str, name: str) -> bool:
    exclude = spec.startswith("^")
    body = spec.removeprefix("^")
    exact = body.startswith("=")
    prefixes = [p for p in body.removeprefix("=").split(",") if p]
    matched = any(name == p if exact else name.startswith(p) for p in prefixes)
    return matched != exclude


def parse_ip_json(text: str | bytes) -> list[Interface]:
    """Interfaces from ``ip -j addr``, IPv4 addresses before IPv6 ones."""
    found = []
    for entry in json.loads(text):
        infos = [a for a in entry.get("addr_info", []) if a.get("family") in ("inet", "inet6") and a.get("local")]
        infos.sort(key=lambda a: a["family"] != "inet")
        found.append(Interface(entry["ifname"], tuple(a["local"] for a in infos)))
    return found


def parse_if_inet6(text: str) -> dict[str, list[str]]:
    """Interface name -> IPv6 addresses, from /proc/net/if_inet6."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 6:
            found.setdefault(fields[5], []).append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found
