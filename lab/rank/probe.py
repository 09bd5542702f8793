"""The doctor's probe: what one host knows about itself, and which peers it can reach.

Run as ``python -m lab.rank.probe`` on every host (uploaded with the run's code, like the
worker). Standard library only; torch is asked about in a child process
(``python -m lab.rank.probe runtime``), so a slow or crashing import cannot stall the network
checks. Its instructions come in ``LAB_PROBE`` (JSON: token, name, timeout, lifetime,
master_addr, master_port, lookup_peers). It reports on stdout in the worker's tagged
lines (``lab.rank.protocol``), one event each (their types, and the pure functions on them, are
in ``lab.rank.netfacts``):

1. ``facts``: versions, the hostname and what it resolves to (timed), reverse lookups of
   the host's advertised address and of MASTER_ADDR (timed), the interfaces, the
   addresses gloo and NCCL will advertise (honouring GLOO_SOCKET_IFNAME and
   NCCL_SOCKET_IFNAME), and the port its listener took. It then keeps listening.
2. ``links``: after the controller sends one JSON line ``{"targets": [...]}`` on stdin,
   the result of connecting to every target at once, each bounded by the timeout. A
   connection is a handshake: the probe sends the token and its name; the listener
   answers with its name and the source address it saw (how NAT shows).
3. ``runtime``: torch's version, GPUs and NCCL's version, asked only after the controller's
   next line (every host's links are in: ``{"runtime": true}``). The import is seconds of
   CPU: started earlier, a host's import would slow the links its peers are still timing,
   and every time the doctor reports would be partly the CPU's.
4. ``heard`` (only with ``lookup_peers``: MASTER_ADDR's host, where the store looks its
   peers up): at end-of-file on stdin, the sources its listeners saw and how long
   reverse lookups of their addresses took. Then it exits.

The probe ends itself after ``lifetime`` seconds whatever happens. Every network
operation is bounded by ``timeout``. ``LAB_PROBE_CONNECT_DELAY`` (seconds, benchmarks
only, never set by the lab) delays each connection, to imitate a slow link.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any, TypeVar

from lab.rank import tcpinfo
from lab.rank.netfacts import (
    Interface,
    Link,
    LinkFailure,
    Lookup,
    Target,
    family,
    gloo_address,
    is_loopback,
    nccl_address,
    parse_if_inet6,
    parse_ip_json,
    plain_address,
)
from lab.rank.protocol import EventKind, emit

PROBE_VAR = "LAB_PROBE"
DELAY_VAR = "LAB_PROBE_CONNECT_DELAY"
HANDSHAKE_LIMIT = 4096  # bytes of one handshake line
LARGE = 64 * 1024  # bytes of the message after each handshake: dozens of full-size packets
RECEIVED = b"received"  # the listener's receipt for it
REPLY_WAIT = 5.0  # seconds a connected peer has to answer the handshake before it is said to be busy
ACCEPT_POLL = 0.2  # seconds between checks that the listener should stop
IP_TIMEOUT = 5.0  # seconds for `ip -j addr`
SIOCGIFADDR = 0x8915

T = TypeVar("T")


# -- this host ------------------------------------------------------------------------


def read_interfaces() -> list[Interface]:
    """This host's interfaces: from ``ip -j addr``, else from the kernel directly."""
    try:
        done = subprocess.run(["ip", "-j", "addr"], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=IP_TIMEOUT, check=True)
        return parse_ip_json(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return _kernel_interfaces()


def _kernel_interfaces() -> list[Interface]:
    """Each interface's (first) IPv4 address by ioctl, its IPv6 ones from /proc/net/if_inet6."""
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as file:
            v6 = parse_if_inet6(file.read())
    except OSError:
        v6 = {}
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            v4 = []
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                v4.append(socket.inet_ntoa(packed[20:24]))
            except OSError:
                pass
            found.append(Interface(name, tuple(v4 + v6.get(name, []))))
    return found


def can_bind(address: str) -> bool:
    """Whether a TCP socket can bind ``address`` here (gloo's test of a usable address)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def machine_id() -> str:
    """Equal for two probes that share a network stack (loopback included): the kernel's
    boot id and the network namespace; the hostname where those cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            return f"{file.read().strip()}/{os.readlink('/proc/self/ns/net')}"
    except OSError:
        return socket.gethostname()


def bounded(call: Callable[[], T], limit: float) -> tuple[T | None, float, str | None]:
    """``call()`` on a daemon thread, waited for at most ``limit`` seconds: (value, seconds,
    error). A call still running is left behind (a stalled resolver cannot hold the probe)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except Exception as exc:
            box["error"] = describe(exc)[1]

    started = time.monotonic()
    thread = threading.Thread(target=run, name="lab-probe-call", daemon=True)
    thread.start()
    thread.join(limit)
    seconds = time.monotonic() - started
    if thread.is_alive():
        return None, seconds, f"no answer within {limit:g}s"
    return box.get("value"), seconds, box.get("error")


def resolve(name: str, limit: float) -> Lookup:
    """Forward lookup as gloo does it (getaddrinfo, any family, stream sockets), timed."""
    def call() -> tuple[str, ...]:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        return tuple(dict.fromkeys(str(info[4][0]) for info in infos))

    answer, seconds, error = bounded(call, limit)
    return Lookup(name, answer or (), seconds, error)


def reverse(address: str, limit: float) -> Lookup:
    """Reverse lookup (gethostbyaddr, as the store does for its peers' addresses), timed."""
    answer, seconds, error = bounded(lambda: (socket.gethostbyaddr(address)[0],), limit)
    return Lookup(address, answer or (), seconds, error)


def in_parallel(calls: Iterable[Callable[[], T]]) -> list[T]:
    """Run every call on its own thread and return the results in order (each must bound itself)."""
    calls = list(calls)
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def describe(exc: BaseException) -> tuple[LinkFailure, str]:
    """(failure kind, one line) for a failed connection or lookup."""
    if isinstance(exc, socket.gaierror):
        return "resolve", f"cannot resolve: {exc.strerror or exc}"
    if isinstance(exc, Unanswered):
        return "timeout", exc.strerror or "no answer"
    if isinstance(exc, TimeoutError):  # socket.timeout too
        return "timeout", "no answer"
    if isinstance(exc, ConnectionRefusedError):
        return "refused", "connection refused"
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "unreachable", exc.strerror or "no route"
    if isinstance(exc, OSError) and exc.strerror:
        return "error", exc.strerror
    return "error", str(exc) or type(exc).__name__


# -- the listener and the connections -------------------------------------------------


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while b"\n" not in data and len(data) < HANDSHAKE_LIMIT:
        chunk = conn.recv(HANDSHAKE_LIMIT)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def _server_socket(port: int) -> socket.socket:
    """A listening socket on every address: dual-stack where IPv6 works, else IPv4 only."""
    if socket.has_dualstack_ipv6():
        try:
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise
    return socket.create_server(("", port), family=socket.AF_INET, backlog=128)


class Listener:
    """Answers the other probes' handshakes on one port of every address, on its own thread."""

    def __init__(self, name: str, token: str, port: int, timeout: float, bound: socket.socket | None = None) -> None:
        """On ``port``, or on ``bound`` (a socket bound to it already, which it takes)."""
        self.name, self.token, self.timeout = name, token, timeout
        if bound is not None:
            bound.listen(128)
        self._socket = bound or _server_socket(port)
        self._socket.settimeout(ACCEPT_POLL)
        self.port = int(self._socket.getsockname()[1])
        self.heard: dict[str, set[str]] = {}  # source address -> the names that came from it
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server = threading.Thread(target=self._serve, name=f"lab-probe-listen-{self.port}", daemon=True)
        self._answers: list[threading.Thread] = []
        self._open: set[socket.socket] = set()  # the connections being answered
        self._server.start()

    def close(self, wait: float = 0.0) -> None:
        """Stop listening; with ``wait``, wait that long at most for every thread of it to end (a
        process about to fork must have none left)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the accept at once (Linux)
        deadline = time.monotonic() + wait
        self._server.join(wait)
        with self._lock:
            for conn in self._open:  # (a connection that sends no handshake would hold its thread)
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        for thread in self._answers:  # (once the server is done: it starts them)
            thread.join(max(0.0, deadline - time.monotonic()))

    def snapshot(self) -> dict[str, set[str]]:
        """Source address -> the names of the probes that connected from it, so far."""
        with self._lock:
            return {address: set(names) for address, names in self.heard.items()}

    def _serve(self) -> None:
        with self._socket:
            while not self._stop.is_set():
                try:
                    conn, source = self._socket.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                answer = threading.Thread(target=self._answer, args=(conn, source[0]), daemon=True)
                answer.start()
                self._answers = [t for t in self._answers if t.is_alive()] + [answer]

    def _answer(self, conn: socket.socket, source: str) -> None:
        with self._lock:
            if self._stop.is_set():
                conn.close()
                return
            self._open.add(conn)
        try:
            with conn:
                self._handshake(conn, plain_address(source))
        finally:
            with self._lock:
                self._open.discard(conn)

    def _handshake(self, conn: socket.socket, seen: str) -> None:
        try:
            conn.settimeout(self.timeout)
            hello = json.loads(_read_line(conn))
            if not isinstance(hello, dict) or hello.get("token") != self.token:
                return
            conn.sendall(json.dumps({"name": self.name, "seen": seen}).encode() + b"\n")
        except (OSError, ValueError):
            return
        with self._lock:
            self.heard.setdefault(seen, set()).add(str(hello.get("from")))
        if hello.get("large") == LARGE:
            with contextlib.suppress(OSError):
                conn.settimeout(2 * self.timeout)  # (the sender gives up first, and says how it went)
                _receive_large(conn)




def _receive_large(conn: socket.socket) -> None:
    """Read the LARGE bytes after a handshake (within the connection's timeout), then give the receipt."""
    left = LARGE
    while left:
        chunk = conn.recv(min(left, 65536))
        if not chunk:
            return
        left -= len(chunk)
    conn.sendall(RECEIVED + b"\n")


def send_large(conn: socket.socket, timeout: float) -> tuple[str | None, int | None, int | None]:
    """Send LARGE bytes and wait for the receipt, within ``timeout`` in all: (None, None, None) when it
    came; else what happened, how many of its bytes the peer acknowledged and how many segments the
    kernel sent again for want of an acknowledgement (None: unknown). Small messages passing where this
    does not is how a path MTU lower than the interfaces' shows; a peer too busy to read it still has
    its kernel acknowledge it."""
    deadline = time.monotonic() + timeout
    before = tcpinfo.counters(conn)
    try:
        conn.settimeout(timeout)
        conn.sendall(bytes(LARGE))
        conn.settimeout(max(0.01, deadline - time.monotonic()))
        if _read_line(conn) == RECEIVED:
            return None, None, None
        error = f"a {LARGE // 1024} KiB message was not received: the listener closed the connection"
    except TimeoutError:
        error = f"a {LARGE // 1024} KiB message did not arrive within {timeout:g}s"
    except OSError as exc:
        error = f"a {LARGE // 1024} KiB message failed: {describe(exc)[1]}"
    after = tcpinfo.counters(conn)
    if after is None or before is None:
        return error, None, None
    return error, max(0, after.acked - before.acked), max(0, after.resent - before.resent)


CONNECT_ATTEMPTS = (0.0, 0.5, 1.5)  # seconds into the window at which a fresh connection is tried too


class Unanswered(OSError):
    """No SYN-ACK came for any connection attempt within the window: the network's own evidence that
    nothing answers there (filtered, NAT, no route), whatever the load."""


def connect(address: str, port: int, window: float) -> socket.socket:
    """A connected socket to ``address:port``, judged by what the network answers, not by a clock a busy
    machine can stop: refused (a reset) and no route (ICMP) fail at once; otherwise fresh attempts start
    at CONNECT_ATTEMPTS (with the kernel's own SYN retries, every one with backoff) and only when none
    is answered within ``window`` seconds (``Unanswered``, with how many SYNs went out) has the address
    none. Each attempt is looked at once more after the window: a thread scheduled late still sees a
    connection the kernel made in time."""
    family_, kind, proto, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    started = time.monotonic()
    starts = [at for at in CONNECT_ATTEMPTS if at < window]
    attempts: dict[int, socket.socket] = {}
    poller = select.poll()
    won: socket.socket | None = None
    try:
        while won is None:
            elapsed = time.monotonic() - started
            while starts and starts[0] <= elapsed:
                starts.pop(0)
                attempt = socket.socket(family_, kind, proto)
                attempt.setblocking(False)
                error = attempt.connect_ex(sockaddr)
                if error not in (0, errno.EINPROGRESS):
                    attempt.close()
                    raise OSError(error, os.strerror(error))
                attempts[attempt.fileno()] = attempt
                poller.register(attempt, select.POLLOUT)
            last_look = elapsed >= window
            wait = 0.0 if last_look else min([window, *starts]) - elapsed
            for fd, _ in poller.poll(max(0, int(wait * 1000) + 1) if not last_look else 0):
                error = attempts[fd].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error == 0:
                    won = attempts.pop(fd)
                    break
                poller.unregister(fd)
                attempts.pop(fd).close()
                raise OSError(error, os.strerror(error))
            if won is None and last_look:
                syns = sum(1 + (c.syn_resent if (c := tcpinfo.counters(a)) else 0) for a in attempts.values())
                raise Unanswered(errno.ETIMEDOUT, f"no answer to {syns} connection attempts (SYN) in "
                                                  f"{time.monotonic() - started:.1f}s")
    finally:
        for attempt in attempts.values():
            attempt.close()
    won.setblocking(True)
    return won


def check_link(target: Target, name: str, token: str, timeout: float, delay: float = 0.0) -> Link:
    """Connect to ``target`` (:func:`connect`: ``timeout`` is its window), handshake and send a large
    message: who answered, as what address it saw us, and whether a large message got through where the
    small ones did (``delay`` seconds first, for benchmarks). A peer that took the connection and does
    not answer within REPLY_WAIT (at least ``timeout``) is slow (its host is busy), not unreachable."""
    started = time.monotonic()
    time.sleep(delay)
    peer_ip = None
    reply: tuple[str, str] | None = None  # who answered, and as what address it saw us
    large: tuple[str | None, int | None, int | None] = (None, None, None)
    reply_wait = max(timeout, REPLY_WAIT)
    try:
        with connect(target.address, target.port, timeout) as conn:
            peer_ip = plain_address(str(conn.getpeername()[0]))
            conn.settimeout(reply_wait)
            conn.sendall(json.dumps({"token": token, "from": name, "large": LARGE}).encode() + b"\n")
            try:
                reply = _reply(_read_line(conn))
            except TimeoutError:
                return Link(target, False, time.monotonic() - started, "slow",
                            f"connected, but no reply within {reply_wait:g}s: the host is busy", peer_ip=peer_ip)
            seconds = time.monotonic() - started
            if reply is not None and reply[0] == target.peer:
                large = send_large(conn, timeout)
    except OSError as exc:
        failure, error = describe(exc)
        return Link(target, False, time.monotonic() - started, failure, error, peer_ip=peer_ip)
    if reply is None:
        return Link(target, False, seconds, "no-probe", "connected, but no probe answered: another program "
                    "holds that port", peer_ip=peer_ip)
    answered, seen = reply
    if answered != target.peer:
        return Link(target, False, seconds, "wrong-host", f"{answered} answered, not {target.peer}",
                    seen=seen, answered_by=answered, peer_ip=peer_ip)
    return Link(target, True, seconds, seen=seen, answered_by=answered, peer_ip=peer_ip, large_error=large[0],
                large_acked=large[1], large_resent=large[2])


def _reply(line: bytes) -> tuple[str, str] | None:
    """A listener's answer to the handshake: (its name, the address it saw); None: not a probe's."""
    try:
        reply = json.loads(line)
        return str(reply["name"]), str(reply["seen"])
    except (ValueError, KeyError, TypeError):
        return None


def check_links(targets: Sequence[Target], name: str, token: str, timeout: float, delay: float = 0.0) -> list[Link]:
    """Every target at once, one thread each; a connection still hanging after the timeout
    (a stalled name lookup) is reported as such."""
    limit = delay + 2 * timeout + max(timeout, REPLY_WAIT) + 1.0  # connect, the answer, the large message

    def one(target: Target) -> Callable[[], Link]:
        def call() -> Link:
            link, seconds, error = bounded(lambda: check_link(target, name, token, timeout, delay), limit)
            return link or Link(target, False, seconds, "timeout", error)
        return call

    return in_parallel(one(t) for t in targets)


# -- the probe process ----------------------------------------------------------------


def runtime_facts() -> dict[str, Any]:
    """torch's version, the GPUs it sees and NCCL's version (this process imports torch)."""
    try:
        import torch
    except Exception as exc:
        return {"torch": None, "torch_error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    facts: dict[str, Any] = {"torch": str(torch.__version__), "cuda_devices": 0, "nccl": None}
    try:
        facts["cuda_devices"] = int(torch.cuda.device_count())
        if facts["cuda_devices"] and torch.distributed.is_nccl_available():
            version = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception as exc:
        facts["cuda_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return facts


def survey(name: str, token: str, timeout: float, master_addr: str, master_port: int | None,
           lookups: bool = True, master_socket: socket.socket | None = None) -> tuple[dict[str, Any], list[Listener]]:
    """This host's facts (the ``facts`` event's fields) and its listeners, started: the mesh's on a
    free port, and MASTER_PORT's when ``master_port`` is given (on ``master_socket``, bound to it,
    where the port holder handed it over). ``lookups``: also time reverse lookups of the advertised
    address and MASTER_ADDR (the doctor's; the preflight needs none)."""
    hostname = socket.gethostname()
    interfaces = read_interfaces()
    resolved = resolve(hostname, timeout)
    gloo = gloo_address(os.environ.get("GLOO_SOCKET_IFNAME"), hostname, resolved.answer, interfaces, can_bind)
    nccl = nccl_address(os.environ.get("NCCL_SOCKET_IFNAME"), interfaces)
    queries = dict.fromkeys(a for a in (gloo.address, master_addr) if a and family(a)) if lookups else {}
    reverses = in_parallel(partial(reverse, a, timeout) for a in queries)
    mesh = Listener(name, token, 0, timeout)
    listeners, master_error = [mesh], None
    if master_port is not None:
        try:
            listeners.append(Listener(name, token, master_port, timeout, master_socket))
        except OSError as exc:
            master_port, master_error = None, describe(exc)[1]
    facts = dict(hostname=hostname, python=sys.version.split()[0], executable=sys.executable, machine=machine_id(),
                 interfaces=[asdict(i) for i in interfaces], resolved=asdict(resolved),
                 reverse=[asdict(r) for r in reverses], gloo=asdict(gloo), nccl=asdict(nccl),
                 env={k: os.environ[k] for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME") if k in os.environ},
                 port=mesh.port, master_port=master_port, master_port_error=master_error)
    return facts, listeners


class Probe:
    """One host's probe, driven by its instructions and its stdin (see the module)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.token: str = spec["token"]
        self.name: str = spec["name"]
        self.timeout = float(spec["timeout"])
        self.lifetime = float(spec["lifetime"])
        self.master_addr: str = spec["master_addr"]
        self.master_port: int | None = spec.get("master_port")
        self.lookup_peers = bool(spec.get("lookup_peers"))
        self.delay = float(os.environ.get(DELAY_VAR) or 0)
        self._emit_lock = threading.Lock()

    def report(self, event: EventKind, **fields: Any) -> None:
        with self._emit_lock:
            emit(self.token, event, **fields)

    def run(self) -> int:
        threading.Thread(target=self._expire, name="lab-probe-expire", daemon=True).start()
        listeners = self._facts()
        try:
            line = sys.stdin.buffer.readline()
            if line.strip():
                targets = [Target(**t) for t in json.loads(line)["targets"]]
                links = check_links(targets, self.name, self.token, self.timeout, self.delay)
                self.report("links", links=[asdict(link) for link in links])
                sys.stdin.buffer.readline()  # every host's links are in (or the controller is gone)
            threading.Thread(target=self._runtime, name="lab-probe-runtime", daemon=True).start()
            while sys.stdin.buffer.readline():
                pass
        finally:
            for listener in listeners:
                listener.close()
        if self.lookup_peers:
            self._heard(listeners)
        return 0

    def _facts(self) -> list[Listener]:
        """Report this host's facts and start its listeners."""
        facts, listeners = survey(self.name, self.token, self.timeout, self.master_addr, self.master_port)
        self.report("facts", **facts)
        return listeners

    def _runtime(self) -> None:
        try:
            done = subprocess.run([sys.executable, "-m", "lab.rank.probe", "runtime"], stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=self.lifetime, check=False)
            facts = json.loads(done.stdout.decode().strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            facts = {"torch": None, "torch_error": f"the torch check failed: {describe(exc)[1]}"}
        self.report("runtime", **facts)

    def _heard(self, listeners: Sequence[Listener]) -> None:
        """Report who connected, and how long reverse lookups of their addresses take (the
        store looks up each peer's address as it accepts it)."""
        heard: dict[str, set[str]] = {}
        for listener in listeners:
            for address, names in listener.snapshot().items():
                heard.setdefault(address, set()).update(names)
        lookups = in_parallel(partial(reverse, a, self.timeout) for a in sorted(heard) if not is_loopback(a))
        self.report("heard", sources=[{"address": a, "from": sorted(names)} for a, names in sorted(heard.items())],
                    lookups=[asdict(lookup) for lookup in lookups])

    def _expire(self) -> None:
        time.sleep(self.lifetime)
        sys.stderr.write(f"lab.rank.probe: still running after {self.lifetime:g}s; stopping\n")
        sys.stderr.flush()
        os._exit(124)


def main(argv: Sequence[str]) -> int:
    if list(argv) == ["runtime"]:
        print(json.dumps(runtime_facts()), flush=True)
        return 0
    return Probe(json.loads(os.environ[PROBE_VAR])).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
