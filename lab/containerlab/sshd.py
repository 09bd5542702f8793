"""Reaching the lab's hosts over SSH: the lab's key pair, each host's key recorded in known_hosts
(read through the engine), and waiting until every host's sshd answers."""
from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from docker.models.containers import Container

from lab.containerlab import state
from lab.containerlab.engine import EngineError, Say, each

SSH_WAIT = 60.0
SSH_PROBE_TIMEOUT = 3.0
PUBLIC_MODE = 0o644  # the public key: the hosts' sshd reads it as the lab's user (and compose mounts it)
START_POLL = 0.05  # seconds between looks at a starting host (its key, its sshd): sshd starts in a few tenths


def ensure_key(path: Path, say: Say) -> Path:
    """An ed25519 key pair for the lab, in its state (``lab.containerlab.state``): made once, as a
    new file of mode 0600 (never through what is in its place), never put in an image; one found
    there must be a regular file of the user's, closed to others (else StateError)."""
    if state.check_file(path):
        key: Any = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    else:
        say(f"making the lab's SSH key {path}")
        key = Ed25519PrivateKey.generate()
        state.write_new(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                                serialization.NoEncryption()))
    state.write(path.with_suffix(".pub"), _public_line(key), PUBLIC_MODE)  # (derived each time: whole, 0644)
    return path


def _public_line(key: Any) -> bytes:
    return bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH)) + b" lab\n"


def collect_host_keys(known_hosts: Path, containers: Mapping[str, Container]) -> None:
    """Record each host's key in the lab's known_hosts (``containers``: how SSH names each host ->
    its container), read through the engine (a channel we already trust), so SSH can verify every
    host from its first connection."""
    keys = each(host_key, containers.values())
    state.write(known_hosts, "".join(f"{name} {key}\n" for name, key in zip(containers, keys)).encode())


def host_key(c: Container) -> str:
    """The host's SSH key (``type base64``), once its entrypoint has made it (bounded)."""
    deadline = time.monotonic() + SSH_WAIT
    while True:
        code, out = c.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"])
        if code == 0 and out.strip():
            return " ".join(out.decode().split()[:2])
        c.reload()
        if c.status != "running" or time.monotonic() > deadline:
            logs = c.logs(tail=5).decode(errors="replace").strip().splitlines()
            raise EngineError(f"host container {c.name} did not start sshd ({c.status}): "
                              f"{logs[-1] if logs else 'no output'}")
        time.sleep(START_POLL)


def wait_for_ssh(targets: Mapping[str, tuple[str, int]], containers: Mapping[str, Container] | None = None) -> None:
    """Until every host's sshd (name -> address, port) answers with its banner (bounded). With the
    hosts' ``containers`` (by name), a host whose container has stopped (its sshd could not
    listen, say) is an error at once, with the container's last line."""
    deadline, looked = time.monotonic() + SSH_WAIT, time.monotonic()
    pending = dict(targets)
    while pending:
        pending = {name: at for name, at in pending.items() if not ssh_answers(*at)}
        if pending and containers and time.monotonic() - looked > 1:
            looked = time.monotonic()
            for name in sorted(pending):
                c = containers[name]
                c.reload()
                if c.status != "running":
                    logs = c.logs(tail=3).decode(errors="replace").strip().splitlines()
                    raise EngineError(f"host {name}: its container {c.name} stopped ({c.status}): "
                                      f"{logs[-1] if logs else 'no output'}")
        if pending and time.monotonic() > deadline:
            where = (f"{name} ({address}:{port})" for name, (address, port) in sorted(pending.items()))
            raise EngineError(f"sshd did not answer on {', '.join(where)}")
        if pending:
            time.sleep(START_POLL)


def ssh_answers(address: str, port: int = 22, timeout: float = SSH_PROBE_TIMEOUT) -> bool:
    """True when an SSH server greets on address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False
