"""SSH host keys, checked against known_hosts files as OpenSSH checks them.

An unknown key is refused unless new keys are accepted (then it is appended to the lab's own
file); a changed or ``@revoked`` key is always refused. Hashed names, patterns and negations
are understood.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any

import paramiko
from paramiko.hostkeys import HostKeyEntry

from lab.errors import HostUnreachable, UsageError
from lab.transport.ssh.config import Endpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KnownKey:
    key: paramiko.PKey
    where: str  # "file:line"
    revoked: bool


class KnownHosts:
    """The known_hosts files one login checks; the first is where new keys are written.

    The files are read at each check, so a key another transport just added counts.
    """

    def __init__(self, files: tuple[str, ...], accept_new: bool) -> None:
        self.files = files
        self.accept_new = accept_new

    def keys_for(self, name: str) -> list[KnownKey]:
        found = []
        for path in self.files:
            try:
                with open(path, "rb") as file:
                    found += keys_in(file.read(), name, path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise UsageError(f"{path}: cannot read the known_hosts file: {exc.strerror}") from None
        return found

    def transport_factory(self, endpoint: Endpoint) -> Any:
        """Make paramiko ask the server for the key types known for it first (as ssh does),
        so a host known by, say, its ECDSA key is not mistaken for a changed one."""
        known = {k.key.get_name() for k in self.keys_for(endpoint.known_hosts_name) if not k.revoked}
        if "ssh-rsa" in known:
            known |= {"rsa-sha2-512", "rsa-sha2-256"}

        def make(sock: Any, **kwargs: Any) -> paramiko.Transport:
            transport = paramiko.Transport(sock, **kwargs)
            options = transport.get_security_options()
            types = list(options.key_types)
            options.key_types = [t for t in types if t in known] + [t for t in types if t not in known]
            return transport

        return make

    def check(self, endpoint: Endpoint, key: paramiko.PKey) -> None:
        """Accept ``key`` for ``endpoint`` or raise :class:`HostUnreachable`."""
        name, blob = endpoint.known_hosts_name, key.asbytes()
        shown = f"{key.get_name()} {key.fingerprint}"
        known = self.keys_for(name)
        for k in known:
            if k.revoked and k.key.asbytes() == blob:
                raise HostUnreachable(endpoint.host, f"{endpoint.where}: its SSH host key ({shown}) is marked @revoked "
                                      f"in {k.where}; refusing to connect")
        if any(not k.revoked and k.key.asbytes() == blob for k in known):
            return
        old = next((k for k in known if not k.revoked), None)
        if old is not None:
            path = old.where.rsplit(":", 1)[0]
            raise HostUnreachable(endpoint.host,
                f"{endpoint.where}: SSH host key CHANGED: the server offers {shown} but {old.where} "
                f"has {old.key.get_name()} {old.key.fingerprint}; refusing to connect (someone may be "
                f"intercepting the connection); if the change is expected, remove the old key with "
                f"ssh-keygen -f {shlex.quote(path)} -R {shlex.quote(name)}")
        if not self.accept_new:
            raise HostUnreachable(endpoint.host, f"{endpoint.where}: unknown SSH host key ({shown}); add it to "
                                  f"known_hosts or pass --accept-new-host-keys")
        self._remember(endpoint, key)

    def _remember(self, endpoint: Endpoint, key: paramiko.PKey) -> None:
        """Append ``key`` to the first file, unless another transport just did (hosts that
        share an address are prepared at once, each on its own thread)."""
        path = self.files[0]
        name = endpoint.known_hosts_name
        written = paramiko.HostKeys.hash_host(name) if endpoint.hash_known_hosts else name
        try:
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            with open(path, "a+b") as file:
                fcntl.flock(file, fcntl.LOCK_EX)
                file.seek(0)
                text = file.read()
                if any(k.key.asbytes() == key.asbytes() for k in keys_in(text, name, path)):
                    return
                line = f"{written} {key.get_name()} {key.get_base64()}\n".encode()
                file.write(line if not text or text.endswith(b"\n") else b"\n" + line)
        except OSError as exc:
            raise HostUnreachable(endpoint.host, f"{endpoint.where}: cannot add its SSH host key to {path}: "
                                  f"{exc.strerror}") from None
        log.warning("%s: added SSH host key %s %s to %s", endpoint.where, key.get_name(), key.fingerprint, path)


class CheckHostKey(paramiko.MissingHostKeyPolicy):
    """paramiko's hook for a key it does not know: here, for every key (none is loaded)."""

    def __init__(self, known: KnownHosts, endpoint: Endpoint) -> None:
        self.known = known
        self.endpoint = endpoint
        self.accepted = False  # the key passed: what fails after this is the login

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.known.check(self.endpoint, key)
        self.accepted = True


def keys_in(text: bytes, name: str, path: str) -> list[KnownKey]:
    """The keys a known_hosts file's ``text`` holds for ``name``."""
    lines = text.decode("utf-8", "replace").splitlines()
    found = (_parse_known_line(line, name, f"{path}:{number}") for number, line in enumerate(lines, 1))
    return [known for known in found if known is not None]


def _parse_known_line(line: str, name: str, where: str) -> KnownKey | None:
    """The key on a known_hosts line if the line is about ``name``."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    marker = None
    if line.startswith("@"):
        marker, _, line = line.partition(" ")
        if marker != "@revoked":  # @cert-authority: certificates are not supported
            return None
    fields = line.split()
    if len(fields) < 3 or not _names_match(fields[0], name):
        return None
    try:
        entry = HostKeyEntry.from_line(" ".join(fields[:3]))
    except Exception:
        log.debug("%s: unreadable known_hosts line", where)
        return None
    return KnownKey(entry.key, where, marker == "@revoked") if entry is not None else None


def _names_match(patterns: str, name: str) -> bool:
    """Whether a known_hosts names field (hashed names, patterns, ``!negations``) covers ``name``."""
    matched = False
    for pattern in patterns.split(","):
        if pattern.startswith("|1|"):
            try:
                matched |= paramiko.HostKeys.hash_host(name, pattern) == pattern
            except (ValueError, AssertionError):
                continue
        elif _glob(name, pattern.lstrip("!")):
            if pattern.startswith("!"):
                return False
            matched = True
    return matched


def _glob(name: str, pattern: str) -> bool:
    """ssh's host patterns: ``*`` and ``?`` are wildcards, everything else (``[``) is itself."""
    regex = "".join(".*" if char == "*" else "." if char == "?" else re.escape(char) for char in pattern)
    return re.fullmatch(regex, name, re.IGNORECASE) is not None
