"""The SSH transport (paramiko): ``transport`` reaches a host and runs its ranks, ``connections``
logs in to it and keeps its connections alive, ``config`` says where the host is,
``known_hosts`` checks its key."""
from lab.transport.ssh.connections import RANKS_PER_CONNECTION, SSHSettings
from lab.transport.ssh.transport import SSHTransport

__all__ = ["RANKS_PER_CONNECTION", "SSHSettings", "SSHTransport"]
