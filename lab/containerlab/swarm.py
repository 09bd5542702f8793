"""The machines' Swarm: joined for a lab, left again as it was found.

A lab across machines needs their engines in one Swarm, for its attachable overlay network.
Machines already in a Swarm stay in it (a manager among them leads; a Swarm of theirs is never
left or changed but for the overlay); machines in none join the leader's, or, when none is in
one, the first machine starts one. Each node the lab joined (or whose Swarm it started) gets
the node label ``lab.joined``: ``lab down`` of the last lab on the Swarm takes exactly those
out again, workers first, so every machine ends in the state ``lab up`` found it in.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from docker.errors import APIError, NotFound

from lab.containerlab.engine import EngineError, Say, reason
from lab.containerlab.machines import Engine
from lab.containerlab.topology import LABEL, NAME_LABEL

JOINED_LABEL = "lab.joined"  # on a swarm node that lab up put in the swarm
SWARM_PORT = 2377
READY_WAIT = 60.0  # seconds a machine's swarm node may take to be ready (a machine back up reports in again)
READY_POLL = 0.5


def _state(engine: Engine) -> str:
    return str(engine.facts.swarm.get("LocalNodeState") or "inactive")


def _cluster(engine: Engine) -> str | None:
    return (engine.facts.swarm.get("Cluster") or {}).get("ID")


def leader(engines: Sequence[Engine]) -> Engine:
    """The manager the lab works through: one the machines' Swarm already has, else the first
    machine (whose Swarm ``join`` starts). EngineError when the machines are in Swarms the lab
    cannot use as they are."""
    for e in engines:
        if _state(e) not in ("inactive", "active"):
            raise EngineError(f"machine {e.name}: its swarm is {_state(e)}; mend it (docker swarm leave, or "
                              "join again) before lab up")
    active = [e for e in engines if _state(e) == "active"]
    managers = [e for e in active if e.facts.swarm.get("ControlAvailable")]
    if active and not managers:
        raise EngineError(f"machine {active[0].name} is in a swarm whose managers are not in the machines file: "
                          "add a manager of that swarm to it")
    clusters = {_cluster(e) for e in managers}
    if len(clusters) > 1:
        raise EngineError(f"machines {managers[0].name} and "
                          f"{next(e.name for e in managers if _cluster(e) != _cluster(managers[0]))} manage "
                          "different swarms; the lab runs in one")
    chosen = managers[0] if managers else engines[0]
    if managers:
        members = {node.id for node in chosen.client.nodes.list()}
        strangers = [e.name for e in active if e.facts.swarm.get("NodeID") not in members]
        if strangers:
            raise EngineError(f"machine {strangers[0]} is in another swarm than {chosen.name}'s; the lab runs in one")
    return chosen


def join(engines: Sequence[Engine], manager: Engine, say: Say) -> list[Engine]:
    """Every machine in the manager's Swarm (started on the manager if it has none); the
    engines the lab put in, each labelled ``lab.joined``."""
    joined: list[Engine] = []
    try:
        if _state(manager) != "active":
            say(f"machine {manager.name}: starting a swarm there (lab down ends it again)")
            _call(manager, "cannot start a swarm", lambda: manager.client.swarm.init(
                advertise_addr=manager.address, listen_addr=f"0.0.0.0:{SWARM_PORT}"))
            joined.append(manager)
        token = manager.client.swarm.attrs["JoinTokens"]["Worker"]
        for e in engines:
            if e is not manager and _state(e) != "active":
                say(f"machine {e.name}: joining the swarm of {manager.name}")
                _call(e, "cannot join the swarm", lambda e=e: e.client.swarm.join(  # type: ignore[misc]
                    remote_addrs=[f"{manager.address}:{SWARM_PORT}"], join_token=token,
                    advertise_addr=e.address, listen_addr=f"0.0.0.0:{SWARM_PORT}"))
                joined.append(e)
        for e in joined:
            _label(manager, str(e.client.info()["Swarm"]["NodeID"]))
    except BaseException:
        leave(joined, manager, say)
        raise
    return joined


def wait_until_ready(engines: Sequence[Engine], manager: Engine, say: Say) -> None:
    """Until the manager sees each engine's swarm node ready. A machine that has just come back
    up is in the swarm but its node is "down" for some seconds, and a container started there
    meanwhile cannot attach to the overlay network (the manager allocates its address).
    EngineError naming the machine when one is not ready within READY_WAIT."""
    nodes = {e.name: str(e.client.info()["Swarm"].get("NodeID")) for e in engines}
    deadline, told = time.monotonic() + READY_WAIT, set[str]()
    while True:
        states = {n.id: str((n.attrs.get("Status") or {}).get("State")) for n in manager.client.nodes.list()}
        waiting = {name: states.get(node, "not a member") for name, node in nodes.items()
                   if states.get(node) != "ready"}
        if not waiting:
            return
        for name in waiting.keys() - told:
            say(f"machine {name}: waiting for its swarm node to be ready ({waiting[name]} as {manager.name} sees it)")
            told.add(name)
        if time.monotonic() > deadline:
            name = next(iter(waiting))
            raise EngineError(f"machine {name}: its swarm node is still {waiting[name]} as {manager.name} sees it "
                              f"after {READY_WAIT:.0f}s (is its dockerd up, and TCP {SWARM_PORT} to "
                              f"{manager.address} open?)")
        time.sleep(READY_POLL)


def _label(manager: Engine, node_id: str) -> None:
    node = manager.client.nodes.get(node_id)
    spec = dict(node.attrs["Spec"])
    spec["Labels"] = {**(spec.get("Labels") or {}), JOINED_LABEL: "1"}
    node.update(spec)


def leave_if_unused(engines: Sequence[Engine], manager: Engine, lab: str, say: Say,
                    only_marked: bool = False) -> None:
    """Take out of the swarm the machines ``lab`` put in it, as far as no other lab needs them:
    ``engines`` (``only_marked``: those whose node carries ``lab.joined``). A worker leaves unless
    another lab's hosts run on it; the manager leaves (the swarm ends) only when no other lab has
    its overlay on the swarm and no other node the lab put in is left in it (a node outside
    ``engines``, another machines file's: it would be stranded in a swarm with no manager).
    Never raises: what cannot be told or done is a line, and the machines stay."""
    try:
        marked = {n.id: str(n.attrs["Description"]["Hostname"])
                  for n in manager.client.nodes.list(filters={"node.label": JOINED_LABEL})}
        nodes = {e.name: str(e.client.info()["Swarm"].get("NodeID")) for e in engines}
        leaving = [e for e in engines if (not only_marked or nodes[e.name] in marked) and
                   (e is manager or not _hosts_other_labs(e, lab))]
        strangers = sorted(name for node, name in marked.items() if node not in nodes.values())
        used = in_use(manager, besides=lab)
    except Exception as exc:  # (best effort, as all undoing)
        say(f"machine {manager.name}: cannot tell which machines may leave the swarm ({reason(exc)}); they stay")
        return
    if manager in leaving and (used or strangers):
        if strangers:
            say(f"machine {manager.name} stays in the swarm and manages it: {', '.join(strangers)}, put in it by "
                "lab up from another machines file, still are")
        leaving.remove(manager)
    leave(leaving, manager, say)


def _hosts_other_labs(engine: Engine, lab: str) -> bool:
    found = engine.client.containers.list(all=True, ignore_removed=True, filters={"label": LABEL})
    return any(c.labels.get(NAME_LABEL) != lab for c in found)


def in_use(manager: Engine, besides: str) -> bool:
    """Whether a lab other than ``besides`` has its overlay network on the swarm. (Not "any lab":
    the manager may still list the network of ``besides`` for a moment after removing it.)"""
    return any((n.attrs.get("Labels") or {}).get(NAME_LABEL) != besides
               for n in manager.client.networks.list(filters={"label": LABEL, "driver": "overlay"}))


def leave(joined: Sequence[Engine], manager: Engine, say: Say) -> None:
    """Take ``joined`` out of the swarm again: workers first, each removed from the manager's
    list, then the manager (its swarm ends) if it is one of them. Never raises: a machine that
    cannot leave is one line."""
    for e in (*[e for e in joined if e is not manager], *[e for e in joined if e is manager]):
        try:
            node_id = e.client.info()["Swarm"].get("NodeID")
            _leave(e, force=e is manager, say=say)
            if e is not manager and node_id:
                _remove_node(manager, node_id)
            say(f"machine {e.name}: left the swarm")
        except Exception as exc:  # (never raises: the next machine all the same)
            say(f"machine {e.name}: cannot leave the swarm: {reason(exc)}")


def _leave(engine: Engine, force: bool, say: Say) -> None:
    """A worker leaves telling the manager; when the manager does not answer it in time (as for a
    machine that came back up lately: "context deadline exceeded"), it leaves on its own
    (``--force``): the manager's list loses the node all the same (_remove_node)."""
    try:
        engine.client.swarm.leave(force=force)
    except APIError as exc:
        if force:
            raise
        say(f"machine {engine.name}: its swarm's manager did not see it leave ({reason(exc)}): leaving on its own")
        engine.client.swarm.leave(force=True)


def _remove_node(manager: Engine, node_id: str) -> None:
    try:
        manager.client.api.remove_node(node_id, force=True)
    except NotFound:
        pass


def _call(engine: Engine, doing: str, action: Callable[[], object]) -> None:
    try:
        action()
    except APIError as exc:
        raise EngineError(f"machine {engine.name}: {doing}: {reason(exc)}") from None
