"""A real OpenSSH server on 127.0.0.1 for the SSH transport's tests.

``start_sshd(directory)`` runs ``/usr/sbin/sshd -D -e -f CONFIG`` on a free port with a
fresh ed25519 host key and one authorized client key (both in ``directory``), key
authentication only, and returns once the port answers with an SSH banner. ``stop()``
ends it. ``require_sshd()`` skips a test where sshd cannot run, or fails it under CI=true.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 10.0


def unavailable() -> str | None:
    """Why a real sshd cannot run here, or None."""
    if not os.path.exists(SSHD):
        return f"{SSHD} is missing (Debian: apt-get install openssh-server)"
    if os.geteuid() != 0:
        return "sshd tests need root (sshd's privilege separation and root login)"
    return None


def require_sshd() -> None:
    """Skip the calling test where sshd cannot run; under CI=true that is a failure."""
    reason = unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the sshd tests cannot run: {reason}")
        pytest.skip(reason)


def keygen(path: Path) -> str:
    """Make an ed25519 key pair at ``path``; the public key line ("ssh-ed25519 AAAA...")."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                   check=True, timeout=30)
    return " ".join(path.with_name(path.name + ".pub").read_text().split()[:2])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SSHServer:
    port: int
    host_public: str  # "ssh-ed25519 AAAA..."
    client_key: Path  # the private key the server authorizes
    log: Path  # sshd's own log (-e writes to stderr, which goes here)
    process: subprocess.Popen[bytes]

    @property
    def tmp(self) -> Path:
        """The sessions' TMPDIR: the host's own temp directory, not the controller's."""
        return self.log.parent / "tmp"

    @property
    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_public}\n"

    def sshd_pids(self) -> list[int]:
        """The listener and every sshd process below it (one or two per connection: the privileged
        monitor and the session's), not the commands the sessions run."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(entry.name))
        found, queue = [], [self.process.pid]
        while queue:
            pid = queue.pop()
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip().startswith("sshd"):
                    found.append(pid)
                    queue.extend(children.get(pid, []))
            except OSError:
                continue
        return found

    def freeze(self) -> list[int]:
        """SIGSTOP every sshd process of this server: its TCP connections stay open (the kernel still
        acknowledges) but nothing answers on them, as with a host that hangs or a network that drops
        everything. The pids stopped (``thaw`` them)."""
        pids = self.sshd_pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def thaw(self, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self.thaw(self.sshd_pids())  # (a stopped sshd cannot end)
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


def start_sshd(directory: Path, client_key: Path | None = None, log_level: str = "VERBOSE", sftp: bool = True,
               max_sessions: int = 10) -> SSHServer:
    """Start sshd in ``directory`` (made if needed); authorize ``client_key`` (made if None).
    ``sftp=False`` leaves out the ``Subsystem sftp`` line, as hardened servers do (no SFTP);
    ``max_sessions`` is sshd's MaxSessions (channels per connection; OpenSSH's default is 10)."""
    directory.mkdir(parents=True, exist_ok=True)
    host_public = keygen(directory / "host_ed25519")
    if client_key is None:
        client_key = directory / "client_ed25519"
        keygen(client_key)
    (directory / "authorized_keys").write_text(client_key.with_name(client_key.name + ".pub").read_text())
    (directory / "tmp").mkdir(exist_ok=True)
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    for _ in range(3):  # another process may take the free port before sshd binds it
        port = free_port()
        config = directory / "sshd_config"
        config.write_text("\n".join([
            f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {directory / 'host_ed25519'}",
            f"PidFile {directory / 'sshd.pid'}", f"AuthorizedKeysFile {directory / 'authorized_keys'}",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no", "AllowTcpForwarding yes",
            f"MaxSessions {max_sessions}", *(["Subsystem sftp internal-sftp"] if sftp else []),
            f"SetEnv TMPDIR={directory / 'tmp'}", f"LogLevel {log_level}", ""]))
        log = directory / "sshd.log"
        with open(log, "wb") as err:
            process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                       stdout=err, stderr=err)
        server = SSHServer(port, host_public, client_key, log, process)
        if _answers(server):
            return server
        server.stop()
    raise RuntimeError(f"sshd did not start; its log:\n{log.read_text()}")


def _answers(server: SSHServer) -> bool:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and server.process.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return True
        except OSError:
            time.sleep(0.05)
    return False
