"""A lab's containers, networks and volumes on an engine, found again by their labels
(``topology``): every lookup here is for one lab, by its name, and leaves the other labs on the
engine alone."""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import docker
from docker.models.containers import Container
from docker.models.networks import Network
from docker.models.volumes import Volume

from lab.containerlab.engine import EngineError
from lab.containerlab.topology import DEFAULT_LAB, LABEL, NAME_LABEL, OWNER_LABEL, ROLE, SANDBOX_ROLE


def of_lab(labels: Mapping[str, str] | None, lab: str | None) -> bool:
    """Whether something with these labels belongs to ``lab`` (None: to any lab). Things made
    before labs had names belong to the default lab."""
    return lab is None or (labels or {}).get(NAME_LABEL, DEFAULT_LAB) == lab


def claim(c: Container, lab: str, where: str = "") -> None:
    """EngineError unless ``c`` is a container of ``lab``: one of the same name that is not is
    someone else's, and the lab never removes it."""
    if LABEL not in c.labels or not of_lab(c.labels, lab):
        raise EngineError(f"a container named {c.name}{where} is not lab {lab}'s: remove or rename it, or give "
                          f"the lab another --name")


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine is alive (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def graded_now(labels: Mapping[str, str]) -> bool:
    """Whether a container is a sandbox whose grader still runs on this machine (its owner label): the
    grader's to remove as the submission ends, not a lab's (a killed grader's is the lab's again)."""
    host, _, pid = labels.get(OWNER_LABEL, "").rpartition(":")
    return labels.get(ROLE) == SANDBOX_ROLE and host == socket.gethostname() and pid.isdigit() and alive(int(pid))


def lab_containers(client: docker.DockerClient, lab: str | None = DEFAULT_LAB) -> list[Container]:
    """The containers of ``lab`` (None: of every lab), by name; a live grader's sandboxes are its own."""
    found = client.containers.list(all=True, ignore_removed=True, filters={"label": LABEL})
    return sorted((c for c in found if of_lab(c.labels, lab) and not graded_now(c.labels)), key=lambda c: c.name)


def lab_networks(client: docker.DockerClient, lab: str | None = DEFAULT_LAB) -> list[Network]:
    return [n for n in client.networks.list(filters={"label": LABEL}) if of_lab(n.attrs.get("Labels"), lab)]


def lab_volumes(client: docker.DockerClient, lab: str | None) -> list[Volume]:
    """The volumes of ``lab`` (None: of every lab); a live grader's sandboxes' are its own."""
    return [v for v in client.volumes.list(filters={"label": LABEL})
            if of_lab(v.attrs.get("Labels"), lab) and not graded_now(v.attrs.get("Labels") or {})]


def lab_resources(client: docker.DockerClient, lab: str | None = DEFAULT_LAB) -> set[str]:
    """The ids (names for volumes) of every container, network and volume of ``lab``."""
    return ({c.id for c in lab_containers(client, lab)} | {n.id for n in lab_networks(client, lab)}
            | {v.name for v in lab_volumes(client, lab)})
