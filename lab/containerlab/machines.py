"""Docker machines: the engines a lab spreads its hosts over (``lab up --machines FILE``).

The file is an Ansible-style inventory of machines, read like a lab inventory, by the same reader
(``lab.inventory.ansible``: same layout, groups, inheritance, and ``file:line`` errors), and each
machine is logged in to with the keys the SSH transport declares (``lab.transport.ssh.keys``)::

    all:
      vars: {ansible_user: root, ansible_ssh_private_key_file: ~/.ssh/id_ed25519}
      hosts:
        gpu1: {ansible_host: 10.0.0.5}
        gpu2: {ansible_host: 10.0.0.6, lab_hosts: 2}
        gpu3: {ansible_host: 10.0.0.7, docker_host: "tcp://10.0.0.7:2376", docker_cert_path: certs/gpu3}

Each machine's engine is reached through the Docker SDK: over SSH by default, on the lab's own
SSH connection (the machine's host key checked against known_hosts, key login; the API rides on
``docker system dial-stdio`` there, as with ``docker -H ssh://``), or over ``tcp://`` with TLS
(``docker_cert_path``: ca.pem, cert.pem and key.pem, as DOCKER_CERT_PATH). Plain TCP, an engine
anyone who reaches it may drive as root, is refused.
"""
from __future__ import annotations

import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import docker
import paramiko
from docker.errors import DockerException
from docker.tls import TLSConfig
from docker.transport import SSHHTTPAdapter
from docker.transport.sshconn import SSHConnectionPool
from yaml.nodes import Node

from lab.containerlab.engine import API_TIMEOUT, EngineError, Say, each, reason
from lab.errors import HostsUnreachable, HostUnreachable, InventoryError
from lab.inventory.ansible import read_ansible, read_text
from lab.inventory.hosts import HOST_KEYS
from lab.inventory.keys import Key, integer, invalid_value, text_value
from lab.inventory.model import Host
from lab.transport.ssh.keys import SSH_KEYS
from lab.transport.ssh.settings import SSHSettings
from lab.transport.ssh.transport import SSHTransport

API_VERSION = "1.41"  # Docker 20.10's API, which every later engine still speaks
MIN_ENGINE = (20, 10)
LIVENESS_TIMEOUT = 5.0  # seconds to tell whether a machine's engine can still be reached
API_SESSIONS = 4  # SSH sessions the API may hold on a machine's connection at once (sshd allows 10; the lab's
# own commands there take one at a time)
_DOCKER_HOST = re.compile(r"(ssh|tcp)://[A-Za-z0-9_.:@\[\]-]+\Z")


def _docker_host(key: str, node: Node, base_dir: str) -> str:
    value = text_value(key, node, base_dir)
    try:
        port_ok = urllib.parse.urlsplit(value).port != 0
    except ValueError:  # (not a number, or past 65535)
        port_ok = False
    if not _DOCKER_HOST.match(value) or not port_ok:
        raise invalid_value(key, value, "ssh://[USER@]HOST[:PORT] or tcp://HOST:PORT, a port from 1 to 65535")
    return value


def _cert_path(key: str, node: Node, base_dir: str) -> str:
    path = os.path.abspath(os.path.join(base_dir, os.path.expanduser(text_value(key, node, base_dir))))
    missing = [f for f in ("ca.pem", "cert.pem", "key.pem") if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise invalid_value(key, path, f"a directory with ca.pem, cert.pem and key.pem; {', '.join(missing)} missing")
    return path


def _lab_host_only(key: str, node: Node, base_dir: str) -> object:
    raise invalid_value(key, str(getattr(node, "value", "")), "a variable of a lab's hosts, not of a machine: "
                                                              "lab up --hosts and --slots, or lab_hosts, shape the lab")


# A lab host's keys that a machine has not: an error here (a Docker machine is not a lab host).
LAB_HOST_ONLY = ("slots", "gpus", "data_address", "network_interface", "shared_dir", "docker_container",
                 "grade_users", "machine")
# What machines.yaml reads: where the machine is (the inventory's ansible_host, its meaning said for a
# machine), how to log in to it (the SSH transport's keys, as they are: a machine is reached over SSH
# as a lab host is), and the machine's own settings, each with the Machine field it fills, how its
# value is read and what it means (as HOST_KEYS). What only a lab's hosts have is refused; other
# variables are ignored, as in a lab inventory.
MACHINE_KEYS: dict[str, Key] = {
    "ansible_host": replace(HOST_KEYS["ansible_host"], meaning=(
        "the machine's address, where SSH reaches it and its hosts' sshd: an IPv4 or IPv6 address or a DNS host "
        "name (default: docker_host's host, else the machine's name)")),
    **SSH_KEYS,
    **{name: Key(name, _lab_host_only, "a lab host's variable, refused here: `lab up --hosts` and `--slots`, or "
                                       "lab_hosts, shape the lab") for name in LAB_HOST_ONLY},
    "docker_host": Key("docker_host", _docker_host, "how the Docker SDK reaches the machine's engine: "
                                                    "`ssh://[USER@]HOST[:PORT]` (default: the machine's own SSH "
                                                    "login) or `tcp://HOST:PORT` with TLS"),
    "docker_cert_path": Key("cert_path", _cert_path, "a directory with ca.pem, cert.pem and key.pem, the TLS files "
                                                     "of a `tcp://` docker_host (as DOCKER_CERT_PATH); relative to "
                                                     "the machines file's directory"),
    "lab_hosts": Key("lab_hosts", integer(0), "lab hosts to place on the machine (default: an even share of "
                                              "`--hosts`; 0: none)"),
}


@dataclass(frozen=True)
class Machine:
    """One Docker machine of machines.yaml."""

    name: str
    address: str  # ansible_host, else docker_host's host, else the name: where SSH reaches it, and its hosts' sshd
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    docker_host: str | None = None  # ssh://... or tcp://...; None: SSH to the machine as above
    cert_path: str | None = None  # tcp:// only: its TLS files
    lab_hosts: int | None = None  # lab hosts to place here (None: an even share of --hosts)
    source: str = ""  # "machines.yaml:12": where it is defined

    def ssh_host(self) -> Host:
        """How to log in to the machine, as a lab host: docker_host's ssh:// user and port win."""
        url = urllib.parse.urlsplit(self.docker_host or "")
        if url.scheme == "ssh":
            return Host(self.name, url.hostname or self.address, url.port or self.port, url.username or self.user,
                        self.key_file, self.known_hosts, source=self.source)
        return Host(self.name, self.address, self.port, self.user, self.key_file, self.known_hosts,
                    source=self.source)


def load_machines(path: str) -> tuple[Machine, ...]:
    """Read and check machines.yaml."""
    base_dir = os.path.dirname(os.path.abspath(path))
    entries = read_ansible(read_text(path, "a machines file"), path, base_dir, MACHINE_KEYS, "the machines file")
    machines = tuple(Machine(name, **{"address": _default_address(name, values), **values},  # type: ignore[arg-type]
                             source=source) for name, values, _groups, source in entries)
    for m in machines:
        tcp = (m.docker_host or "").startswith("tcp://")
        line = int(m.source.rpartition(":")[2])
        if tcp and m.cert_path is None:
            raise InventoryError(path, line, f"machine {m.name}: docker_host {m.docker_host} needs docker_cert_path "
                                             "(TLS): an engine on plain TCP is root for anyone who can reach it")
        if not tcp and m.cert_path is not None:
            raise InventoryError(path, line, f"machine {m.name}: docker_cert_path is for a tcp:// docker_host")
    if all(m.lab_hosts == 0 for m in machines):
        raise InventoryError(path, None, "every machine has lab_hosts: 0; the lab needs a place for its hosts")
    return machines


def _default_address(name: str, values: dict[str, object]) -> str:
    """Where a machine is without ansible_host: docker_host's host, else its name."""
    return urllib.parse.urlsplit(str(values.get("docker_host", ""))).hostname or name


@dataclass(frozen=True)
class EngineFacts:
    """What ``lab up`` checks of a machine's engine before it starts anything there."""

    version: str
    architecture: str
    memory: int  # bytes: available (MemAvailable) where SSH can read it, else the engine's total
    memory_is_free: bool  # (False: the engine's total, for a machine reached over tcp://)
    cpus: int
    gpus: bool  # the engine has the nvidia runtime
    swarm: dict[str, Any]  # docker info's Swarm: LocalNodeState, NodeID, ControlAvailable, Cluster

    def summary(self) -> str:
        state = self.swarm.get("LocalNodeState") or "inactive"
        role = " (manager)" if self.swarm.get("ControlAvailable") else ""
        return (f"Docker {self.version}, {self.cpus} CPUs, {self.memory_text}, "
                f"{'GPUs' if self.gpus else 'no GPU'}, swarm {state}{role}")

    @property
    def memory_text(self) -> str:
        return f"{self.memory / 2**30:.1f} GiB {'free' if self.memory_is_free else 'in all'}"


class Engine:
    """A machine's Docker engine, connected: ``client`` (the Docker SDK), ``ssh`` (the machine's
    SSH connection, None for tcp://), ``address`` (the machine's own address, as the swarm
    advertises it), ``facts``."""

    def __init__(self, machine: Machine, client: docker.DockerClient, ssh: SSHTransport | None, address: str,
                 facts: EngineFacts) -> None:
        self.machine, self.client, self.ssh, self.address, self.facts = machine, client, ssh, address, facts

    @property
    def name(self) -> str:
        return self.machine.name

    def fail(self, message: str) -> HostUnreachable:
        """An error naming the machine."""
        return HostUnreachable(self.name, f"machine {self.name}: {message}")

    def answers(self) -> bool:
        """Whether the engine can still be reached: its SSH connection alive, or its TLS port
        taking connections (within LIVENESS_TIMEOUT)."""
        if self.ssh is not None:
            return not self.ssh.is_lost and self.ssh.reaches()
        url = urllib.parse.urlsplit(str(self.machine.docker_host))
        try:
            socket.create_connection((url.hostname or self.address, url.port or 2376), LIVENESS_TIMEOUT).close()
        except OSError:
            return False
        return True

    def close(self) -> None:
        self.client.close()
        if self.ssh is not None:
            self.ssh.close()


class _LabSSHAdapter(SSHHTTPAdapter):  # type: ignore[misc]
    """docker-py's SSH adapter on a connection the lab made (host key checked, key login),
    instead of one it would make itself from ~/.ssh; and with one pool of at most API_SESSIONS
    sessions for every call. (docker-py keeps a pool per URL, each holding its idle
    ``docker system dial-stdio`` sessions open: past a dozen different calls, more than sshd's
    MaxSessions of 10, and the next session is refused. docker/docker-py#2246)"""

    def __init__(self, connection: paramiko.SSHClient, timeout: int) -> None:
        self._given = connection
        self._pool: SSHConnectionPool | None = None
        self._pool_lock = threading.Lock()
        super().__init__("ssh://machine", timeout=timeout, max_pool_size=API_SESSIONS)

    def _create_paramiko_client(self, base_url: str) -> None:
        self.ssh_client = self._given
        self.ssh_params: dict[str, Any] = {}

    def _connect(self) -> None:
        """(connected already: a lost connection stays lost, and the calls on it fail)"""

    def get_connection(self, url: str, proxies: Any = None) -> SSHConnectionPool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = SSHConnectionPool(ssh_client=self.ssh_client, timeout=self.timeout, maxsize=API_SESSIONS,
                                               host=self.ssh_host)
                self._pool.block = True  # (a call waits for a free session rather than open another)
            return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        super().close()


def connect(machine: Machine, settings: SSHSettings, timeout: int = API_TIMEOUT) -> Engine:
    """The machine's engine, checked to answer; HostUnreachable naming the machine when it does not."""
    ssh = None if (machine.docker_host or "").startswith("tcp://") else SSHTransport(
        machine.ssh_host(), settings, what="machine")
    try:
        if ssh is None:
            cert = machine.cert_path or ""
            tls = TLSConfig(client_cert=(os.path.join(cert, "cert.pem"), os.path.join(cert, "key.pem")),
                            ca_cert=os.path.join(cert, "ca.pem"), verify=True)
            client = docker.DockerClient(base_url=str(machine.docker_host).replace("tcp://", "https://"), tls=tls,
                                         version=API_VERSION, timeout=timeout)
            # requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE override the CA given here (psf/requests#3829),
            # and would go through an HTTPS_PROXY: the engine is checked against docker_cert_path's CA alone
            client.api.trust_env = False
            address = _resolve(urllib.parse.urlsplit(str(machine.docker_host)).hostname or machine.address)
        else:
            address = ssh.own_address() or _resolve(machine.address)
            client = docker.DockerClient(base_url=f"ssh://{machine.name}", version=API_VERSION, timeout=timeout,
                                         use_ssh_client=True)  # (no connection made: ours is mounted next)
            adapter = _LabSSHAdapter(ssh.connection(), timeout)
            client.api.mount("http+docker://ssh", adapter)
            client.api._custom_adapter = adapter
        facts = _facts(client.info(), ssh)
    except HostUnreachable:
        if ssh is not None:
            ssh.close()
        raise
    except (DockerException, OSError, paramiko.SSHException, EOFError) as exc:
        if ssh is not None:
            ssh.close()
        via = "over SSH (is the docker command on its PATH, and may its user run it?)" if ssh else \
            f"at {machine.docker_host}"
        raise HostUnreachable(machine.name, f"machine {machine.name}: its Docker engine does not answer {via}: "
                                            f"{reason(exc)}") from None
    return Engine(machine, client, ssh, address, facts)


def connect_all(machines: Sequence[Machine], settings: SSHSettings, say: Say) -> list[Engine]:
    """Every machine's engine, checked; when any fails, the others are closed again and the
    error names each machine that failed, one line each."""
    engines, failed = connect_each(machines, settings)
    if failed:
        for e in engines:
            e.close()
        raise HostsUnreachable.of(failed)
    for e in engines:
        say(f"machine {e.name} ({e.address}): {e.facts.summary()}")
    return engines


def connect_each(machines: Sequence[Machine], settings: SSHSettings) -> tuple[list[Engine], list[HostUnreachable]]:
    """Every machine's engine, connected at once: those that answered, and the error of each that
    did not."""
    def attempt(machine: Machine) -> Engine | HostUnreachable:
        try:
            return connect(machine, settings)
        except HostUnreachable as exc:
            return exc

    found = each(attempt, machines)
    return [f for f in found if isinstance(f, Engine)], [f for f in found if isinstance(f, HostUnreachable)]


def check_engines(engines: Sequence[Engine], architecture: str) -> None:
    """Each engine new enough, and of the architecture the lab image was built for."""
    for e in engines:
        numbers = tuple(int(n) for n in re.findall(r"\d+", e.facts.version)[:2])
        if numbers < MIN_ENGINE:
            raise EngineError(f"machine {e.name}: Docker {e.facts.version} is too old; the lab needs "
                              f"{'.'.join(map(str, MIN_ENGINE))} or later")
        if e.facts.architecture != architecture:
            raise EngineError(f"machine {e.name}: it is {e.facts.architecture}, the lab image is {architecture}")


def _facts(info: dict[str, Any], ssh: SSHTransport | None) -> EngineFacts:
    memory, free = int(info.get("MemTotal") or 0), False
    if ssh is not None:
        status, out = ssh.run(ssh.connection(), "grep MemAvailable /proc/meminfo")
        fields = out.split()
        if status == 0 and len(fields) >= 2 and fields[1].isdigit():
            memory, free = int(fields[1]) * 1024, True
    return EngineFacts(str(info.get("ServerVersion", "?")), str(info.get("Architecture", "?")), memory, free,
                       int(info.get("NCPU") or 0), "nvidia" in (info.get("Runtimes") or {}), info.get("Swarm") or {})


def _resolve(name: str) -> str:
    try:
        return str(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError:
        return name
