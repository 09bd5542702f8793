"""WireGuard for ``lab net overlay``: the mesh's plan (each member's overlay address, endpoint and
key), the shell that makes, configures, reads and removes an interface as root in a host's network
namespace, and what ``wg show`` says. Pure: where that shell runs (a sidecar container beside a
lab host, or ``sudo`` on a VM) is the caller's.

The plan follows what engineers do by hand, and what trips them: every peer's endpoint is the
address the others reach it at (across VPCs its external, NAT'd one), a persistent keepalive
holds each NAT mapping open, and the interface's MTU fits under the path's (WireGuard adds up to
80 bytes a packet), so large messages are not lost where small ones pass.

A private key never leaves its host: it is made there (umask 077) and only its public half is
read back. ``wg show``'s dump starts with the private key, so the shell drops that line before
anything is printed.
"""
from __future__ import annotations

import ipaddress
import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass

from lab.core import hostfiles

INTERFACE = "labwg0"  # not wg0: a host's own WireGuard is left alone
PORT = 51820
KEEPALIVE = 25  # seconds: under the usual NAT's UDP timeout (30 s or more)
OVERHEAD = 80  # bytes WireGuard adds to a packet over IPv6 (60 over IPv4): the MTU is the path's less this
MIN_MTU = 1280  # IPv6's minimum: an overlay with less cannot carry IPv6, and barely TCP
DEFAULT_SUBNET = "10.77.0.0/24"
FIRST_HOST = 11  # the first member is .11, as node1 is in the lab's own networks
STALE = 180.0  # seconds: WireGuard renews a session's handshake every 2 minutes while it is used
USERSPACE_ENV = "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1"  # wireguard-go runs although the kernel has one
KEY_DIR = "/run/lab-wg"  # root's only: the private key, and wireguard-go's log on a host
KEY_FILE = f"{KEY_DIR}/private.key"


@dataclass(frozen=True)
class Member:
    """One host in the overlay: where the others reach it (``endpoint``, UDP ``port``), its address
    on the overlay and its public key."""

    name: str
    endpoint: str
    address: str
    public_key: str
    port: int = PORT


@dataclass(frozen=True)
class PeerState:
    """One peer as a host's interface sees it (``wg show``)."""

    public_key: str
    endpoint: str  # where its packets come from now ("(none)" before the first)
    latest_handshake: int  # seconds since the epoch; 0: never
    received: int  # bytes
    sent: int

    def age(self, now: float | None = None) -> float | None:
        """Seconds since the last handshake; None: there was none."""
        if not self.latest_handshake:
            return None
        return max(0.0, (time.time() if now is None else now) - self.latest_handshake)


def member_addresses(subnet: str, count: int) -> list[str]:
    """The overlay addresses of ``count`` members: .11, .12, ... of ``subnet``."""
    network = ipaddress.ip_network(subnet)
    if FIRST_HOST + count >= network.num_addresses:
        raise ValueError(f"the overlay {subnet} holds at most {network.num_addresses - FIRST_HOST - 1} hosts")
    return [str(network[FIRST_HOST + k]) for k in range(count)]


def overlay_mtu(path_mtus: Sequence[int]) -> int:
    """The interface MTU that fits under every path: the smallest path MTU less WireGuard's overhead."""
    return max(MIN_MTU, min(path_mtus) - OVERHEAD)


def keygen_script(key_file: str) -> str:
    """Make the host's private key (once, readable by root only) and print its public key."""
    key = shlex.quote(key_file)
    return (f"umask 077 && mkdir -p {shlex.quote(key_file.rsplit('/', 1)[0] or '/')} && "
            f"{{ [ -s {key} ] || wg genkey > {key}; }} && wg pubkey < {key}")


def path_mtu_script(endpoints: Sequence[str]) -> str:
    """Print the MTU of the interface each endpoint is routed through, one a line."""
    lines = []
    for endpoint in endpoints:
        dev = f"$(ip -o route get {shlex.quote(endpoint)} | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p')"
        lines.append(f"cat /sys/class/net/{dev}/mtu")
    return " && ".join(lines)


def configure_script(me: Member, peers: Sequence[Member], prefix: int, mtu: int, key_file: str,
                     interface: str = INTERFACE) -> str:
    """Give the interface its key, port and peers, its overlay address and MTU, and bring it up."""
    wg = ["wg", "set", interface, "private-key", key_file, "listen-port", str(me.port)]
    for peer in peers:
        wg += ["peer", peer.public_key, "endpoint", f"{peer.endpoint}:{peer.port}", "allowed-ips",
               f"{peer.address}/32", "persistent-keepalive", str(KEEPALIVE)]
    return " && ".join([
        shlex.join(wg),
        shlex.join(["ip", "address", "replace", f"{me.address}/{prefix}", "dev", interface]),
        shlex.join(["ip", "link", "set", interface, "mtu", str(mtu), "up"])])


HOSTS_MARK = "# lab-overlay"  # ends each /etc/hosts line the overlay adds


def hosts_script(members: Sequence[Member], interface: str = INTERFACE, hosts: str = "/etc/hosts") -> str:
    """Name every member's overlay address in /etc/hosts (``node1-labwg0``), in place of the names
    an earlier overlay gave; with no members, only take them away. Without them every reverse lookup
    of an overlay address waits for DNS, and init stalls: the store looks up each peer's address, and
    torch's store client its own socket's, in the IPv4-mapped IPv6 form (::ffff:A), so both forms
    are named. The file is rewritten whole or not at all (``lab.core.hostfiles``: a container's
    /etc/hosts is a bind mount, written in place)."""
    lines = [f"{form} {m.name}-{interface} {HOSTS_MARK}"
             for m in members for form in (m.address, f"::ffff:{m.address}")]
    add = f" && printf '%s\\n' {' '.join(map(shlex.quote, lines))}" if lines else ""
    return hostfiles.rewrite(hosts, f"{{ grep -v ' {HOSTS_MARK}$' {shlex.quote(hosts)} || [ $? = 1 ]; }}{add}")


def host_start_script(interface: str = INTERFACE, key_dir: str = KEY_DIR) -> str:
    """Make the interface on a host (a VM): the kernel's WireGuard where it has it, else wireguard-go,
    started in a session of its own (it daemonizes once its interface is up). What is missing is
    installed where apt-get can; else one line says what it is."""
    log = shlex.quote(f"{key_dir}/wireguard-go.log")
    install = ("DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -q --no-install-recommends "
               "\"$1\" >/dev/null 2>&1")
    return "\n".join([
        f"install() {{ command -v apt-get >/dev/null 2>&1 && {install}; }}",
        "missing() { echo \"$1 is not installed and apt-get could not install it (Debian: apt-get install $1)\" >&2; "
        "exit 1; }",
        "command -v wg >/dev/null 2>&1 || install wireguard-tools || missing wireguard-tools",
        f"mkdir -p -m 700 {shlex.quote(key_dir)}",
        f"if ip link add {interface} type wireguard 2>/dev/null; then exit 0; fi",
        "command -v wireguard-go >/dev/null 2>&1 || install wireguard-go || missing wireguard-go",
        f"{USERSPACE_ENV} setsid -w wireguard-go {interface} </dev/null >{log} 2>&1 && exit 0",
        f"cat {log}; exit {WIREGUARD_GO_FAILED}"])


WIREGUARD_GO_FAILED = 3  # host_start_script's status when wireguard-go failed: its log is the output
_LOG_PREFIX = re.compile(r"^ERROR: \(\S+\) \S+ \S+ ")  # wireguard-go's: ERROR: (labwg0) 2026/11/26 00:21:48


def wireguard_go_said(log: str) -> str:
    """The line of wireguard-go's output that says why it stopped: its last error, else its last line
    (its banner's box left out); "" when it said nothing."""
    lines = [line.strip() for line in log.splitlines()
             if line.strip() and not any("\u2500" <= c <= "\u257f" for c in line)]
    errors = [_LOG_PREFIX.sub("", line) for line in lines if line.startswith("ERROR:")]
    return (errors or lines or [""])[-1]


def host_remove_script(interface: str = INTERFACE) -> str:
    """Take the interface away from a host (its wireguard-go ends with it), its key and log, and the
    /etc/hosts lines; print 1 when there was an interface, else 0."""
    name = shlex.quote(interface)
    return (f"if ip link show {name} >/dev/null 2>&1; then ip link del {name} && had=1; else had=0; fi; "
            f"pkill -f 'wireguard-g[o] {interface}$' 2>/dev/null; rm -rf {KEY_DIR} /var/run/wireguard/{name}.sock; "
            f"{hosts_script([], interface)} && echo $had")


def state_script(interface: str = INTERFACE) -> str:
    """Print the interface's public key, address and MTU (``key K``, ``address A/P``, ``mtu M``), then
    its peers (see show_script)."""
    name = shlex.quote(interface)
    return (f"echo key $(wg show {name} public-key) && "
            f"echo address $(ip -o -4 address show dev {name} | awk '{{print $4}}') && "
            f"echo mtu $(cat /sys/class/net/{name}/mtu) && {show_script(interface)}")


def show_script(interface: str = INTERFACE) -> str:
    """Print the interface's peers (``wg show dump`` without its first line: the private key)."""
    return f"wg show {shlex.quote(interface)} dump | tail -n +2"


def parse_peers(dump: str) -> list[PeerState]:
    """The peer lines of ``wg show IF dump``: public key, preshared key, endpoint, allowed IPs,
    latest handshake, bytes received, bytes sent, keepalive (tab-separated)."""
    peers = []
    for line in dump.splitlines():
        fields = line.split("\t")
        if len(fields) < 8:
            continue
        try:
            peers.append(PeerState(fields[0], fields[2], int(fields[4]), int(fields[5]), int(fields[6])))
        except ValueError:
            continue
    return peers
