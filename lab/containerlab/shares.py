"""Shares that cannot reach each other's sockets, see each other's processes nor take each other's
CPU and memory: what every container lab host gets before shares are graded on it at once.

``lab grade --hosts --parallel K`` runs each share's submissions as a user of its own
(``grade_users``: share1..share8). Users of one host see each other's listeners (/proc/net/tcp)
and could connect to them: a TCPStore has no authentication, so one share could read, overwrite
or flood another's rendezvous. Here the kernel keeps them apart, whatever a rank does:

* every TCP packet a share user's socket sends is marked with that share's DSCP code (rewritten,
  so a socket's own IP_TOS cannot borrow another's), and another user's packet carrying a share's
  code is cleared;
* a new connection takes the code of its first packet as its mark (CONNMARK), on the host that
  receives it, over the network or loopback alike;
* a share user's socket may answer a new connection (its SYN-ACK) only where the mark is its own
  share's: any other connection to it never completes (the SYN-ACK is dropped; the caller's
  connect times out).

So a share's ranks reach their own store and their own peers on every host, and nothing of
another share's; the lab's own connections (SSH, to sshd as root) are untouched.

And each share has its own part of the host's CPU and memory: a control group per share user
(:data:`GROUPS`), made inside the host's own group, so that the host's limits bound them all; equal
CPU weights, and each share's memory limit is the host's over the shares graded there at once
(:func:`share_memory`, set by each ``lab grade``). A host's cgroup tree is read-only inside it, so
a helper mounts the part that holds the share groups (only that: the host's own limits stay out
of reach) at :data:`GROUPS` in the host's mount namespace; each group's member list is its user's
to write, and the lab's reaper (``lab.rank.reaper``), the first process of every launch, joins
its user's group before it starts anything: a share's processes cannot leave it, nor enter
another's. With the groups, /proc is remounted ``hidepid=invisible``: a user sees only their own
processes, and what /proc hides from its own user (what is not dumpable) the reaper still finds by
the kernel's list of its children and the grader's sweep by the share's groups. (cgroup v1, as on
these engines; a host with cgroup v2 alone gets the filter and no groups, and the grader says that
its shares share its CPU and memory.)

The filter is set in each host's network namespace by a helper with NET_ADMIN, the groups by one
with SYS_ADMIN in its mount namespace (the host itself stays unprivileged), and :data:`MARKER`
says so on the host, written by root after both: the host's network namespace
(``/proc/self/ns/net``), so that a host restarted since (a new namespace, no filter, no groups)
no longer shows it. ``lab grade`` runs shares at once only on hosts that show it (:data:`CHECK`),
and sets both itself on the hosts of a lab of this machine's engine that do not show it yet
(:func:`keep_apart`: once, about a second, paid by grading rather than by every
``lab up``); elsewhere it grades one share at a time, and says why.
"""
from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

import docker
from docker.errors import DockerException
from docker.models.containers import Container

from lab.containerlab import containers, engine, helper, sharehosts
from lab.containerlab.engine import EngineError, each
from lab.containerlab.topology import GRADE_USERS, Topology
from lab.rank.reaper import SHARE_CONTROLLERS, SHARE_GROUPS

MARKER = "/etc/lab/shares-isolated"  # on a host: its shares are kept apart (written by root, after the filter)
CHECK = f'[ "$(cat {MARKER} 2>/dev/null)" = "$(readlink /proc/self/ns/net)" ]'  # sh: the filter is in place
GROUPS = SHARE_GROUPS  # on a host: a folder per controller, a control group per share user in each
CONTROLLERS = SHARE_CONTROLLERS
GROUPED = f"mountpoint -q {GROUPS}/memory"  # sh: the share groups are there (lab.rank.reaper joins them)
DSCP_BASE = 48  # share N's packets carry DSCP_BASE + N (49..56: codes no standard class uses)
_OUT, _IN, _ANSWER = "LAB-SHARES-OUT", "LAB-SHARES-IN", "LAB-SHARES-ANSWER"


def filter_script(users: tuple[str, ...] = GRADE_USERS) -> str:
    """sh that sets the filter in the namespace it runs in: the chains' rules in one batch
    (iptables-restore, which empties a chain it declares), then the jumps to them where missing;
    each step checked."""
    mangle, answer = [f":{_OUT} - [0:0]", f":{_IN} - [0:0]"], [f":{_ANSWER} - [0:0]"]
    for n, user in enumerate(users, 1):
        owner = f"-p tcp -m owner --uid-owner {user}"
        mangle += [f"-A {_OUT} {owner} -j DSCP --set-dscp {DSCP_BASE + n}", f"-A {_OUT} {owner} -j RETURN"]
    mangle += [f"-A {_OUT} -p tcp -m dscp --dscp {DSCP_BASE + n} -j DSCP --set-dscp 0"  # (no share's packet)
               for n in range(1, len(users) + 1)]
    for n, user in enumerate(users, 1):
        code = DSCP_BASE + n
        mangle.append(f"-A {_IN} -p tcp -m conntrack --ctstate NEW -m dscp --dscp {code} "
                      f"-j CONNMARK --set-xmark {code}/0xff")
        answer.append(f"-A {_ANSWER} -p tcp --tcp-flags SYN,ACK SYN,ACK -m owner --uid-owner {user} "
                      f"-m connmark ! --mark {code}/0xff -j DROP")
    batch = "\n".join(["*mangle", *mangle, "COMMIT", "*filter", *answer, "COMMIT", ""])
    jumps = [f"{{ iptables -w 5 -t {table} -C {hook} -j {chain} 2>/dev/null || "
             f"iptables -w 5 -t {table} -I {hook} -j {chain}; }}"
             for table, chain, hook in (("mangle", _OUT, "OUTPUT"), ("mangle", _IN, "INPUT"),
                                        ("filter", _ANSWER, "OUTPUT"))]
    return " && ".join([f"printf %s {shlex.quote(batch)} | iptables-restore -w 5 --noflush", *jumps])


def lab_of(addresses: list[str]) -> str | None:
    """The lab of this machine's engine whose hosts have ``addresses`` (an inventory's), if there is
    one and an engine answers."""
    try:
        return containers.lab_with_hosts(engine.client(), addresses)
    except (EngineError, DockerException):
        return None


def keep_apart(lab: str, shares_at: Mapping[str, int], isolate_now: bool) -> bool:
    """On the hosts of ``lab`` (``shares_at``: a host's address -> how many shares run there at once):
    set the filter and the share groups (``isolate_now``), then give each share on a host its part of
    the host's memory. Whether the engine did."""
    try:
        client = engine.client()
        topology = containers.running_topology(client, lab)
        if isolate_now:
            isolate(client, topology)
        share_memory(client, topology, {i: shares_at.get(topology.address(i), 0) for i in topology.indices()})
        return True
    except (EngineError, DockerException):
        return False


def isolate(client: docker.DockerClient, topology: Topology) -> None:
    """Set the filter and the share groups on every host of the lab, then the marker that says so
    (one line naming a host where any step fails)."""
    script, groups = filter_script(), groups_script()

    def one(i: int) -> None:
        helper.in_namespace(client, topology, i, script)
        helper.in_mounts(client, topology, i, groups)
        helper.in_host(client, topology, i, f"readlink /proc/self/ns/net > {MARKER}")

    each(one, list(topology.indices()))


def groups_script(users: tuple[str, ...] = GRADE_USERS) -> str:
    """sh, run in a host's mount namespace (by a helper in its PID namespace, with the engine's
    cgroup namespace): for each controller, the hierarchy mounted aside, a folder ``shares`` made
    in the host's own group, bound (alone) at ``GROUPS/CONTROLLER``, the aside mount gone; a group
    for each share user in it, whose member list that user alone may write. Run again, it changes
    nothing."""
    def controller(c: str) -> str:
        return f"""
line=$(grep -E '^[0-9]+:([^:]*,)?{c}(,[^:]*)?:' /proc/1/cgroup) || {{ echo "no cgroup v1 {c} hierarchy"; exit 0; }}
options=${{line#*:}}; options=${{options%%:*}}; own=${{line#*:*:}}; g={GROUPS}/{c}
mkdir -p "$g"
if ! mountpoint -q "$g"; then
  aside=$(mktemp -d /run/lab-groups-aside.XXXXXX)
  mount -t cgroup -o "$options" cgroup "$aside"
  mkdir -p "$aside$own/shares"
  mount --bind "$aside$own/shares" "$g"
  umount "$aside"; rmdir "$aside"
fi
for u in {" ".join(users)}; do mkdir -p "$g/$u"; chown "$u" "$g/$u/cgroup.procs" "$g/$u/tasks"; done
"""
    # Then /proc shows each user only their own processes; the groups, which list a share's processes
    # whatever /proc shows, are how the grader's sweep finds them all (lab.grading.places.SWEEP).
    return "set -e" + "".join(controller(c) for c in CONTROLLERS) + "mount -o remount,hidepid=invisible /proc\n"


def share_memory(client: docker.DockerClient, topology: Topology, shares_at: Mapping[int, int]) -> None:
    """Give each share user's group on host i its part of the host's memory: the host's limit
    over the shares that run there at once (``shares_at``: host index -> how many; 0: untouched)."""

    def one(i: int) -> None:
        memory = int(helper.running_host(client, topology, i).attrs["HostConfig"].get("Memory") or 0)
        if shares_at[i] and memory:
            part = memory // shares_at[i]
            helper.in_host(client, topology, i, " && ".join(
                f"echo {part} > {GROUPS}/memory/{u}/memory.limit_in_bytes" for u in GRADE_USERS))

    each(one, [i for i in topology.indices() if shares_at.get(i)])


SWEEP_TIMEOUT = 20  # seconds root's sweep of one share on one host may take
CLEAN_BYTES = 32 << 20  # what a share's memory group may still hold once swept (the kernel's own), at most
# sh, with $uid (and $u, the user's name) set and $as_user the prefix that runs a command as that user:
# the System V IPC objects the user owns or made (shared memory, semaphores, queues), each removed as the
# user (the owner or the maker may; a student's shmctl can hand the ownership to another), one line each.
IPC_SWEEP = r"""
for kind in shm:m:shmid sem:s:semid msg:q:msqid; do
  f=/proc/sysvipc/${kind%%:*}; flag=${kind#*:}; flag=${flag%%:*}
  [ -r "$f" ] || continue
  awk -v uid="$uid" -v key="${kind##*:}" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    $c["uid"] == uid || $c["cuid"] == uid { print $c[key] }' "$f" | while read -r id; do
    $as_user ipcrm "-$flag" "$id" 2>/dev/null && echo "removed: ipc $flag $id of $u"
  done
done
"""
# As root on a host, after a submission of share user $1 (the folders it may write follow): every
# process in the share's groups, and of its user, killed until none is left; every file of the user's in the host's
# temporary folders and the given ones removed, a folder made unreadable first made root's (root
# here has no right to override a file's mode: chown, then chmod as its owner), the user's group as
# its group, so that it is known for the user's; the System V IPC objects the user owns or made
# removed (as the user: root here may not, and none of its processes is left to race it); the
# share's memory group emptied of what it can give back, and what it still holds said.
ROOT_SWEEP = r"""
u=$1; shift; uid=$(id -u "$u") || exit 1; g=$(id -gn "$u")
procs() { { cat GROUPS/*/"$u"/cgroup.procs; pgrep -U "$uid"; } 2>/dev/null | sort -u; }
round=0
while [ -n "$(procs)" ] && [ "$round" -lt 200 ]; do kill -9 $(procs) 2>/dev/null; round=$((round + 1)); sleep 0.02; done
[ -z "$(procs)" ] || echo "survived: $(procs | wc -l) process(es) of $u"
for d in /tmp /var/tmp /dev/shm "$@"; do
  [ -d "$d" ] || continue
  find "$d" -xdev -mindepth 1 -user "$u" -type d -exec chown "root:$g" {} \; -exec chmod 700 {} \; 2>/dev/null
  n=$(find "$d" -xdev -mindepth 1 \( -user "$u" -o \( -user 0 -group "$g" \) \) -print -delete 2>/dev/null | wc -l)
  [ "$n" = 0 ] || echo "removed: $n file(s) of $u in $d"
  n=$(find "$d" -xdev -mindepth 1 \( -user "$u" -o \( -user 0 -group "$g" \) \) 2>/dev/null | wc -l)
  [ "$n" = 0 ] || echo "stayed: $n file(s) of $u in $d"
done
as_user="setpriv --reuid=$u --regid=$g --clear-groups"
IPC_SWEEP
m=GROUPS/memory/$u
if [ -d "$m" ]; then
  echo 0 > "$m/memory.force_empty" 2>/dev/null
  echo "memory: $(cat "$m/memory.usage_in_bytes")"
fi
true
""".replace("GROUPS", GROUPS).replace("IPC_SWEEP", IPC_SWEEP)


@dataclass(frozen=True)
class Swept:
    """What root's sweep of a share found on one host (:data:`ROOT_SWEEP`)."""

    lines: tuple[str, ...]  # what it removed, and what stayed ("survived: ...", "stayed: ...")
    memory: int | None  # bytes the share's memory group still holds (None: the host has no such group)

    @property
    def unclean(self) -> str:
        """Why the share is not back to nothing on this host ("" when it is)."""
        stayed = [line.split(": ", 1)[1] for line in self.lines if line.startswith(("survived: ", "stayed: "))]
        if self.memory is not None and self.memory > CLEAN_BYTES:
            stayed.append(f"its memory group holds {self.memory >> 20} MB")
        return "; ".join(stayed)


def sweep_share(client: docker.DockerClient, topology: Topology, i: int, user: str,
                folders: tuple[str, ...] = (), share_host: Container | None = None) -> Swept:
    """Root's sweep of share user ``user`` on host i (:data:`ROOT_SWEEP`), ``folders`` besides the
    temporary ones (the shared folder); one line naming the host when it cannot run. Where the share
    ran through a share host (lab.containerlab.sharehosts), the sweep runs there, in the host's mount
    namespace, with the host's capabilities alone (as its sshd): the share's IPC objects are in the share
    host's own IPC namespace."""
    argv = ["timeout", "-s", "KILL", str(SWEEP_TIMEOUT), "sh", "-c", ROOT_SWEEP, "sh", user, *folders]
    if share_host is not None:
        argv = [*sharehosts.ENTER, *argv]
    try:
        code, out = (share_host or helper.running_host(client, topology, i)).exec_run(argv, user="root")
    except DockerException as exc:
        raise EngineError(f"host {topology.name(i)}: cannot sweep share {user}: {exc}") from None
    lines = bytes(out).decode("utf-8", "replace").splitlines()
    if code != 0:
        raise EngineError(f"host {topology.name(i)}: the sweep of share {user} ended with status {code}"
                          + (f": {lines[-1]}" if lines else ""))
    memory = next((int(line.split()[1]) for line in lines if line.startswith("memory: ")
                   and line.split()[1].isdigit()), None)
    return Swept(tuple(line for line in lines if not line.startswith("memory: ")), memory)

