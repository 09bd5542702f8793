"""The SSH transport (paramiko): ``transport`` reaches a host and runs its ranks, ``config``
says where the host is, ``known_hosts`` checks its key."""
from lab.transport.ssh.transport import RANKS_PER_CONNECTION, SSHSettings, SSHTransport

__all__ = ["RANKS_PER_CONNECTION", "SSHSettings", "SSHTransport"]
