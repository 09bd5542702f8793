"""A WireGuard mesh across hosts, whatever holds root in each host's network namespace: the steps of
``lab net overlay up``, ``down`` and ``show`` over :class:`End` s, one per host.

An end is where a host's root shell runs: a sidecar container beside a container lab's host
(:mod:`lab.containerlab.overlay`), or the host itself over SSH with the privilege escalation its
inventory names (:mod:`lab.net.overlay_hosts`). The steps are the same: make the interface, make
the key there, find the paths' MTU, give every end its peers, wait for every pair's handshake,
name the overlay's addresses in /etc/hosts. A failure at any step takes down what was made, on
every end, before it is raised. What the overlay is, is read from the interfaces themselves
(``wg show``, their address and MTU), never from a record that could disagree with them.
"""
from __future__ import annotations

import ipaddress
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from lab.errors import HostUnreachable, LabError
from lab.net import wireguard
from lab.net.wireguard import INTERFACE, Member, PeerState
from lab.transport.base import for_each_host

HANDSHAKE_WAIT = 20.0  # seconds for every pair of hosts to complete a handshake
POLL = 0.3
Say = Callable[[str], None]
Result = TypeVar("Result")


class End(ABC):
    """One host's end of the mesh: its name, where the others reach it, and root's shell in its
    network namespace. Every method raises a LabError naming the host."""

    def __init__(self, name: str, endpoint: str) -> None:
        self.name, self.endpoint = name, endpoint

    @abstractmethod
    def start(self) -> None:
        """Make the interface (none of the lab's is there: :meth:`remove` ran)."""

    @abstractmethod
    def sh(self, script: str) -> str:
        """Run ``script`` as root in the host's network namespace; its output."""

    @abstractmethod
    def set_hosts(self, script: str) -> None:
        """Run ``script`` as root where the host's /etc/hosts is (see wireguard.hosts_script)."""

    @abstractmethod
    def remove(self) -> bool:
        """Take away the interface, its key and process, and the /etc/hosts lines; whether there was one."""

    @property
    def key_file(self) -> str:
        return wireguard.KEY_FILE


EndT = TypeVar("EndT", bound=End)


@dataclass(frozen=True)
class HostOverlay:
    """One host's end of the overlay as its interface says: its address (with the prefix), MTU,
    public key, and each peer it has (the member it is, where known)."""

    host: str
    address: str
    mtu: int
    public_key: str
    peers: tuple[tuple[str, PeerState], ...]  # (the peer's host name, or its key's start), its state


def on_each(ends: Sequence[EndT], action: Callable[[EndT], Result]) -> list[Result]:
    """``action`` on every end at once; the results in order, or the first failure once all ended."""
    outcomes = for_each_host({end.name: end for end in ends}, action)
    failed = next((o for o in outcomes.values() if isinstance(o, Exception)), None)
    if failed is not None:
        raise failed
    return [outcomes[end.name] for end in ends]  # type: ignore[misc]


def up(ends: Sequence[End], subnet: str, say: Say, mtu: int | None = None,
       port: int = wireguard.PORT) -> list[HostOverlay]:
    """Give every host an interface on the overlay ``subnet`` (in place of the one it had), wait
    until every pair has completed a handshake, and return each host's end as its interface says.
    On any failure (or an interrupt) everything made is taken down first."""
    if any(on_each(ends, lambda end: end.remove())):
        say(f"replacing the overlay on {', '.join(end.name for end in ends)}")
    network = ipaddress.ip_network(subnet)
    addresses = wireguard.member_addresses(subnet, len(ends))
    try:
        on_each(ends, lambda end: end.start())
        keys = on_each(ends, public_key)
        members = [Member(end.name, end.endpoint, address, key, port) for end, address, key in zip(ends, addresses,
                                                                                                   keys)]
        chosen = mtu if mtu is not None else wireguard.overlay_mtu(
            [found for mtus in on_each(ends, lambda end: _path_mtus(end, members)) for found in mtus])
        on_each(ends, lambda end: end.sh(wireguard.configure_script(
            _member(members, end), [m for m in members if m.name != end.name], network.prefixlen, chosen,
            end.key_file)))
        say(f"{INTERFACE} on {subnet}, MTU {chosen}, UDP port {port}; waiting for every pair's handshake")
        _wait_for_handshakes(ends, members)
        on_each(ends, lambda end: end.set_hosts(wireguard.hosts_script(members)))
        made = show(ends)
        unread = [end.name for end in ends if end.name not in {found.host for found in made}]
        if unread:
            raise LabError(f"host {unread[0]}: its {INTERFACE} could not be read once it was up "
                           f"(`wg show {INTERFACE}` said no public key {KEY_READS} times)")
        return made
    except BaseException:
        on_each(ends, lambda end: end.remove())
        raise


PUBLIC_KEY = re.compile(r"[A-Za-z0-9+/]{43}=")  # a WireGuard key, as wg prints it (32 bytes in base64)
KEY_READS = 3  # an engine's exec can lose a short command's output (docker-py #2042, moby #27289): read again


def _said_with_key(end: End, script: str, key_of: Callable[[str], str]) -> str:
    """What ``script`` printed on the end, read again (KEY_READS at most) while the key ``key_of``
    finds in it is not a WireGuard key: the last it said."""
    said = ""
    for _ in range(KEY_READS):
        said = end.sh(script)
        if PUBLIC_KEY.fullmatch(key_of(said)):
            break
    return said


def public_key(end: End) -> str:
    """The end's public key (its private key made on the first read, and kept); LabError naming the
    host where no key could be read from it."""
    said = _said_with_key(end, wireguard.keygen_script(end.key_file), str.strip).strip()
    if PUBLIC_KEY.fullmatch(said):
        return said
    raise LabError(f"host {end.name}: no WireGuard public key could be read from it (it said {said[-200:]!r})")


def down(ends: Sequence[End], say: Say) -> int:
    """Take the overlay away from every host; on how many it was."""
    removed = on_each(ends, lambda end: end.remove())
    for end, was in zip(ends, removed):
        if was:
            say(f"{end.name}: removed {INTERFACE}, its key and its process")
    return sum(removed)


def show(ends: Sequence[End]) -> list[HostOverlay]:
    """Each host's end of the overlay, as its interface says (a host without one is left out); every
    peer named by its host."""
    read = [found for found in on_each(ends, _read_end) if found.public_key]
    names = {found.public_key: found.host for found in read}
    return [HostOverlay(found.host, found.address, found.mtu, found.public_key,
                        tuple(sorted((names.get(peer.public_key, peer.public_key[:8] + "..."), peer)
                                     for _, peer in found.peers)))
            for found in read]


def _member(members: Sequence[Member], end: End) -> Member:
    return next(m for m in members if m.name == end.name)


def _path_mtus(end: End, members: Sequence[Member]) -> list[int]:
    others = [m.endpoint for m in members if m.name != end.name] or [end.endpoint]
    return [int(line) for line in end.sh(wireguard.path_mtu_script(others)).split()]


def _read_end(end: End) -> HostOverlay:
    """The end as its interface says (no public key: it has none, or the engine lost what it said,
    which a read again tells apart: KEY_READS)."""
    out = _said_with_key(end, wireguard.state_script(), lambda said: _fields(said).get("key", ""))
    fields = _fields(out)
    return HostOverlay(end.name, fields.get("address", ""), int(fields.get("mtu") or 0), fields.get("key", ""),
                       tuple(("", peer) for peer in wireguard.parse_peers(out)))


def _fields(state: str) -> dict[str, str]:
    """The ``name value`` lines of what state_script printed (its peers' lines left out)."""
    return dict(line.partition(" ")[::2] for line in state.splitlines() if "\t" not in line)


def _wait_for_handshakes(ends: Sequence[End], members: Sequence[Member]) -> None:
    """Wait until every host has completed a handshake with every other; else one line naming the
    host that reached no peer (or the pairs that did not meet)."""
    by_key = {m.public_key: m.name for m in members}
    deadline = time.monotonic() + HANDSHAKE_WAIT
    while True:
        dumps = on_each(ends, lambda end: end.sh(wireguard.show_script()))
        met = {(end.name, by_key.get(p.public_key, "")) for end, dump in zip(ends, dumps)
               for p in wireguard.parse_peers(dump) if p.latest_handshake}
        missing = sorted({(min(a.name, b.name), max(a.name, b.name)) for a in members for b in members
                          if a is not b and (a.name, b.name) not in met})
        if not missing:
            return
        if time.monotonic() > deadline:
            raise no_handshake(missing, members)
        time.sleep(POLL)


def no_handshake(missing: Sequence[tuple[str, str]], members: Sequence[Member]) -> LabError:
    """The error for the pairs that did not meet: the host in all of them when there is one."""
    at = {m.name: f"{m.endpoint}:{m.port}" for m in members}
    alone = [m.name for m in members if sum(m.name in pair for pair in missing) == len(members) - 1]
    if len(members) > 2 and len(alone) == 1:
        name = alone[0]
        return HostUnreachable(name, f"host {name}: no WireGuard handshake with any peer within {HANDSHAKE_WAIT:g}s: "
                                     f"the others do not reach it at its endpoint {at[name]} (UDP), or it does not "
                                     f"reach them")
    pairs = "; ".join(f"{a} ({at[a]}) and {b} ({at[b]})" for a, b in missing)
    return LabError(f"no WireGuard handshake within {HANDSHAKE_WAIT:g}s between {pairs}: UDP between them is "
                    f"blocked, or an endpoint is not where the other reaches it")
