"""A network of its own for each share on a lab's hosts: ``lab grade --hosts --parallel K`` on a
plain lab of this machine's engine runs each share's submissions through *share hosts*.

The kernel keeps one port space per network namespace: shares that run as users of one host
(lab.containerlab.shares) still share its ports, so a submission that binds every ephemeral port
leaves the other share's gloo nothing to listen on (bind to port 0) and nothing to connect from.
A share host is host i as one share's user sees it, with a network namespace of its own:

* a container on the share's own network (``LAB-shareN``, one per share user, on a /24 of its own),
  in host i's PID namespace;
* running host i's own sshd (its binary, configuration and host key, its users) in host i's mount
  and UTS namespaces, entered by nsenter, and letting in the share's user alone.

So a share's session has the host's files, processes, limits and control groups (the share's
groups, lab.containerlab.shares), and its own address, ports and System V IPC objects. The engine
keeps two of its networks apart (no route between two bridges), so a share reaches its own ranks
on every host and nothing of another share's or of a host's own address; the grader reaches each
share host's sshd as it reaches the hosts' (from the engine's host).

The container keeps sshd's capabilities and two more: SYS_ADMIN (nsenter joins the host's mount
namespace with it) and SETPCAP (to drop both from the bounding set of sshd and of everything it
starts); no new privileges besides. ``lab down`` removes share hosts with the lab, ``lab up``
with a host it makes anew; the next ``lab grade`` makes them again (a second or two).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.models.containers import Container

from lab.containerlab import sshd, state
from lab.containerlab.engine import EngineError, Say, each, reason
from lab.containerlab.helper import running_host
from lab.containerlab.networks import claim_network
from lab.containerlab.resources import lab_containers
from lab.containerlab.topology import LABEL, NAME_LABEL, ROLE, SHAPED_LABEL, SHARE_ROLE, HostLimits, Topology

USER_LABEL = "lab.share-user"  # a share host's: the share user it lets in
HOST_LABEL = "lab.share-host"  # a share host's: the index of the host it is a door to
INTERFACE = "eth0"  # a share host's interface on its share's network (the ranks' GLOO_SOCKET_IFNAME)
CAPABILITIES = (*HostLimits.CAPABILITIES, "SYS_ADMIN", "SETPCAP")
# In the container (PID 1 of its PID namespace is host i's init): into the host's mount and UTS
# namespaces, SYS_ADMIN and SETPCAP out of the bounding set, then the host's sshd for one user.
ENTER = ["nsenter", "--target", "1", "--mount", "--uts", "--", "setpriv", "--inh-caps=-all",
         "--bounding-set=-sys_admin,-setpcap", "--"]
LOG_CONFIG = docker.types.LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"})


@dataclass(frozen=True)
class ShareHost:
    """Host ``host`` of a lab as share user ``user`` reaches it: at ``address``, on the share's network."""

    host: int
    user: str
    address: str
    container: Container


def network_name(topology: Topology, user: str) -> str:
    return f"{topology.lab}-{user}"


def container_name(topology: Topology, i: int, user: str) -> str:
    return f"{topology.container(i)}-{user}"


def known_hosts(lab: str, user: str) -> Path:
    """The known_hosts of lab ``lab``'s share hosts for ``user`` (each names its host's key at its address)."""
    return state.lab_dir(lab) / "shares" / f"{user}.known_hosts"


def ensure(client: docker.DockerClient, topology: Topology, wanted: Sequence[tuple[int, str]],
           say: Say) -> dict[tuple[int, str], ShareHost]:
    """The share host of each (host index, share user) in ``wanted``, running and answering SSH: kept
    where it runs in its host's current namespaces, made anew where not; each user's known_hosts
    written. One line naming the host and the user when one cannot be made."""
    users = sorted({user for _, user in wanted})
    labels = {LABEL: "1", NAME_LABEL: topology.lab, ROLE: SHARE_ROLE}
    try:
        networks = {user: claim_network(client, network_name(topology, user), labels, topology.subnet, say)
                    for user in users}
    except DockerException as exc:
        raise EngineError(f"lab {topology.lab}: cannot make the shares' networks: {reason(exc)}") from None
    found = each(lambda at: _kept_or_made(client, topology, *at, networks[at[1]].name, say), wanted)
    sshd.wait_for_ssh({s.container.name: (s.address, 22) for s in found},
                      {s.container.name: s.container for s in found})
    hosts = sorted({s.host for s in found})
    keys = dict(zip(hosts, each(lambda i: sshd.host_key(running_host(client, topology, i)), hosts)))
    for user in users:
        state.write(known_hosts(topology.lab, user),
                    "".join(f"{s.address} {keys[s.host]}\n" for s in found if s.user == user).encode())
    return {(s.host, s.user): s for s in found}


def running(client: docker.DockerClient, lab: str) -> list[ShareHost]:
    """The lab's share hosts that run."""
    found = []
    for c in lab_containers(client, lab):
        if c.labels.get(ROLE) == SHARE_ROLE and c.status == "running":
            address = next((n.get("IPAddress") for n in c.attrs["NetworkSettings"]["Networks"].values()
                            if n.get("IPAddress")), None)
            if address and c.labels.get(HOST_LABEL, "").isdigit():
                found.append(ShareHost(int(c.labels[HOST_LABEL]), c.labels.get(USER_LABEL, ""), address, c))
    return found


def _kept_or_made(client: docker.DockerClient, topology: Topology, i: int, user: str, network: str,
                  say: Say) -> ShareHost:
    host = running_host(client, topology, i)
    name = container_name(topology, i, user)
    try:
        try:
            c = client.containers.get(name)
            if _keeps(c, host, network):
                return _share_host(c, i, user, network)
            c.remove(force=True)
        except NotFound:
            pass
        say(f"starting {name} (host {topology.name(i)} for {user}, on {network})")
        config = host.attrs["HostConfig"]
        try:
            c = client.containers.run(
                host.image.id, [*ENTER, "/usr/sbin/sshd", "-D", "-e", "-o", "PidFile=none", "-o", f"AllowUsers={user}"],
                entrypoint=[], name=name, detach=True, network=network, pid_mode=f"container:{host.id}",
                cap_drop=["ALL"], cap_add=list(CAPABILITIES), security_opt=["no-new-privileges"],
                mem_limit=config.get("Memory") or None, pids_limit=config.get("PidsLimit") or None,
                device_requests=_gpus(config) or None, log_config=LOG_CONFIG,
                labels={**topology.labels(SHARE_ROLE), SHAPED_LABEL: host.name, USER_LABEL: user, HOST_LABEL: str(i)})
        except APIError as exc:
            if exc.status_code != 409:  # (409: another grader of the lab made it meanwhile)
                raise
            c = client.containers.get(name)
        c.reload()
        if c.status != "running":
            logs = c.logs(tail=3).decode(errors="replace").strip().splitlines()
            raise EngineError(f"host {topology.name(i)}: the share host {name} for {user} stopped ({c.status}): "
                              f"{logs[-1] if logs else 'no output'}")
        return _share_host(c, i, user, network)
    except DockerException as exc:
        raise EngineError(f"host {topology.name(i)}: cannot start the share host {name} for {user}: "
                          f"{reason(exc)}") from None


def _gpus(config: dict[str, Any]) -> list[docker.types.DeviceRequest]:
    """The host's GPUs (its device requests), for the share's ranks: the devices a process may open are
    its container's (the share host's) to allow."""
    return [docker.types.DeviceRequest(driver=r.get("Driver") or "", count=r.get("Count") or 0,
                                       device_ids=r.get("DeviceIDs"), capabilities=r.get("Capabilities"),
                                       options=r.get("Options")) for r in config.get("DeviceRequests") or []]


def _keeps(c: Container, host: Container, network: str) -> bool:
    """Whether a share host runs in ``host``'s current namespaces, on the share's network."""
    return (c.status == "running" and c.attrs["HostConfig"].get("PidMode") == f"container:{host.id}"
            and bool((c.attrs["NetworkSettings"]["Networks"].get(network) or {}).get("IPAddress")))


def _share_host(c: Container, i: int, user: str, network: str) -> ShareHost:
    return ShareHost(i, user, c.attrs["NetworkSettings"]["Networks"][network]["IPAddress"], c)
