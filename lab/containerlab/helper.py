"""Short-lived helpers: a container with NET_ADMIN that joins one lab host's network namespace,
runs one shell script there and goes, so the host itself never needs the capability (its
routes in the cross-VPC lab, the faults of ``lab break``, the shares' packet filter); one with
SYS_ADMIN in a host's mount namespace (the shares' control groups); and root's shell inside a host."""
from __future__ import annotations

import shlex

import docker
from docker.errors import APIError, ContainerError, NotFound
from docker.models.containers import Container

from lab.containerlab.engine import EngineError, reason
from lab.containerlab.topology import Topology

ROLE_NAME = "helper"


def running_host(client: docker.DockerClient, topology: Topology, i: int) -> Container:
    """Host i's container, running (else one line naming the host, and what to do)."""
    try:
        host = client.containers.get(topology.container(i))
    except NotFound:
        raise EngineError(f"host {topology.name(i)}: its container {topology.container(i)} is gone; "
                          f"run `python -m lab up --name {topology.lab}` again") from None
    if host.status != "running":
        raise EngineError(f"host {topology.name(i)}: {host.name} is {host.status}, not running")
    return host


def in_host(client: docker.DockerClient, topology: Topology, i: int, script: str) -> None:
    """Run ``script`` (sh) as root inside host i (its files: /etc/hosts, sshd's config); one line
    naming the host when it fails."""
    code, out = running_host(client, topology, i).exec_run(["sh", "-c", script], user="root")
    if code != 0:
        lines = bytes(out).decode("utf-8", "replace").strip().splitlines()
        raise EngineError(f"host {topology.name(i)}: {lines[-1] if lines else shlex.quote(script)} (exit {code})")


def in_namespace(client: docker.DockerClient, topology: Topology, i: int, script: str,
                 image: str | None = None) -> str:
    """Run ``script`` (sh) with NET_ADMIN in host i's network namespace; its output. ``image``:
    the host's own by default."""
    host = running_host(client, topology, i)
    return _helper(client, topology, i, image or host.image.id, ["sh", "-c", script], "in its network namespace",
                   network_mode=f"container:{host.id}", cap_add=["NET_ADMIN"])


def in_mounts(client: docker.DockerClient, topology: Topology, i: int, script: str) -> str:
    """Run ``script`` (sh) as root in host i's mount namespace, entered through its init's (in its
    PID namespace), with the engine's cgroup namespace and SYS_ADMIN (to mount) and CHOWN; its
    output. How a host gets mounts of its own without keeping the capability."""
    host = running_host(client, topology, i)
    argv = ["nsenter", "--target", "1", "--mount", "--", "sh", "-c", script]
    return _helper(client, topology, i, host.image.id, argv, "in its mount namespace",
                   pid_mode=f"container:{host.id}", cgroupns="host",
                   cap_add=["SYS_ADMIN", "SYS_PTRACE", "SYS_CHROOT", "CHOWN"])


def _helper(client: docker.DockerClient, topology: Topology, i: int, image: str, argv: list[str], where: str,
            **config: object) -> str:
    """``argv`` in a helper container with no capability but ``config``'s, removed after; its
    output (one line naming the host when it fails or cannot start)."""
    try:
        out = client.containers.run(image, argv, entrypoint=[], cap_drop=["ALL"], security_opt=["no-new-privileges"],
                                    remove=True, labels=topology.labels(ROLE_NAME), **config)
    except ContainerError as exc:
        error = bytes(exc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise EngineError(f"host {topology.name(i)}: {error[-1] if error else exc}") from None
    except APIError as exc:
        raise EngineError(f"host {topology.name(i)}: cannot start a helper {where}: {reason(exc)}") from None
    return bytes(out).decode("utf-8", "replace")
