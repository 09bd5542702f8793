"""Transports: how a command reaches a host.

A transport does one small thing for the runner: start a process on its host with a
given environment and hand back a :class:`RankProcess` whose output can be read line
by line, whose input can be written and closed, which can be signalled (its whole
process group, so nothing it started survives) and killed. ``transport_for`` picks one
from the host's ``connection``; ``for_each_host`` does one thing on many hosts at once.
"""
from __future__ import annotations

import ipaddress
import logging
import shlex
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Mapping, Sequence, TypeVar

from ..inventory import Host, Inventory

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .ssh import SSHSettings


class RankProcess(ABC):
    """A started process on some host, and every process it started."""

    stdin: IO[bytes]  # open while it runs; a worker stops itself when it closes
    stdout: IO[bytes]
    stderr: IO[bytes]

    def send(self, data: bytes) -> None:
        """Write ``data`` to the process's stdin now (flushed); OSError once it is closed or gone."""
        self.stdin.write(data)
        self.stdin.flush()

    def close_stdin(self) -> None:
        """Close the process's stdin, so it reads end-of-file; never raises, safe to call twice."""
        try:
            self.stdin.close()
        except (OSError, EOFError):
            pass

    @abstractmethod
    def poll(self) -> int | None:
        """The exit status, or None while it runs."""

    @abstractmethod
    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process's whole group; no error if it is gone."""

    @abstractmethod
    def kill(self) -> None:
        """Kill the whole group and release the connection; safe to call twice."""


class Transport(ABC):
    """Reaches one host."""

    def __init__(self, host: Host) -> None:
        self.host = host

    @abstractmethod
    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> RankProcess:
        """Start ``argv`` in ``cwd`` with ``env`` added to the host's environment."""

    @property
    def python(self) -> str:
        """The host's Python: the one with torch (``ansible_python_interpreter``)."""
        return self.host.python

    def module_argv(self, module: str) -> list[str]:
        """How to run ``python -m module`` with the host's Python."""
        return [self.python, "-m", module]

    @abstractmethod
    def prepare(self, run_dir: str, uploads: Mapping[str, Path]) -> None:
        """Make ``run_dir`` on the host and put each upload (path in run_dir -> local file) there."""

    def cleanup(self, run_dir: str, keep: bool = False) -> None:
        """Remove what ``prepare`` made (unless ``keep``)."""

    def own_address(self) -> str | None:
        """The host's address as this transport reaches it, when it can tell (see ssh)."""
        return None

    def close(self) -> None:
        """Release the connection."""


PID_MARK = b"lab-pid:"  # the line a remote rank's shell prints before it becomes the rank


def remote_command(argv: Sequence[str], env: Mapping[str, str], cwd: str) -> str:
    """The command line for sshd: whatever the login shell, ``sh`` replaces it (same pid),
    changes to ``cwd``, prints the pid and replaces itself with ``argv`` under ``env``."""
    assignments = " ".join(shlex.quote(f"{key}={value}") for key, value in env.items())
    script = (f"cd {shlex.quote(cwd)} && echo {PID_MARK.decode()}$$ && "
              f"exec env {assignments} {shlex.join(argv)}")
    return f"exec /bin/sh -c {shlex.quote(script)}"


PACKAGE_DIR = Path(__file__).resolve().parents[1]  # lab/


def code_uploads() -> dict[str, Path]:
    """The lab's own code, as every run carries it to every host (``code/lab/...``)."""
    return {f"code/lab/{p.relative_to(PACKAGE_DIR).as_posix()}": p
            for p in sorted(PACKAGE_DIR.rglob("*.py")) if "__pycache__" not in p.parts}


Item = TypeVar("Item")
Result = TypeVar("Result")
MAX_PARALLEL = 32  # hosts handled at once


def for_each_host(items: Mapping[str, Item], action: Callable[[Item], Result]) -> dict[str, Result | Exception]:
    """Run ``action`` on every item (one per host name) at once; each host's result, or the
    exception it raised, by name. Every host is tried: one failure never stops the others."""
    if not items:
        return {}

    def attempt(item: Item) -> Result | Exception:
        try:
            return action(item)
        except Exception as exc:  # noqa: BLE001 - handed back to the caller, per host
            return exc

    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items))) as pool:
        futures = {name: pool.submit(attempt, item) for name, item in items.items()}
    return {name: future.result() for name, future in futures.items()}


def with_master_address(inventory: Inventory, ssh: "SSHSettings | None" = None) -> Inventory:
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


def transport_for(host: Host, ssh: "SSHSettings | None" = None) -> Transport:
    """The transport that reaches ``host`` (``ssh`` settings apply to SSH hosts)."""
    from .docker import DockerTransport
    from .local import LocalTransport
    from .ssh import SSHSettings, SSHTransport

    if host.connection == "local":
        return LocalTransport(host)
    if host.connection == "docker":
        return DockerTransport(host)
    return SSHTransport(host, ssh or SSHSettings())
