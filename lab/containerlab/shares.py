"""Shares that cannot reach each other's sockets: the packet filter every container lab host gets.

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
another share's; the lab's own connections (SSH, to sshd as root) are untouched. The filter is
set in each host's network namespace by a helper with NET_ADMIN (the host stays unprivileged),
and :data:`MARKER` says so on the host, written by root after it: the host's network namespace
(``/proc/self/ns/net``), so that a host restarted since (a new namespace, no filter) no longer
shows it. ``lab grade`` runs shares at once only on hosts that show it (:data:`CHECK`), and sets
the filter itself on the hosts of a lab of this machine's engine that do not show it yet
(:func:`isolate_lab_of`: once, about half a second, paid by grading rather than by every
``lab up``); elsewhere it grades one share at a time, and says why.
"""
from __future__ import annotations

import shlex
from collections.abc import Collection

import docker
from docker.errors import DockerException

from lab.containerlab import containers, engine, helper
from lab.containerlab.engine import EngineError, each
from lab.containerlab.topology import GRADE_USERS, Topology

MARKER = "/etc/lab/shares-isolated"  # on a host: its shares are kept apart (written by root, after the filter)
CHECK = f'[ "$(cat {MARKER} 2>/dev/null)" = "$(readlink /proc/self/ns/net)" ]'  # sh: the filter is in place
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


def isolate_lab_of(addresses: Collection[str]) -> str | None:
    """Set the filter on the lab of this machine's engine whose hosts have ``addresses`` (an
    inventory's), if there is one and an engine answers: its name, else None."""
    try:
        client = engine.client()
        name = containers.lab_with_hosts(client, addresses)
        if name is not None:
            isolate(client, containers.running_topology(client, name))
        return name
    except (EngineError, DockerException):
        return None


def isolate(client: docker.DockerClient, topology: Topology) -> None:
    """Set the filter on every host of the lab, then the marker that says so (one line naming a
    host where either fails)."""
    script = filter_script()

    def one(i: int) -> None:
        helper.in_namespace(client, topology, i, script)
        helper.in_host(client, topology, i, f"readlink /proc/self/ns/net > {MARKER}")

    each(one, list(topology.indices()))
