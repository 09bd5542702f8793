"""Where an SSH host is: the inventory's values completed from ``~/.ssh/config``.

The inventory's explicit values (``ansible_host``, a non-default ``ansible_port``,
``ansible_user``, the key file) win over the config, which is looked up by the host's name and
by its address (HostName, User, Port, IdentityFile, ProxyJump, HashKnownHosts). Pure but for
reading the config file.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import paramiko

from lab.errors import UsageError


@dataclass(frozen=True)
class Endpoint:
    """One SSH server to log in to: the host itself or a jump host on the way to it."""

    host: str  # the inventory's name of the host this leads to
    who: str  # "host a" or "host a: jump host bastion"
    address: str
    port: int
    user: str
    key_files: tuple[str, ...]  # empty: ssh-agent and the default keys
    jumps: tuple[str, ...]  # ProxyJump hops, the nearest to this server last
    hash_known_hosts: bool

    @property
    def where(self) -> str:
        """``host a (10.0.0.1:22)``: how messages name it."""
        address = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.who} ({address}:{self.port})"

    @property
    def known_hosts_name(self) -> str:
        return known_hosts_name(self.address, self.port)


def known_hosts_name(address: str, port: int) -> str:
    """The name a server's keys have in known_hosts, as ssh writes it."""
    return address if port == 22 else f"[{address}]:{port}"


def read_config(path: str) -> paramiko.SSHConfig:
    expanded = os.path.expanduser(path)
    if not os.path.isfile(expanded):
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(expanded)
    except (paramiko.SSHException, OSError, ValueError) as exc:
        raise UsageError(f"{expanded}: cannot read the SSH config: {exc}") from None


def lookup(config: paramiko.SSHConfig, name: str, address: str) -> dict[str, Any]:
    """The config's options for a host, by its name first, then by its address."""
    options: dict[str, Any] = {}
    for key in dict.fromkeys((address, name)):  # the name last: its values win
        found = dict(config.lookup(key))
        if found.get("hostname") == key:  # paramiko's default, not a configured HostName
            del found["hostname"]
        options.update(found)
    if "proxycommand" in options and options["proxycommand"].lower() != "none" and "proxyjump" not in options:
        raise UsageError(f"host {name}: ProxyCommand in the SSH config is not supported; use ProxyJump")
    return options


def port_of(options: Mapping[str, Any], who: str) -> int:
    try:
        port = int(options.get("port", 22))
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise UsageError(f"{who}: Port {options.get('port')!r} in the SSH config is not a port")
    return port


def identity_files(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The config's IdentityFile paths that exist (ssh skips missing ones too)."""
    paths = (os.path.expanduser(path) for path in options.get("identityfile", []))
    return tuple(path for path in paths if os.path.isfile(path))


def jumps_of(options: Mapping[str, Any], who: str) -> tuple[str, ...]:
    value = str(options.get("proxyjump", "none")).strip()
    if value.lower() == "none":
        return ()
    hops = tuple(hop.strip() for hop in value.split(","))
    for hop in hops:
        parse_jump(hop, who)
    return hops


def parse_jump(spec: str, who: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` or ``ssh://[user@]host[:port]`` (host may be ``[v6]``)."""
    rest = spec.removeprefix("ssh://")
    user, _, rest = rest.rpartition("@")
    port = None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail:
            port = tail.removeprefix(":")
    else:
        host, _, port = rest.partition(":")
    try:
        number = int(port) if port else None
    except ValueError:
        number = 0
    if not host or (number is not None and not 0 < number < 65536):
        raise UsageError(f"{who}: ProxyJump {spec!r} is not [user@]host[:port]")
    return user or None, host, number
