"""``lab break KIND [HOST]`` and ``lab fix [KIND] [HOST...]``: the classic multi-node failures,
made for real on a container lab, for the doctor to name and a class to see.

Each fault is a real change on one host: inside it, as root by ``docker exec`` (its /etc/hosts,
its sshd's environment, a process holding a port), or in its network namespace (iptables chains
of its own, set by a helper with NET_ADMIN: :mod:`lab.containerlab.helper`); the host stays
unprivileged. Every fix is idempotent and undoes only what its break did, so ``lab fix`` with no
kind mends every host whatever was broken, and nothing records what was: ``lab doctor`` names
each fault from what it sees.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import docker

from lab.containerlab import helper
from lab.containerlab.engine import Say
from lab.containerlab.topology import Topology
from lab.core.hostfiles import rewrite

SAVED_HOSTS = "/etc/hosts.lab-fault"  # the host's /etc/hosts before a fault changed it
PORT_HOLDER = "lab-fault-port-taken"  # in the command line of the process that holds the port
DEFAULT_PORT = 29500  # the tutorials' MASTER_PORT


def _chain(table: str, hook: str, chain: str, *rule: str) -> tuple[str, str]:
    """(break, fix): ``rule`` in a chain of the fault's own, jumped to from ``hook``."""
    iptables = f"iptables -t {table}"
    fix = (f"while {iptables} -D {hook} -j {chain} 2>/dev/null; do :; done; "
           f"{iptables} -F {chain} 2>/dev/null; {iptables} -X {chain} 2>/dev/null; true")
    rules = " && ".join(f"{iptables} -A {chain} {r}" for r in rule)  # (each step checked)
    return f"{fix}; {iptables} -N {chain} && {rules} && {iptables} -I {hook} -j {chain}", fix


# Every file is rewritten whole or not at all (lab.core.hostfiles; /etc/hosts is the engine's bind
# mount: written in place), and the saved copy is whole before it is named so.
_RESTORE_HOSTS = f"if [ -e {SAVED_HOSTS} ]; then {rewrite('/etc/hosts', f'cat {SAVED_HOSTS}')} && rm {SAVED_HOSTS}; fi"
_SAVE_HOSTS = (f"{{ [ -e {SAVED_HOSTS} ] || {{ cp /etc/hosts {SAVED_HOSTS}.new && "
               f"mv {SAVED_HOSTS}.new {SAVED_HOSTS}; }} || {{ rm -f {SAVED_HOSTS}.new; "
               "echo 'cannot save /etc/hosts (is the disk full?)' >&2; false; }; }")
_SSHD_CONFIG = "/etc/ssh/sshd_config"
_SSHD_ENV = "SetEnv GLOO_SOCKET_IFNAME=eth9"
_RELOAD_SSHD = "pkill -HUP -o -x sshd; sleep 1"  # (new sessions see the change; the lab's own are new)
_PARTITION = _chain("filter", "INPUT", "LAB-FAULT-PART-IN", "! -i lo -j DROP")
_PARTITION_OUT = _chain("filter", "OUTPUT", "LAB-FAULT-PART-OUT", "! -o lo -j DROP")
PATH_MTU = 1200  # bytes: what `break mtu` lets through (the interfaces think 1500)
_LARGE = f"-m length --length {PATH_MTU + 1}:65535 -j DROP"
# (sshd's port stays whole, as for blocked-port: the lab reaches the host that way, not its data)
_MTU_IN = _chain("filter", "INPUT", "LAB-FAULT-MTU-IN", "-i eth+ -p tcp --dport 22 -j RETURN", f"-i eth+ {_LARGE}")
_MTU_OUT = _chain("filter", "OUTPUT", "LAB-FAULT-MTU-OUT", "-o eth+ -p tcp --sport 22 -j RETURN", f"-o eth+ {_LARGE}")


@dataclass(frozen=True)
class Fault:
    kind: str
    about: str  # what it does to the host
    shows: str  # what a job shows
    default_hosts: tuple[str, ...]  # node1 is rank 0's host, where MASTER_ADDR is; () is every host
    in_host: tuple[str, str] = ("", "")  # (break, fix): sh, as root inside the host
    in_namespace: tuple[str, str] = ("", "")  # (break, fix): sh, by a helper in the host's namespace


FAULTS = {fault.kind: fault for fault in (
    Fault("loopback-hostname", "its hostname resolves to 127.0.1.1, as Debian's default /etc/hosts has it",
          "the rendezvous completes, then the ranks connect to 127.0.1.1 and the mesh hangs", (),
          in_host=(f"{_SAVE_HOSTS} && " + rewrite("/etc/hosts", f'echo "127.0.1.1 $(hostname)" && cat {SAVED_HOSTS}'),
                   _RESTORE_HOSTS)),
    Fault("blocked-port", "a firewall drops new TCP connections to its ports above 1023 (sshd's 22 stays open)",
          "the ranks reach the store, then the mesh to this host hangs until the timeout", ("node2",),
          in_namespace=_chain("filter", "INPUT", "LAB-FAULT-PORTS",
                              "! -i lo -p tcp --dport 1024:65535 -m conntrack --ctstate NEW -j DROP")),
    Fault("wrong-ifname", "its sshd sets GLOO_SOCKET_IFNAME=eth9, an interface it lacks, in every session",
          "gloo cannot start: Unable to find address for: eth9", ("node2",),
          in_host=(f"{{ grep -qx '{_SSHD_ENV}' {_SSHD_CONFIG} || "
                   f"{rewrite(_SSHD_CONFIG, f'cat {_SSHD_CONFIG} && echo {_SSHD_ENV!r}')}; }} && {_RELOAD_SSHD}",
                   f"if grep -qx '{_SSHD_ENV}' {_SSHD_CONFIG}; then "
                   f"{rewrite(_SSHD_CONFIG, f'grep -vx {_SSHD_ENV!r} {_SSHD_CONFIG} || [ $? = 1 ]')} && "
                   f"{_RELOAD_SSHD}; fi")),
    Fault("partition", "it loses the network: every packet in or out but loopback's is dropped",
          "a run ends at its timeout (or when SSH's keepalive gives up) naming the host it lost", ("node2",),
          in_namespace=(f"{_PARTITION[0]}; {_PARTITION_OUT[0]}", f"{_PARTITION[1]}; {_PARTITION_OUT[1]}")),
    Fault("slow-dns", "its resolver stops answering, and its /etc/hosts no longer names the other hosts",
          "init stalls: the store looks up each peer's address and waits for DNS", ("node1",),
          in_host=(f"{_SAVE_HOSTS} && " + rewrite("/etc/hosts", "awk -v me=\"$(hostname)\" '{for (i = 2; i <= NF; i++) "
                                                   "if ($i == me || $i ~ /^(localhost|ip6-)/) {print; next}}' "
                                                   + SAVED_HOSTS), _RESTORE_HOSTS),
          # (its answers are dropped, not its questions: a question dropped on its way out fails at once)
          in_namespace=_chain("filter", "INPUT", "LAB-FAULT-DNS", "-p udp --sport 53 -j DROP",
                              "-p tcp --sport 53 -j DROP")),
    Fault("mtu", f"its path carries packets of {PATH_MTU} bytes at most while its interfaces think 1500, and no "
                 "'fragmentation needed' comes back (sshd's port 22 is spared)",
          "the rendezvous completes and small messages pass, then the first large tensor hangs (an overlay's "
          "classic)", ("node2",),
          in_namespace=(f"{_MTU_IN[0]}; {_MTU_OUT[0]}", f"{_MTU_IN[1]}; {_MTU_OUT[1]}")),
    Fault("port-taken", f"a process holds MASTER_PORT ({DEFAULT_PORT}, or --port) on it",
          "rank 0 cannot start the store: EADDRINUSE, address already in use", ("node1",),
          in_host=("", f"pkill -f '{PORT_HOLDER[:-1]}[{PORT_HOLDER[-1]}]'; true")),
)}
KINDS = tuple(FAULTS)


def _hold_port(port: int) -> list[str]:
    code = ("import socket, sys, time\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('', int(sys.argv[2]))); s.listen(); time.sleep(1e9)")
    return ["python3", "-c", code, PORT_HOLDER, str(port)]


def break_hosts(client: docker.DockerClient, topology: Topology, kind: str, indices: Sequence[int],
                port: int = DEFAULT_PORT) -> None:
    """Make fault ``kind`` happen on the hosts ``indices`` (in place of the same fault there before)."""
    fault = FAULTS[kind]
    fix(client, topology, [kind], indices, lambda _: None)
    for i in indices:
        if fault.in_namespace[0]:
            helper.in_namespace(client, topology, i, fault.in_namespace[0])
        if fault.in_host[0]:
            helper.in_host(client, topology, i, fault.in_host[0])
        if kind == "port-taken":
            helper.running_host(client, topology, i).exec_run(_hold_port(port), user="root", detach=True)
            helper.in_host(client, topology, i, f"for _ in $(seq 50); do ss -Hltn 'sport = :{port}' | grep -q . && "
                                          f"exit 0; sleep 0.1; done; echo 'port {port} could not be held'; exit 1")


def fix(client: docker.DockerClient, topology: Topology, kinds: Sequence[str], indices: Sequence[int],
        say: Say) -> None:
    """Undo ``kinds`` on the hosts ``indices``: one exec and one helper per host for all of them."""
    for i in indices:
        in_host = "; ".join(FAULTS[k].in_host[1] for k in kinds if FAULTS[k].in_host[1])
        in_namespace = "; ".join(FAULTS[k].in_namespace[1] for k in kinds if FAULTS[k].in_namespace[1])
        if in_host:
            helper.in_host(client, topology, i, in_host)
        if in_namespace:
            helper.in_namespace(client, topology, i, in_namespace)
        say(f"{topology.name(i)}: fixed {', '.join(kinds) if len(kinds) < len(KINDS) else 'every fault'}")
