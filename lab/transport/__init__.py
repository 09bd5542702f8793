"""Transports: how a command reaches a host.

A transport does one small thing for the runner: start a process on its host with a
given environment and hand back a :class:`RankProcess` whose output can be read line
by line, which can be signalled (its whole process group, so nothing it started
survives) and killed. ``transport_for`` picks one from the host's ``connection``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import IO, Mapping, Sequence

from ..errors import UsageError
from ..inventory import Host


class RankProcess(ABC):
    """A started process on some host, and every process it started."""

    stdout: IO[bytes]
    stderr: IO[bytes]

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

    @abstractmethod
    def python_argv(self) -> list[str]:
        """How to run the lab's rank worker on this host."""

    def prepare(self, run_dir: str) -> None:
        """Make ``run_dir`` and whatever the worker needs on the host."""

    def cleanup(self, run_dir: str, keep: bool = False) -> None:
        """Remove what ``prepare`` made (unless ``keep``)."""

    def close(self) -> None:
        """Release the connection."""


def transport_for(host: Host) -> Transport:
    from .local import LocalTransport

    if host.connection == "local":
        return LocalTransport(host)
    raise UsageError(f"host {host.name}: connection '{host.connection}' is not available in this "
                     f"version; only ansible_connection: local hosts can run")
