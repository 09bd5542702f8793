"""Where a submission runs, and the choice ``lab grade`` makes between the places.

A *place* (:class:`Place`) is the cluster one submission runs on: a share of an inventory's hosts
(``--hosts``: :func:`split_inventory` shares the slots out ``--parallel`` ways), a local cluster
(``--sandbox none``: processes as the grader, like ``run --solution``), or a throwaway sandbox
container made for each submission (the default on the local cluster: lab.grading.sandbox).
:class:`GradeRequest` is what ``lab grade`` was asked; :func:`places_for` checks it and makes its
places, one maker for each submission graded at once.
"""
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol, get_args

from docker.errors import DockerException

from lab.containerlab import containers, engine, sharehosts, shares
from lab.containerlab.engine import EngineError, Say
from lab.containerlab.image import Progress
from lab.containerlab.topology import DEFAULT_LAB, GRADE_USERS, LabPaths, default_inventory
from lab.core.plan import DEFAULT_TIMEOUT, Backend, Options
from lab.core.planner import checked_part
from lab.errors import UsageError
from lab.grading import sandbox
from lab.grading.sandbox import Limits
from lab.inventory.hosts import load_inventory, local_inventory
from lab.inventory.model import Host, Inventory
from lab.rank.wire import Mode as WireMode
from lab.suite.registry import Exercise
from lab.transport.base import for_each_host
from lab.transport.reach import transport_for, with_master_address
from lab.transport.ssh.settings import SSHSettings

DEFAULT_WALL = 300.0  # seconds one submission may take in all
SandboxChoice = Literal["container", "ranks", "none"]
SANDBOXES: tuple[SandboxChoice, ...] = get_args(SandboxChoice)
Working = Callable[[str], AbstractContextManager[Progress]]  # shows what is being done, and how it goes


class Place(Protocol):
    """Where one submission runs: a cluster, and what it can tell after the run."""

    @property
    def inventory(self) -> Inventory:
        """The cluster to run it on."""

    def memory_kills(self) -> int:
        """Processes the kernel killed there for want of memory (0 where it cannot tell)."""

    def leftovers(self) -> list[str]:
        """What the submission left running after its run ended, stopped now: one line each."""

    @property
    def own_users(self) -> bool:
        """Whether the submission runs as users it has to itself on every host (a share's grade users),
        so that a limit per user (the processes it may have: ``Options.pids``) bounds it and it alone."""

    @property
    def wire(self) -> WireMode | None:
        """Which of a host's TCP sockets are the submission's (lab.rank.wire), for each host's launcher to
        measure what they carried; None where others' are among them (a user every share shares)."""

    @property
    def rank_users(self) -> int | None:
        """The user its rank 0 runs as where its host's launcher keeps each rank apart as a user of its own
        (Options.rank_users); None where the ranks run as the host's user."""

    def unclean(self) -> str:
        """Why this place is not back to nothing once the submission's run and :meth:`leftovers` are
        done (files it could not remove, memory still charged to it): then no later submission may run
        there. "" when it is."""


@dataclass(frozen=True)
class Hosts:
    """A share of an inventory's hosts (or the local cluster), the same for every submission. Where
    the share logs in as a user of its own (``grade_users``), every process of that user is the
    submission's once its run has ended: :meth:`leftovers` stops them all, and says which."""

    inventory: Inventory
    ssh: SSHSettings | None = None
    lab: str | None = None  # the lab of this machine's engine whose hosts these are: root sweeps its shares

    def memory_kills(self) -> int:
        return 0

    @property
    def own_users(self) -> bool:
        return bool(self._own_hosts) and len(self._own_hosts) == len(self.inventory.hosts)

    @property
    def wire(self) -> WireMode | None:
        """Those its user owns, where that user is the share's alone."""
        return "uid" if self.own_users else None

    @property
    def rank_users(self) -> int | None:
        """None: each host's ranks run as its (share's) user."""
        return None

    @property
    def _own_hosts(self) -> list[Host]:
        return [h for h in self.inventory.hosts if h.connection == "ssh" and h.user and h.user in h.grade_users]

    def leftovers(self) -> list[str]:
        own = self._own_hosts
        lines: list[str] = []
        for name, found in sorted(for_each_host({h.name: h for h in own}, lambda h: _sweep(h, self.ssh)).items()):
            lines += found if isinstance(found, list) else [f"{name}: could not look: {found}"]
        return lines

    def unclean(self) -> str:
        """On a lab's hosts, root's sweep of the share (lab.containerlab.shares.ROOT_SWEEP: what the share
        user's own could not reach, a folder it made unreadable, its IPC objects) and what its memory
        group still holds after it; elsewhere what the share's memory group holds, where the host has
        one. Each host where something stayed, with what."""
        own = self._own_hosts
        if not own:
            return ""
        found = _root_swept(self.lab, own) if self.lab is not None else \
            for_each_host({h.name: h for h in own}, lambda h: _memory_held(h, self.ssh))
        return "; ".join(f"{name}: {why if isinstance(why, str) else f'could not sweep: {why}'}"
                         for name, why in sorted(found.items()) if why)


SWEEP_TIMEOUT = 20.0  # seconds for a host to stop a share user's processes and look again
# As the share user: every process of its own but this command's ancestors (its SSH session) is
# what a submission left, found in /proc and in the share's groups (which list those /proc hides
# from their own user: lab.containerlab.shares); each is named and killed, its files in the
# temporary folders (and the shared folder, the script's arguments) removed (a folder it made
# unreadable opened first: it is the user's own), its System V IPC objects too, then whatever
# process is still there is named again. (On a lab's hosts root's sweep follows: Hosts.unclean.)
SWEEP = r"""
keep=" "; p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
  keep="$keep$p "; p=$(sed 's/^.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f2)
done
mine() {
  cat GROUPS/*/"$(id -un)"/cgroup.procs 2>/dev/null
  for d in /proc/[0-9]*; do [ -O "$d" ] && echo "${d#/proc/}"; done
}
killed=" "
for pid in $(mine); do
  case "$keep$killed" in *" $pid "*) continue ;; esac
  name=$(cat "/proc/$pid/comm" 2>/dev/null) || name="a process hidden from its user"
  kill -9 "$pid" 2>/dev/null && killed="$killed$pid " && echo "left: $name (pid $pid)"
done
sleep 0.3
find /tmp /var/tmp /dev/shm "$@" -xdev -mindepth 1 -user "$(id -u)" -type d -exec chmod u+rwx {} \; 2>/dev/null
find /tmp /var/tmp /dev/shm "$@" -xdev -mindepth 1 -user "$(id -u)" -delete 2>/dev/null
uid=$(id -u); u=$(id -un); as_user=
IPC_SWEEP
said=" "
for pid in $(mine); do
  case "$keep$said" in *" $pid "*) continue ;; esac
  kill -0 "$pid" 2>/dev/null || continue  # (gone: the listing's own subshell, say)
  [ "$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)" != Z ] || continue
  said="$said$pid "
  echo "survived: pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo hidden))"
done
true
""".replace("GROUPS", shares.GROUPS).replace("IPC_SWEEP", shares.IPC_SWEEP)


def _sh(host: Host, ssh: SSHSettings | None, script: str, timeout: float, *args: str) -> tuple[int | None, str]:
    """``script`` run by sh on ``host`` as its user, with ``args``: its status (None: no answer in
    time), its output."""
    transport = transport_for(host, ssh)
    try:
        return transport.call(["/bin/sh", "-c", script, "sh", *args], timeout)
    finally:
        transport.close()


def _sweep(host: Host, ssh: SSHSettings | None) -> list[str]:
    status, output = _sh(host, ssh, SWEEP, SWEEP_TIMEOUT, *([host.shared_dir] if host.shared_dir else []))
    if status is None:
        return [f"{host.name}: could not look: no answer within {SWEEP_TIMEOUT:g}s"]
    lines = [line for line in output.splitlines() if line.startswith(("left: ", "survived: "))]
    return [f"{host.name}: {line.replace('left: ', '', 1)}" if line.startswith("left: ") else
            f"{host.name}: {line.replace('survived: ', 'could not stop ', 1)}" for line in lines]


def _root_swept(lab: str, hosts: list[Host]) -> dict[str, str | BaseException]:
    """Root's sweep of each host's share user on the lab's hosts (by the engine): host -> what stayed."""
    try:
        client = engine.client()
        topology = containers.running_topology(client, lab)
    except (EngineError, DockerException) as exc:
        return {h.name: exc for h in hosts}
    index = {topology.address(i): i for i in topology.indices()}
    doors = {(door.address, door.user): door for door in sharehosts.running(client, lab)}

    def one(host: Host) -> str | BaseException:
        door = doors.get((host.address, host.user or ""))
        if door is None and host.address not in index:
            return f"not a host of lab {lab}"
        try:
            return shares.sweep_share(client, topology, door.host if door else index[host.address], host.user or "",
                                      (host.shared_dir,) if host.shared_dir else (),
                                      door.container if door else None).unclean
        except EngineError as exc:
            return exc

    return dict(zip([h.name for h in hosts], engine.each(one, hosts)))


# As the share user: the bytes its memory group still holds that no process is using (its tmpfs files, shared
# memory) and that its processes held (none should be left); nothing where the host has no such group.
MEMORY_HELD = f"cat {shares.GROUPS}/memory/\"$(id -un)\"/memory.stat 2>/dev/null || true"


def _memory_held(host: Host, ssh: SSHSettings | None) -> str:
    status, output = _sh(host, ssh, MEMORY_HELD, SWEEP_TIMEOUT)
    if status is None:
        return f"could not look: no answer within {SWEEP_TIMEOUT:g}s"
    held = sum(int(n) for key, n in (line.split()[:2] for line in output.splitlines() if len(line.split()) >= 2)
               if key in ("total_rss", "total_shmem") and n.isdigit())
    return f"its memory group holds {held >> 20} MB" if held > shares.CLEAN_BYTES else ""


PlaceMaker = Callable[[], AbstractContextManager[Place]]  # a fresh place for each submission


def fixed(inventory: Inventory, ssh: SSHSettings | None = None, lab: str | None = None) -> PlaceMaker:
    return lambda: contextlib.nullcontext(Hosts(inventory, ssh, lab))


# -- sharing the cluster ----------------------------------------------------------------------


def split_inventory(inventory: Inventory, shares: int, least: int) -> list[Inventory]:
    """``shares`` inventories that share out the slots of ``inventory`` (in host order, each
    share as many as the smallest), every one with at least ``least`` ranks. On an SSH host
    with ``grade_users``, share N logs in as the Nth of them (so shares on one host are
    different users), else as the host's own user."""
    short = next((h for h in inventory.hosts if h.grade_users and len(h.grade_users) < shares), None)
    if short is not None:
        raise UsageError(f"{short.source}: host {short.name} has {len(short.grade_users)} grade_users for "
                         f"{shares} share(s); use fewer --parallel or name more users")
    slots = [(host, s) for host in inventory.hosts for s in range(host.slots)]
    each = len(slots) // shares
    if each < max(least, 1):
        raise UsageError(f"{inventory.path}: {len(slots)} slot(s) cannot make {shares} share(s) of at least "
                         f"{max(least, 1)} rank(s) each; use fewer --parallel or more slots")
    out = []
    for i in range(shares):
        mine = slots[i * each:(i + 1) * each]
        counts: dict[str, int] = {}
        for host, _ in mine:
            counts[host.name] = counts.get(host.name, 0) + 1
        hosts = tuple(replace(h, slots=counts[h.name], user=_share_user(h, i)) for h in inventory.hosts
                      if h.name in counts)
        out.append(Inventory(f"{inventory.path} (share {i + 1} of {shares})", hosts))
    return out


def _share_user(host: Host, share: int) -> str | None:
    return host.grade_users[share] if host.grade_users and host.connection == "ssh" else host.user


ISOLATION_TIMEOUT = 20.0  # seconds for a host to say whether it keeps shares apart


@dataclass(frozen=True)
class Sharing:
    """What the SSH hosts of an inventory show of the means to grade shares at once (lab.containerlab.shares)."""

    unisolated: list[str]  # no packet filter keeping shares apart (or could not say): one share at a time there
    ungrouped: list[str]  # no control group per share: shares there share its CPU and memory


def sharing(inventory: Inventory, ssh: SSHSettings | None) -> Sharing:
    """Which SSH hosts show the packet filter and the share groups: a container lab's hosts have
    them once ``lab grade`` set them; a VM, unless set up so, has not."""
    script = f"{{ {shares.CHECK}; }} && echo isolated; {{ {shares.GROUPED}; }} && echo grouped; true"
    found = for_each_host({h.name: h for h in inventory.hosts if h.connection == "ssh"},
                          lambda host: _sh(host, ssh, script, ISOLATION_TIMEOUT))
    said = {name: set(out[1].split()) if isinstance(out, tuple) and out[0] == 0 else set()
            for name, out in found.items()}
    return Sharing(sorted(n for n, words in said.items() if "isolated" not in words),
                   sorted(n for n, words in said.items() if "grouped" not in words))


def through_share_hosts(split: list[Inventory], lab: str, say: Say) -> tuple[list[Inventory], list[str]]:
    """Each share's inventory through its share hosts on ``lab`` (lab.containerlab.sharehosts): a
    network of its own on every host, so that no share can take another's ports. Where the lab cannot
    give them (not a plain lab, a host not the lab's or not logged in as a share user, or the engine
    failing, which a line says), the shares as they were, and the hosts where they share the ports."""
    every = [h for share in split for h in share.hosts]
    try:
        client = engine.client()
        topology = containers.running_topology(client, lab)
        index = {topology.address(i): i for i in topology.indices()}
        if topology.kind != "plain" or any(h.address not in index or h.connection != "ssh"
                                           or h.user not in GRADE_USERS for h in every):
            return split, sorted({h.name for h in every})
        found = sharehosts.ensure(client, topology, sorted({(index[h.address], h.user or "") for h in every}), say)
    except (EngineError, DockerException) as exc:
        say(f"cannot give each share a network of its own on lab {lab}: {exc}")
        return split, sorted({h.name for h in every})

    def through(host: Host) -> Host:
        door = found[(index[host.address], host.user or "")]
        return replace(host, address=door.address, data_address=None, network_interface=sharehosts.INTERFACE,
                       known_hosts=str(sharehosts.known_hosts(lab, door.user)))

    return [Inventory(share.path, tuple(through(h) for h in share.hosts)) for share in split], []


def one_user_hosts(inventory: Inventory) -> list[str]:
    """The SSH hosts where every share runs as one user (no ``grade_users``): there what the ranks'
    connections carried is not measured (others' would count: ``Hosts.wire``), and the submissions
    graded at once can read each other's run files and signal each other."""
    return [h.name for h in inventory.hosts if h.connection == "ssh" and not h.grade_users]


# -- choosing the places ----------------------------------------------------------------------


@dataclass(frozen=True)
class GradeRequest:
    """What ``lab grade`` was asked: the exercise, how many submissions at once, how long each may
    take, and where they run: the hosts of the inventory ``hosts``, else local clusters of
    ``nproc`` ranks, each submission in a sandbox unless ``sandbox`` is "none"."""

    exercise: Exercise
    parallel: int = 1
    timeout: float = DEFAULT_TIMEOUT  # the longest any rank may spend on one step
    wall: float = DEFAULT_WALL
    hosts: str | None = None
    nproc: int = 4
    sandbox: SandboxChoice | None = None  # None: a sandbox on the local cluster, none with hosts
    limits: Limits = field(default_factory=Limits)
    backend: Backend | None = None  # None: as for run
    part: str | None = None  # grade this part of the exercise alone (lab.suite.registry)

    def check(self) -> None:
        """The options that cannot work together, or at all: a UsageError before anything starts."""
        if self.parallel < 1:
            raise UsageError(f"--parallel must be at least 1, got {self.parallel}")
        for option, value in (("timeout", self.timeout), ("wall", self.wall)):
            if value <= 0:
                raise UsageError(f"--{option} must be positive, got {value:g}")
        if self.hosts and self.sandbox in ("container", "ranks"):
            raise UsageError(f"--sandbox {self.sandbox} is for the local cluster: with --hosts the submissions run "
                             "on the inventory's hosts")
        try:
            self.limits.check()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        checked_part(self.options())

    def settings(self) -> dict[str, object]:
        """What decides a grade, as plain data (how many submissions run at once does not): a grader
        started again keeps the rows of one with the same settings (lab.grading.grade.Gradebook)."""
        inventory = None
        if self.hosts:
            try:
                inventory = hashlib.sha256(Path(self.hosts).read_bytes()).hexdigest()
            except OSError:
                inventory = "unreadable"
        return {"exercise": self.exercise.name, "timeout": self.timeout, "wall": self.wall, "hosts": self.hosts,
                "inventory": inventory, "nproc": self.nproc, "sandbox": self.sandbox, "limits": asdict(self.limits),
                "backend": self.backend, "part": self.part}

    def options(self) -> Options:
        """The run of one submission, as ``run EXERCISE --solution FILE`` would make it."""
        return Options((self.exercise,), self.backend, "env", self.timeout, memory_mb=self.limits.memory_mb,
                       pids=self.limits.pids, part=self.part)


@dataclass(frozen=True)
class Places:
    makers: list[PlaceMaker]  # one for each submission graded at once
    one_user_hosts: list[str] = field(default_factory=list)  # see one_user_hosts
    at_once: bool = False  # more than one submission graded at a time
    unisolated: list[str] = field(default_factory=list)  # see sharing: why one share at a time
    crowded: list[str] = field(default_factory=list)  # hosts where several shares run at once, with no group each
    shared_ports: list[str] = field(default_factory=list)  # hosts where several shares run at once in one port space


@contextlib.contextmanager
def places_for(request: GradeRequest, ssh: SSHSettings, say: Say, working: Working) -> Iterator[Places]:
    """The places the request's submissions run in, for as long as the block runs: shares of its
    hosts, local clusters, or (the default) a sandbox each, made from the lab image (built first,
    while ``working`` shows it, if the engine has none) and all removed when the block ends."""
    if request.hosts:
        inventory = with_master_address(load_inventory(request.hosts), ssh)
        split = split_inventory(inventory, request.parallel, request.exercise.min_ranks)
        found = sharing(inventory, ssh) if request.parallel > 1 else Sharing([], [])
        shares_at = {h.name: sum(h.name in {x.name for x in share.hosts} for share in split) for h in inventory.hosts}
        lab = shares.lab_of([h.address for h in inventory.hosts])  # (its root sweeps each share's hosts)
        if request.parallel > 1 and lab is not None:
            kept_apart = shares.keep_apart(lab, {h.address: shares_at[h.name] for h in inventory.hosts},
                                           isolate_now=bool(found.unisolated))
            if kept_apart and found.unisolated:
                say(f"set the packet filter and the share groups that keep shares apart on the hosts of lab {lab}")
                found = sharing(inventory, ssh)
        shared_ports = [h.name for h in inventory.hosts if shares_at[h.name] > 1]
        if request.parallel > 1 and lab is not None and not found.unisolated:
            split, shared_ports = through_share_hosts(split, lab, say)
        makers = [fixed(share, ssh, lab) for share in split][:1 if found.unisolated else None]
        crowded = [name for name, count in shares_at.items() if count > 1 and name in found.ungrouped]
        at_once = len(makers) > 1
        yield Places(makers, one_user_hosts(inventory), at_once, found.unisolated, crowded if at_once else [],
                     [name for name in shared_ports if shares_at[name] > 1] if at_once else [])
    elif request.sandbox == "none":
        yield Places([fixed(local_inventory(request.nproc))] * request.parallel)
    else:
        local_inventory(request.nproc)  # (checks --nproc)
        client = engine.client()
        state = LabPaths(Path(default_inventory(DEFAULT_LAB)).resolve()).state  # (the wheelhouse `lab up` keeps)
        with working("the sandbox image") as progress:
            sandbox.ensure_sandbox_image(client, state, say, progress)
        machine_mb = int(client.info().get("MemTotal") or 0) >> 20  # (0: the engine does not say)
        try:
            if machine_mb:
                request.limits.check_room(request.parallel, request.nproc, machine_mb, request.sandbox == "ranks")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        with sandbox.sandboxes_of(client):
            shared = request.exercise.rendezvous == "file"  # (its ranks meet in a file: a folder they all see)
            per_rank = request.sandbox == "ranks"
            yield Places([sandbox.maker(client, request.nproc, request.limits, per_rank, shared)] * request.parallel)
