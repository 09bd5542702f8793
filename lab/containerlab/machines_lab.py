"""A lab across Docker machines: ``lab up --machines FILE``, and its ``down`` and ``status``.

The machines' engines join one Swarm (lab.containerlab.swarm); the lab's hosts are containers
placed across them, in blocks in the file's order (``--hosts N`` spread evenly, or
``lab_hosts`` per machine). Two ways to wire them:

* ``overlay`` (default): an attachable overlay network of the lab's own, each host at the
  address the Swarm gives it there, by name in the Swarm's DNS; its sshd is published on a port
  of its machine that the engine picks. The inventory names both. (A host made anew gets a new
  address: the Swarm hands out addresses in turn, never one just freed, for Docker's overlay
  can keep sending an address that moved to the machine that had it, or refuse to attach it
  there, for a while after: moby/moby#35401.)
* ``host``: one host per machine in the machine's own network namespace, on the machine's
  address (no VXLAN on the data path, as real multi-node training runs); its sshd listens on a
  port beside the machine's own: HOST_MODE_SSH_PORT, or the next one no other lab's host holds.

No registry is needed: a machine without the image's hash tag gets it from this machine's
engine (``docker save``, streamed into its ``docker load`` over the machine's SSH), once. No
file of the controller is mounted: the lab's public key goes into each container before it
starts. There is no directory every host mounts (file:// rendezvous needs NFS or the like).
A ``lab up`` that fails removes what it made on every machine and leaves each Swarm as found.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import docker
import paramiko
from docker.errors import APIError, DockerException, ImageNotFound
from docker.models.containers import Container

from lab.containerlab import containers, image, networks, sshd, state, swarm
from lab.containerlab import engine as local_engine
from lab.containerlab.containers import HostContainer
from lab.containerlab.engine import EngineError, Say, each, reason
from lab.containerlab.image import Progress
from lab.containerlab.lifecycle import HostStatus, Lab, LabStatus, NetworkMode, UpRequest
from lab.containerlab.machines import Engine, Machine, check_engines, connect_all, connect_each, load_machines
from lab.containerlab.networks import remove_network
from lab.containerlab.resources import lab_containers, lab_networks, lab_resources
from lab.containerlab.topology import (
    LABEL,
    NAME_LABEL,
    ROLE,
    SLOTS_LABEL,
    TOPOLOGY_LABEL,
    HostLimits,
    HostNames,
    LabPaths,
    check_lab_name,
    lab_inventory,
)
from lab.errors import HostsUnreachable, LabError, UsageError
from lab.net.subnets import Subnet, free_subnets, routes_in
from lab.transport.ssh.config import known_hosts_name
from lab.transport.ssh.settings import SSHSettings

MACHINE_LABEL = "lab.machine"  # on a host container: the machine it runs on
GOSSIP_WAIT = 90.0  # seconds with no machine learning of a host before the overlay is said not to work
REACH_WAIT = 30.0  # seconds for a host to reach another's sshd once the Swarm knows both
SSH_PORT_LABEL = "lab.ssh_port"  # on a host container in --network host: the port its sshd listens on
HOST_MODE_SSH_PORT = 2222
DEFAULT_OVERLAY = "10.215.0.0/24"
SEND_CHUNK = 1 << 20
ATTACH_WAIT = 90.0  # seconds an engine may fail to attach a container to the overlay before lab up gives up


@dataclass(frozen=True)
class Spread(HostNames):
    """Which lab, and which machine each of its hosts is on (``on[i-1]`` for node i)."""

    lab: str
    on: tuple[str, ...]
    network: NetworkMode
    slots: int = 1
    subnet: str = DEFAULT_OVERLAY
    ssh_port: int = HOST_MODE_SSH_PORT  # --network host: where the hosts' sshd listens

    def indices(self) -> range:
        return range(1, len(self.on) + 1)

    @property
    def overlay(self) -> str:
        return f"{self.lab}-overlay"

    def labels(self, i: int) -> dict[str, str]:
        return {LABEL: "1", NAME_LABEL: self.lab, ROLE: "host", TOPOLOGY_LABEL: f"machines-{self.network}",
                SLOTS_LABEL: str(self.slots), MACHINE_LABEL: self.on[i - 1],
                **({SSH_PORT_LABEL: str(self.ssh_port)} if self.network == "host" else {})}


def place(machines: Sequence[Machine], hosts_wanted: int | None, network: NetworkMode) -> tuple[str, ...]:
    """The machine of each host, in blocks in the file's order: ``lab_hosts`` where a machine
    sets it, the rest of ``hosts_wanted`` (default: one per such machine) shared evenly by the
    others; host mode puts one host on each machine."""
    if network == "host":
        chosen = [m for m in machines if m.lab_hosts != 0]
        if any((m.lab_hosts or 1) != 1 for m in chosen) or hosts_wanted not in (None, len(chosen)):
            raise UsageError(f"--network host runs one host per machine ({len(chosen)} here): set no --hosts "
                             f"and no lab_hosts but 0 or 1")
        return tuple(m.name for m in chosen)
    fixed = sum(m.lab_hosts or 0 for m in machines)
    free = [m for m in machines if m.lab_hosts is None]
    total = hosts_wanted if hosts_wanted is not None else fixed + len(free)
    rest = total - fixed
    if rest < 0 or (rest and not free) or (free and rest < len(free) and hosts_wanted is not None and rest < 1):
        raise UsageError(f"--hosts {total}: the machines file places {fixed} host(s) with lab_hosts"
                         f"{f' and {len(free)} machine(s) share the rest' if free else ''}; make them agree")
    counts = {m.name: m.lab_hosts for m in machines if m.lab_hosts is not None}
    for k, m in enumerate(free):
        counts[m.name] = rest // len(free) + (k < rest % len(free))
    on = tuple(m.name for m in machines for _ in range(counts[m.name] or 0))
    if not on:
        raise UsageError("the lab needs at least one host")
    return on


@dataclass(frozen=True)
class MachinesLab(Lab):
    """A lab across the Docker machines of ``machines``, joined in a Swarm."""

    machines: str  # the machines file: --machines, else the one `lab up --machines` recorded
    given: bool = True  # whether --machines named it (`lab up` without is for this machine's engine)

    across_machines: ClassVar[bool] = True

    def up(self, request: UpRequest, say: Say, progress: Progress) -> Path:
        """Start the lab across the machines and write its inventory; the inventory's path."""
        if not self.given:
            request.refuse_machine_options()
            raise UsageError(self._across(self.machines))
        if request.topology != "plain" or request.scheduler != "none":
            raise UsageError("--machines starts a plain lab: the machines' network is the topology, and Slurm "
                             "across machines is not supported yet")
        check_lab_name(self.name)
        if request.slots < 1:
            raise UsageError("--slots must be at least 1")
        machines = load_machines(self.machines)
        spread = Spread(self.name, place(machines, request.hosts, request.network), request.network, request.slots)
        paths = self.paths
        machines_file = str(Path(self.machines).resolve())
        recorded = recorded_machines(paths)
        if recorded not in (None, machines_file):
            raise UsageError(self._across(recorded))
        local = local_engine.ensure_engine(say)  # (the image is built here, then sent)
        try:
            if lab_containers(local, self.name):
                raise UsageError(f"a lab named {self.name} runs on this machine's engine; give the lab across "
                                 "machines another --name")
            sshd.ensure_key(paths.key, say)
            tag = image.ensure_image(local, request.base, paths.state, say, progress)
            settings = SSHSettings(accept_new_host_keys=request.accept_new_host_keys)
            engines = connect_all(machines, settings, say)  # (every machine: a manager may host no lab host)
            try:
                check_engines(engines, str(local.info().get("Architecture")))
                _say_if_short_of_memory(engines, spread, request.limits, say)
                state.write(paths.machines_record, f"{machines_file}\n".encode())  # (before anything starts
                # there: `lab down --name` finds the machines again)
                try:
                    self._bring_up_on(engines, spread, local, tag, request, say, progress)
                except BaseException as exc:
                    if recorded is None and not _anything_left(engines, self.name):
                        paths.machines_record.unlink(missing_ok=True)
                    if isinstance(exc, ENGINE_FAILURES):
                        raise failed_machine(engines, exc) from None
                    raise
            finally:
                for e in engines:
                    e.close()
        finally:
            local.close()
        return paths.inventory

    def down(self, say: Say) -> int:
        """Remove the lab's containers and networks on every machine of the file, and take the
        machines the lab put in a swarm out again once no lab uses it; how many things went.
        Unreachable machines are one line each (HostsUnreachable, after the others are clean)."""
        engines, lost = connect_each(load_machines(self.machines), SSHSettings())
        try:
            managers = [e for e in engines if e.client.info()["Swarm"].get("ControlAvailable")]
            removed = _remove(engines, self.name, say, manager=managers[0] if managers else None)
            if managers:
                swarm.leave_if_unused(engines, managers[0], self.name, say, only_marked=True)
        except ENGINE_FAILURES as exc:
            raise failed_machine(engines, exc) from None
        finally:
            for e in engines:
                e.close()
        if lost:
            raise HostsUnreachable.of(lost)
        self.paths.machines_record.unlink(missing_ok=True)
        say(f"lab {self.name} is down on every machine ({removed} removed)" if removed else
            f"lab {self.name}: nothing to remove on the machines")
        return removed

    def status(self) -> LabStatus:
        """The lab's hosts on every machine, and the machines that did not answer."""
        engines, lost = connect_each(load_machines(self.machines), SSHSettings())
        try:
            return LabStatus([h for found in each(lambda e: _hosts_on(e, self.name), engines) for h in found], lost)
        except ENGINE_FAILURES as exc:
            raise failed_machine(engines, exc) from None
        finally:
            for e in engines:
                e.close()

    def _bring_up_on(self, engines: list[Engine], spread: Spread, local: docker.DockerClient, tag: str,
                     request: UpRequest, say: Say, progress: Progress) -> None:
        by_name = {e.name: e for e in engines}
        hosting = [by_name[n] for n in dict.fromkeys(spread.on)]
        _remove_unwanted(engines, spread, say)
        before = {e.name: lab_resources(e.client, spread.lab) for e in engines}
        manager, joined = None, []
        try:
            if spread.network == "overlay":
                manager = swarm.leader(engines)
                joined = swarm.join(list(dict.fromkeys([manager, *hosting])), manager, say)
                swarm.wait_until_ready(hosting, manager, say)
                spread = _with_overlay(manager, engines, spread, say)
            else:
                spread = replace(spread, ssh_port=_host_mode_port(hosting, spread.lab))
            each(lambda e: send_image(local, e, tag, say, progress), hosting)
            public_key = self.paths.key.with_suffix(".pub").read_bytes()
            started = containers.start_hosts([(by_name[spread.on[i - 1]].client,
                                               _host(by_name[spread.on[i - 1]], spread, i, tag, public_key, request))
                                              for i in spread.indices()], say)
            ports = [_ssh_port(c, spread) for c in started]
            data = {spread.name(i): _overlay_address(c, spread) if spread.network == "overlay" else
                    by_name[spread.on[i - 1]].address for i, c in zip(spread.indices(), started)}
            machine = {m.name: m for m in (e.machine for e in engines)}
            at = {spread.name(i): (machine[spread.on[i - 1]].address, ports[i - 1]) for i in spread.indices()}
            sshd.collect_host_keys(self.paths.known_hosts, {known_hosts_name(*at[spread.name(i)]): c
                                                            for i, c in zip(spread.indices(), started)})
            sshd.wait_for_ssh(at, {spread.name(i): c for i, c in zip(spread.indices(), started)})
            if spread.network == "overlay":
                _wait_for_overlay(hosting, spread, started, data)
        except BaseException:
            removed = _remove(engines, spread.lab, say, spare=before, manager=manager)
            if joined and manager is not None:
                swarm.leave_if_unused(joined, manager, spread.lab, say)
            say(f"lab up did not finish: removed the {removed} container(s) and network(s) it created")
            raise
        self._write_inventory(spread, at, data, say)

    def _write_inventory(self, spread: Spread, at: dict[str, tuple[str, int]], data: dict[str, str],
                         say: Say) -> None:
        """The lab's inventory: each host where SSH reaches it (``at``), its data address and machine."""
        inventory = {spread.name(i): {"ansible_host": at[spread.name(i)][0], "ansible_port": at[spread.name(i)][1],
                                      "data_address": data[spread.name(i)], "machine": spread.on[i - 1]}
                     for i in spread.indices()}
        about = (f"The lab {spread.lab} across Docker machines ({spread.network} network), written by "
                 f"`python -m lab up --machines {self.machines}`.")
        self.paths.inventory.write_text(lab_inventory(spread.lab, spread.slots, inventory, about, shared=False))
        placed = ", ".join(f"{n}: {spread.on.count(n)}" for n in dict.fromkeys(spread.on))
        say(f"wrote {self.inventory}: lab {spread.lab}, {len(spread.on)} hosts x {spread.slots} slot(s) on "
            f"{len(set(spread.on))} machine(s) ({placed}), {spread.network} network"
            f"{f' {spread.subnet}' if spread.network == 'overlay' else ''}")

    def _across(self, machines: str) -> str:
        return (f"lab {self.name} is across the machines of {machines}: `python -m lab down --name {self.name}` "
                "first, or give this lab another --name")


def recorded_machines(paths: LabPaths) -> str | None:
    """The machines file the lab was brought up across (``lab up --machines``), if it was."""
    record = paths.machines_record
    return record.read_text().strip() if state.check_file(record) else None


def _anything_left(engines: Sequence[Engine], lab: str) -> bool:
    """Whether a container of the lab is still on a machine (or a machine cannot say)."""
    for e in engines:
        try:
            if lab_containers(e.client, lab):
                return True
        except Exception:  # (a machine gone: what may be on it is not known)
            return True
    return False


def _say_if_short_of_memory(engines: Sequence[Engine], spread: Spread, limits: HostLimits, say: Say) -> None:
    """A line for each machine whose free memory is less than its hosts may use (--memory each):
    a limit is no reservation, so the lab starts, but a job there may be killed for memory."""
    for e in engines:
        hosts_here = spread.on.count(e.name)
        wanted = hosts_here * (limits.memory_mb << 20)
        if hosts_here and e.facts.memory < wanted:
            say(f"machine {e.name}: its {hosts_here} host(s) may use {wanted / 2**30:.1f} GiB (--memory "
                f"{limits.memory_mb} each) and it has {e.facts.memory_text}: jobs there may run out")


def _remove_unwanted(engines: Sequence[Engine], spread: Spread, say: Say) -> None:
    """Remove the lab's hosts that the lab no longer has where they are (it has fewer hosts now,
    or they are placed otherwise): each would hold a name and an address a host wants."""
    wanted = {(spread.container(i), machine) for i, machine in zip(spread.indices(), spread.on)}
    for e in engines:
        for c in lab_containers(e.client, spread.lab):
            if (c.name, e.name) not in wanted:
                say(f"machine {e.name}: removing {c.name} (not in this lab's {len(spread.on)} host(s) there)")
                c.remove(force=True, v=True)


def _host_mode_port(engines: Sequence[Engine], lab: str) -> int:
    """The port the lab's sshd listens on in --network host, the same on each of its machines:
    the one it has there already, else the first from HOST_MODE_SSH_PORT that no other lab's
    host-mode sshd on these machines holds."""
    own: set[int] = set()
    taken: set[int] = set()
    for e in engines:
        for c in lab_containers(e.client, None):
            if SSH_PORT_LABEL in c.labels:
                (own if c.labels.get(NAME_LABEL) == lab else taken).add(int(c.labels[SSH_PORT_LABEL]))
    if len(own) == 1 and not own & taken:
        return own.pop()
    return next(port for port in range(HOST_MODE_SSH_PORT, 65536) if port not in taken)


def _with_overlay(manager: Engine, engines: Sequence[Engine], spread: Spread, say: Say) -> Spread:
    """The lab's overlay network on the swarm (made on the manager), on a subnet no network of
    any machine, nor any route of theirs, overlaps."""
    existing = [n for n in lab_networks(manager.client, spread.lab) if n.name == spread.overlay]
    if existing:
        subnets = [c["Subnet"] for c in (existing[0].attrs.get("IPAM") or {}).get("Config") or []]
        if subnets:
            return replace(spread, subnet=subnets[0])
    taken = [s for e in engines for s in networks.engine_subnets(e.client) + _routes(e)]
    subnet = free_subnets([DEFAULT_OVERLAY], taken)[0]
    ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)])
    say(f"creating overlay network {spread.overlay} ({subnet}) on the swarm of {manager.name}")
    try:
        manager.client.networks.create(spread.overlay, driver="overlay", attachable=True, ipam=ipam,
                                       labels={LABEL: "1", NAME_LABEL: spread.lab})
    except APIError as exc:
        raise EngineError(f"machine {manager.name}: cannot create the overlay network {spread.overlay}: "
                          f"{reason(exc)}") from None
    return replace(spread, subnet=subnet)


def _routes(engine: Engine) -> list[Subnet]:
    """The networks the machine routes to, where SSH can ask it."""
    if engine.ssh is None:
        return []
    status, out = engine.ssh.run(engine.ssh.connection(), " ".join(networks.ROUTES_COMMAND))
    return routes_in(out) if status == 0 else []


def send_image(local: docker.DockerClient, engine: Engine, tag: str, say: Say, progress: Progress) -> None:
    """The lab image on the machine: sent from this machine's engine (``docker save`` into the
    machine's ``docker load``) unless it has that hash tag already."""
    try:
        engine.client.images.get(tag)
        return
    except ImageNotFound:
        pass
    except (APIError, DockerException) as exc:
        raise engine.fail(f"cannot look up image {tag}: {reason(exc)}") from None
    size = int(local.images.get(tag).attrs.get("Size") or 0)
    say(f"machine {engine.name}: sending image {tag} ({size / 1e9:.1f} GB; once, while it lacks this tag)")
    started = time.monotonic()
    try:
        for chunk in engine.client.api.load_image(_counted(local.api.get_image(tag, chunk_size=SEND_CHUNK),
                                                           engine.name, size, progress)):
            if "error" in chunk:
                raise engine.fail(f"docker load of {tag} failed: {str(chunk['error']).strip()[:300]}")
        engine.client.images.get(tag)
    except (APIError, DockerException, OSError) as exc:
        raise engine.fail(f"cannot send image {tag}: {reason(exc)}") from None
    say(f"machine {engine.name}: image {tag} loaded in {time.monotonic() - started:.0f}s")


def _counted(chunks: Iterator[bytes], machine: str, size: int, progress: Progress) -> Iterator[bytes]:
    sent, shown = 0, 0.0
    for chunk in chunks:
        sent += len(chunk)
        if time.monotonic() - shown > 1:
            shown = time.monotonic()
            progress(f"{machine}: {sent / 1e6:,.0f} of about {size / 1e6:,.0f} MB sent")
        yield chunk


def _host(engine: Engine, spread: Spread, i: int, tag: str, public_key: bytes, request: UpRequest) -> HostContainer:
    """Host i's container on its machine: on the overlay (at the address the Swarm gives it), its
    sshd published; or in the machine's network namespace, its sshd on the lab's port. The key is
    copied in."""
    overlay = spread.network == "overlay"
    return HostContainer(
        spread.container(i), spread.name(i), spread.labels(i), tag, request.limits,
        request.gpus == "all" or (request.gpus == "auto" and engine.facts.gpus), public_key,
        network=spread.overlay if overlay else None,
        machine=engine.name, publish_ssh=overlay, ssh_port=None if overlay else spread.ssh_port,
        attach_wait=ATTACH_WAIT)


# Run in a host: connect to each peer (argv: address:port...) until every one answers or the time is up;
# prints the peers that never did. Run once every machine's Swarm knows every host, when the kernel
# of the peer's machine answers at once; the time only bounds a network that drops the packets.
_REACH_PEERS = """
import socket, sys, time
pending, deadline = sys.argv[2:], time.monotonic() + float(sys.argv[1])
while pending and time.monotonic() < deadline:
    left = []
    for peer in pending:
        address, port = peer.rsplit(":", 1)
        try:
            socket.create_connection((address, int(port)), timeout=1).close()
        except OSError:
            left.append(peer)
    pending = left
    if pending:
        time.sleep(0.2)
print(" ".join(pending))
"""


def _wait_for_overlay(hosting: Sequence[Engine], spread: Spread, started: Sequence[Container],
                      addresses: dict[str, str]) -> None:
    """Until every host reaches every other's sshd at its overlay address (``addresses``: by host
    name), so that the lab's first run finds the network its inventory describes. First by the
    Swarm's own word: each machine's list of the overlay's endpoints names every host (its gossip
    may take a bulk sync, every 30 s, to repair a lost message; a loaded machine is slower still,
    so the wait ends only after GOSSIP_WAIT in which no machine learnt of a host); then by a
    connection from each host to each other's sshd, which the peer's kernel answers."""
    _wait_for_gossip(hosting, spread, addresses)

    def unreached(i: int) -> list[str]:
        peers = [f"{addresses[spread.name(j)]}:22" for j in spread.indices() if j != i]
        code, out = started[i - 1].exec_run(["python3", "-c", _REACH_PEERS, str(REACH_WAIT), *peers])
        if code != 0:
            raise EngineError(f"host {spread.name(i)}: could not check its overlay network: "
                              f"{out.decode(errors='replace').strip()[-300:]}")
        return str(out.decode()).split()

    missing = {spread.name(i): peers for i, peers in zip(spread.indices(), each(unreached, spread.indices()))
               if peers}
    if missing:
        pairs = "; ".join(f"{name} reaches no sshd at {', '.join(peers)}" for name, peers in sorted(missing.items()))
        raise EngineError(f"the overlay network {spread.subnet} does not carry traffic between the machines, though "
                          f"the Swarm told each of every host: {pairs} (no answer within {REACH_WAIT:g}s: is "
                          "UDP port 4789, VXLAN, open between the machines?)")


def _wait_for_gossip(hosting: Sequence[Engine], spread: Spread, addresses: dict[str, str]) -> None:
    """Until each machine's Swarm lists every host's endpoint on the overlay; EngineError naming
    what each machine lacks once GOSSIP_WAIT passes with no machine learning of another host."""
    wanted = set(addresses.values())
    known: dict[str, set[str] | None] = {}
    news = time.monotonic()
    while True:
        now = dict(zip((e.name for e in hosting), each(lambda e: _endpoints_known(e, spread.overlay), hosting)))
        if any(was is not None and len(now[m] or ()) > len(was) for m, was in known.items()):
            news = time.monotonic()
        known = now
        lacking = {m: wanted - seen for m, seen in known.items() if seen is not None and wanted - seen}
        if not lacking:
            return
        if time.monotonic() - news > GOSSIP_WAIT:
            host = {address: name for name, address in addresses.items()}
            said = "; ".join(f"machine {m} does not know {', '.join(f'{host[a]} ({a})' for a in sorted(missing))}"
                             for m, missing in sorted(lacking.items()))
            raise EngineError(f"the Swarm did not tell every machine of the hosts on {spread.overlay} ({said}; "
                              f"no news in {GOSSIP_WAIT:g}s): are TCP and UDP port 7946 open between the machines?")
        time.sleep(0.5)


def _endpoints_known(engine: Engine, overlay: str) -> set[str] | None:
    """The addresses of the overlay's endpoints that the machine's Swarm knows of, on any machine;
    None from an engine whose network listing has no such list (it is not waited on)."""
    info = engine.client.api.inspect_network(overlay, verbose=True)
    services = info.get("Services")
    if services is None:
        return None
    tasks = [t for service in services.values() for t in (service or {}).get("Tasks") or []]
    local = [c.get("IPv4Address", "") for c in (info.get("Containers") or {}).values()]
    return {str(t.get("EndpointIP")) for t in tasks} | {a.split("/")[0] for a in local if a}


def _overlay_address(c: Container, spread: Spread) -> str:
    """The host's address on the lab's overlay (the container as _ssh_port reloaded it)."""
    address = ((c.attrs["NetworkSettings"].get("Networks") or {}).get(spread.overlay) or {}).get("IPAddress")
    if not address:
        raise EngineError(f"{c.name}: it has no address on {spread.overlay}")
    return str(address)


def _ssh_port(c: Container, spread: Spread) -> int:
    if spread.network == "host":
        return spread.ssh_port
    c.reload()
    bound = (c.attrs["NetworkSettings"].get("Ports") or {}).get("22/tcp") or []
    if not bound:
        raise EngineError(f"{c.name}: its sshd port is not published")
    return int(bound[0]["HostPort"])


def _remove(engines: Sequence[Engine], lab: str, say: Say, spare: dict[str, set[str]] | None = None,
            manager: Engine | None = None) -> int:
    """Remove the lab's containers on every machine, then its networks (the overlay through the
    manager); those in ``spare`` (machine -> ids, see resources.lab_resources) stay. How many went.
    Never raises: what cannot go (a machine gone) is a line."""
    def remove_containers(e: Engine) -> int:
        gone = 0
        try:
            for c in lab_containers(e.client, lab):
                if c.id not in (spare or {}).get(e.name, ()):
                    c.remove(force=True, v=True)
                    say(f"machine {e.name}: removed container {c.name}")
                    gone += 1
        except Exception as exc:  # (best effort: the next machine all the same)
            say(f"machine {e.name}: cannot remove lab {lab}'s containers there: {reason(exc)}")
        return gone

    removed = sum(each(remove_containers, engines))
    gone: set[str] = set()  # (a worker may still list an overlay the manager removed)
    for e in [manager] if manager is not None else engines:
        try:
            for net in lab_networks(e.client, lab):
                if net.id not in gone and net.id not in (spare or {}).get(e.name, ()):
                    remove_network(net, lambda line, e=e: say(f"machine {e.name}: {line}"))  # type: ignore[misc]
                    gone.add(net.id)
        except Exception as exc:
            say(f"machine {e.name}: cannot remove lab {lab}'s networks there: {reason(exc)}")
    return removed + len(gone)


ENGINE_FAILURES = (DockerException, OSError, paramiko.SSHException, EOFError)  # what a call to an engine may raise


def failed_machine(engines: Sequence[Engine], exc: BaseException) -> LabError:
    """A call to an engine failed outside the lab's own checks (the machine went down, say): one
    line naming the machine whose engine no longer answers, else saying what failed."""
    gone = [e for e in engines if not e.answers()]
    if gone:
        return HostsUnreachable.of([e.fail(f"its engine stopped answering ({reason(exc)})") for e in gone])
    return EngineError(f"a machine's engine failed: {reason(exc)}")


def _hosts_on(e: Engine, lab: str) -> list[HostStatus]:
    """The lab's hosts on the machine of ``e``."""
    found = []
    for c in lab_containers(e.client, lab):
        host_mode = SSH_PORT_LABEL in c.labels
        port = int(c.labels[SSH_PORT_LABEL]) if host_mode else int(
            ((c.attrs["NetworkSettings"].get("Ports") or {}).get("22/tcp") or [{"HostPort": 0}])[0]["HostPort"])
        data = e.address if host_mode else next(
            (n.get("IPAddress") or "?" for n in c.attrs["NetworkSettings"]["Networks"].values()), "?")
        found.append(HostStatus(c.name, c.status, c.status == "running" and bool(port) and
                                sshd.ssh_answers(e.machine.address, port), machine=e.name,
                                ssh_at=f"{e.machine.address}:{port}", data_address=data))
    return found
