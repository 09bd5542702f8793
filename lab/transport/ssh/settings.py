"""How every SSH host of a run is reached (:class:`SSHSettings`), apart from the connections themselves
(``lab.transport.ssh.connections``), so that a command that reaches no SSH host never imports paramiko
(a quarter of the CLI's start)."""
from __future__ import annotations

from dataclasses import dataclass

WIRE_LOG = "lab.transport.ssh.connections.paramiko"  # paramiko's own log lines for the lab's connections


@dataclass(frozen=True)
class SSHSettings:
    """How every SSH host of a run is reached."""

    connect_timeout: float = 10.0  # seconds for any one wait: TCP, banner, auth, a channel, a reply
    keepalive: float = 5.0  # seconds between two keepalives on every connection
    alive_timeout: float = 30.0  # seconds a keepalive may go unanswered before the host is lost
    accept_new_host_keys: bool = False  # trust and record a host key seen for the first time
    known_hosts: str | None = None  # the lab's known_hosts file; a host's own file wins
    ssh_config: str = "~/.ssh/config"
