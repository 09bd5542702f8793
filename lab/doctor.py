"""``python -m lab doctor``: can this cluster run a job, and if not, why and what to do.

:func:`diagnose` starts one probe (:mod:`lab.probe`) per host through the host's
transport, all at once, and drives them in two phases. Phase 1: every probe reports its
facts (versions, name resolution, interfaces, the addresses gloo and NCCL will
advertise) and keeps a listener open. Phase 2: the controller sends each probe its
targets, MASTER_ADDR and every peer's advertised address (and its data_address where
that differs), and every probe connects to all of them at once, so the all-pairs check
takes about as long as the slowest pair. Listeners tell each connecting host the source
address they saw, which is how NAT shows. Every wait is bounded; nothing is left
running on any host.

:func:`analyse` turns what the probes said into :class:`Finding` s, each failed check
with its likely cause and fix; it is pure, and so are the helpers it uses.
:func:`print_diagnosis` shows the result as tables; :func:`explain_hang` gives the
runner's timeouts the likely network cause in a few lines.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .errors import ExitCode, HostUnreachable
from .inventory import Host, Inventory
from .plan import data_address, interface_env
from .probe import PROBE_VAR, Advertised, Interface, Link, Lookup, Target, family, is_loopback
from .transport import RankProcess, Transport, code_uploads, for_each_host, transport_for
from .transport.ssh import SSHSettings
from .worker import MARK

log = logging.getLogger(__name__)

SLOW_LOOKUP = 1.0  # seconds: a name lookup slower than this stalls init noticeably
FACTS_GRACE = 20.0  # seconds, on top of its lookups' timeouts, for a probe to start and report its facts
RUNTIME_WAIT = 60.0  # seconds for torch to import on a host
LINKS_GRACE = 5.0  # seconds, on top of the connections' timeouts, for a probe to report them
MATRIX_MAX = 12  # hosts up to which the mesh prints as a matrix
STDERR_KEPT = 20  # lines of a probe's stderr kept for the reason it failed
PROBE_FILES = ("code/lab/__init__.py", "code/lab/probe.py", "code/lab/worker.py")
SEVERITIES = ("error", "warning", "info")

SAME_NETWORK_FIX = ("put the hosts on one network or peer the VPCs (a route between the private ranges); "
                    "or join them with an overlay/VPN (WireGuard, Tailscale) and set network_interface "
                    "(GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME) to it (wg0, tailscale0)")
PORTS_FIX = ("open TCP between the hosts for MASTER_PORT (the store) and gloo's ports (ephemeral: "
             "net.ipv4.ip_local_port_range, usually 32768-60999) on the interface gloo uses, or set "
             "network_interface to an interface every host reaches")
NO_NETWORK_CAUSE = ("the network checks pass (every host reaches MASTER_ADDR and every peer's advertised "
                    "address): the hang is likely in the program (a rank that skips a collective, or waits "
                    "for a message nobody sends)")


@dataclass(frozen=True)
class Finding:
    """One result worth a person's attention; every error and warning says why and what to do."""

    severity: str  # error | warning | info
    check: str  # reach | probe | versions | gpus | resolve | lookup | interface | master | mesh | nat | family
    subject: str  # a host, "a -> b", or "cluster"
    message: str
    cause: str = ""
    fix: str = ""


@dataclass(frozen=True)
class Runtime:
    """What torch says on a host."""

    torch: str | None
    torch_error: str | None = None
    cuda_devices: int = 0
    nccl: str | None = None
    cuda_error: str | None = None


@dataclass(frozen=True)
class HostFacts:
    """What a probe reported about its host in phase 1."""

    hostname: str
    python: str
    machine: str  # equal on hosts that share a network stack (see lab.probe.machine_id)
    interfaces: tuple[Interface, ...]
    resolved: Lookup  # the hostname -> its addresses
    gloo: Advertised
    nccl: Advertised
    port: int  # the probe's listener
    reverse: tuple[Lookup, ...] = ()  # its advertised address and MASTER_ADDR -> names
    executable: str = ""
    env: dict[str, str] = field(default_factory=dict)  # GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME as set
    master_port: int | None = None  # MASTER_PORT, when it was asked for and this host could listen on it
    master_port_error: str | None = None

    @property
    def addresses(self) -> set[str]:
        """Every address the host believes it has."""
        return {a for i in self.interfaces for a in i.addresses}


@dataclass
class HostReport:
    """Everything learnt about one host."""

    host: Host
    facts: HostFacts | None = None
    runtime: Runtime | None = None
    links: tuple[Link, ...] = ()  # its connections to the targets
    heard: tuple[Lookup, ...] = ()  # reverse lookups of the peers it heard from (MASTER_ADDR's host)
    unreachable: str | None = None  # the transport's one line
    failure: str | None = None  # reached, but the probe did not run or report

    @property
    def name(self) -> str:
        return self.host.name


@dataclass(frozen=True)
class Master:
    """MASTER_ADDR as the ranks get it: rank 0's host's data address, and the port probed."""

    host: str
    address: str
    port: int | None  # None: rank 0's host did not report
    requested_port: int | None = None  # --master-port, when given


@dataclass
class Diagnosis:
    """The doctor's verdict: pure data (see :func:`print_diagnosis`, :meth:`to_json`)."""

    reports: tuple[HostReport, ...]
    master: Master
    findings: tuple[Finding, ...]
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall time

    @property
    def unreachable(self) -> dict[str, str]:
        """Hosts the transport could not reach, and why."""
        return {r.name: r.unreachable for r in self.reports if r.unreachable}

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def ok(self) -> bool:
        """The cluster can run a job: every host reached, no check failed."""
        return not self.unreachable and not self.errors

    @property
    def exit_code(self) -> ExitCode:
        if self.unreachable:
            return ExitCode.UNREACHABLE
        return ExitCode.CHECK_FAILED if self.errors else ExitCode.OK

    def mesh(self) -> dict[tuple[str, str], Link]:
        """(from, to) -> the connection to the peer's advertised address."""
        return {(r.name, link.target.peer): link for r in self.reports for link in r.links
                if link.target.kind == "mesh"}

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "ok": self.ok, "exit_code": int(self.exit_code), "master": asdict(self.master),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "hosts": [{"name": r.name, "connection": r.host.connection, "unreachable": r.unreachable,
                       "failure": r.failure, "facts": asdict(r.facts) if r.facts else None,
                       "runtime": asdict(r.runtime) if r.runtime else None,
                       "heard": [asdict(h) for h in r.heard]} for r in self.reports],
            "links": [{"from": r.name, **asdict(link)} for r in self.reports for link in r.links],
            "findings": [asdict(f) for f in self.findings],
        }


# -- running the probes ---------------------------------------------------------------


class _ProbeRun:
    """One host's probe process: its events as they come, and the end of its stderr."""

    def __init__(self, name: str, process: RankProcess, token: str) -> None:
        self.name, self.process = name, process
        self.started = time.monotonic()
        self.events: dict[str, dict[str, Any]] = {}
        self.stderr: deque[str] = deque(maxlen=STDERR_KEPT)
        self._prefix = f"{MARK}{token} "
        self._ended = False
        self._changed = threading.Condition()
        threading.Thread(target=self._read_events, name=f"lab-doctor-{name}-out", daemon=True).start()
        threading.Thread(target=self._read_stderr, name=f"lab-doctor-{name}-err", daemon=True).start()

    def _read_events(self) -> None:
        try:
            for raw in iter(self.process.stdout.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if not line.startswith(self._prefix):
                    log.debug("%s: %s", self.name, line)
                    continue
                event = json.loads(line[len(self._prefix):])
                with self._changed:
                    self.events[event.pop("event")] = event
                    self._changed.notify_all()
        except (OSError, ValueError, KeyError) as exc:
            log.debug("%s: reading the probe: %s", self.name, exc)
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()

    def _read_stderr(self) -> None:
        try:
            for raw in iter(self.process.stderr.readline, b""):
                self.stderr.append(raw.decode("utf-8", "replace").rstrip())
        except (OSError, ValueError):
            pass

    def wait(self, event: str, deadline: float) -> dict[str, Any] | None:
        """The event's fields once it came; None if the probe ended or the deadline passed first."""
        with self._changed:
            self._changed.wait_for(lambda: event in self.events or self._ended,
                                   timeout=max(0.0, deadline - time.monotonic()))
            return self.events.get(event)

    def silence(self, what: str, waited: float) -> str:
        """Why the probe did not report ``what``: its last stderr line, or how long it was waited for."""
        last = next((line for line in reversed(self.stderr) if line.strip()), None)
        if last is not None:
            return f"the probe did not report its {what}: {last}"
        return f"the probe did not report its {what} within {waited:g}s"


def diagnose(inventory: Inventory, ssh: SSHSettings | None = None, master_port: int | None = None,
             timeout: float = 5.0) -> Diagnosis:
    """Check every host of ``inventory`` and every pair of them; pure data, no printing.

    ``timeout`` bounds each network operation of the probes (a connection, its handshake,
    a name lookup); SSH logins are bounded by ``ssh.connect_timeout``. ``master_port``
    is the MASTER_PORT to try on rank 0's host (default: any free port). Never raises
    for a host problem: an unreachable host or a failed probe is in the result. Every
    probe is stopped and its files removed before it returns.
    """
    started = time.monotonic()
    hosts = {h.name: h for h in inventory.hosts}
    first = inventory.hosts[0]
    master = Master(first.name, data_address(first), None, master_port)
    token = secrets.token_hex(6)
    run_dir = os.path.join(tempfile.gettempdir(), f"lab-doctor-{token}")
    uploads = {rel: path for rel, path in code_uploads().items() if rel in PROBE_FILES}
    lifetime = 4 * timeout + FACTS_GRACE + RUNTIME_WAIT + LINKS_GRACE
    transports = {name: transport_for(h, ssh) for name, h in hosts.items()}
    reports = {name: HostReport(h) for name, h in hosts.items()}
    prepared: set[str] = set()
    probes: dict[str, _ProbeRun] = {}
    seconds: dict[str, float] = {}

    def launch(host: Host) -> None:
        transport = transports[host.name]
        transport.prepare(run_dir, uploads)
        prepared.add(host.name)
        spec = {"token": token, "name": host.name, "timeout": timeout, "lifetime": lifetime,
                "master_addr": master.address, "master_port": master_port if host is first else None,
                "lookup_peers": host is first}
        env = {"PYTHONPATH": f"{run_dir}/code", "PYTHONUNBUFFERED": "1", PROBE_VAR: json.dumps(spec),
               **interface_env(host)}
        process = transport.start(transport.module_argv("lab.probe"), env, run_dir)
        probes[host.name] = _ProbeRun(host.name, process, token)  # recorded at once: `finally` stops it

    try:
        for name, outcome in for_each_host(hosts, launch).items():
            if isinstance(outcome, HostUnreachable):
                reports[name].unreachable = str(outcome)
            elif isinstance(outcome, Exception):
                reports[name].failure = f"cannot start the probe: {outcome}"
        seconds["start"] = time.monotonic() - started
        _gather_facts(probes, reports, timeout)
        seconds["facts"] = time.monotonic() - started - seconds["start"]
        master = _master_endpoint(master, reports[first.name])
        mesh_started = time.monotonic()
        _connect_all(probes, reports, plan_targets(list(reports.values()), master), timeout)
        seconds["mesh"] = time.monotonic() - mesh_started
        _gather_runtime(probes, reports)
        for probe in probes.values():
            probe.process.close_stdin()  # the end of phase 2: each probe closes its listeners and exits
        _gather_heard(probes.get(first.name), reports[first.name], timeout)
    finally:
        for_each_host(probes, lambda probe: probe.process.kill())
        for_each_host(transports, lambda t: _release(t, run_dir, t.host.name in prepared))
    seconds["total"] = time.monotonic() - started
    ordered = tuple(reports[name] for name in hosts)
    return Diagnosis(ordered, master, tuple(analyse(ordered, master)), seconds)


def _release(transport: Transport, run_dir: str, prepared: bool) -> None:
    try:
        if prepared:
            transport.cleanup(run_dir)
    finally:
        transport.close()


def _gather_facts(probes: dict[str, _ProbeRun], reports: dict[str, HostReport], timeout: float) -> None:
    for name, probe in probes.items():
        waited = 2 * timeout + FACTS_GRACE
        data = probe.wait("facts", probe.started + waited)
        if data is None:
            reports[name].failure = probe.silence("facts", waited)
            continue
        try:
            reports[name].facts = facts_from(data)
        except (KeyError, TypeError) as exc:
            reports[name].failure = f"the probe's facts are unreadable: {exc!r}"


def _master_endpoint(master: Master, report: HostReport) -> Master:
    """The port every host tries for MASTER_ADDR: MASTER_PORT where rank 0's host could
    listen on it, else its probe's own listener."""
    if report.facts is None:
        return master
    return Master(master.host, master.address, report.facts.master_port or report.facts.port, master.requested_port)


def plan_targets(reports: Sequence[HostReport], master: Master) -> dict[str, list[Target]]:
    """What each host (with facts) connects to: MASTER_ADDR, every other host's advertised
    address (its own too when it runs several ranks: they connect to each other through
    it), and a peer's data_address where that differs from what it advertises."""
    ready = [r for r in reports if r.facts is not None]
    plans: dict[str, list[Target]] = {}
    for source in ready:
        targets = [Target("master", master.host, master.address, master.port)] if master.port else []
        for peer in ready:
            assert peer.facts is not None
            if peer is source and peer.host.slots < 2:
                continue
            advertised = peer.facts.gloo.address
            if advertised:
                targets.append(Target("mesh", peer.name, advertised, peer.facts.port))
            data = data_address(peer.host)
            if data != advertised and peer is not source:
                targets.append(Target("data", peer.name, data, peer.facts.port))
        plans[source.name] = targets
    return plans


def _connect_all(probes: dict[str, _ProbeRun], reports: dict[str, HostReport],
                 plans: dict[str, list[Target]], timeout: float) -> None:
    sent: dict[str, float] = {}
    for name, targets in plans.items():
        try:
            probes[name].process.send(json.dumps({"targets": [asdict(t) for t in targets]}).encode() + b"\n")
            sent[name] = time.monotonic()
        except (OSError, EOFError) as exc:
            reports[name].failure = f"the probe stopped before phase 2: {exc}"
    waited = 2 * timeout + LINKS_GRACE
    for name, at in sent.items():
        data = probes[name].wait("links", at + waited)
        if data is None:
            reports[name].failure = probes[name].silence("connections", waited)
            continue
        reports[name].links = tuple(link_from(link) for link in data["links"])


def _gather_runtime(probes: dict[str, _ProbeRun], reports: dict[str, HostReport]) -> None:
    for name, probe in probes.items():
        if reports[name].facts is None:
            continue
        data = probe.wait("runtime", probe.started + RUNTIME_WAIT)
        reports[name].runtime = Runtime(**data) if data is not None else Runtime(
            None, f"torch did not answer within {RUNTIME_WAIT:g}s")


def _gather_heard(probe: _ProbeRun | None, report: HostReport, timeout: float) -> None:
    """The reverse lookups MASTER_ADDR's host made of its peers, once its stdin is closed."""
    if probe is None:
        return
    data = probe.wait("heard", time.monotonic() + timeout + LINKS_GRACE)
    if data is not None:
        report.heard = tuple(Lookup(**{**lookup, "answer": tuple(lookup["answer"])}) for lookup in data["lookups"])


def facts_from(data: dict[str, Any]) -> HostFacts:
    """A probe's ``facts`` event as :class:`HostFacts`."""
    def lookup(d: dict[str, Any]) -> Lookup:
        return Lookup(d["query"], tuple(d["answer"]), d["seconds"], d.get("error"))

    return HostFacts(
        hostname=data["hostname"], python=data["python"], machine=data["machine"],
        interfaces=tuple(Interface(i["name"], tuple(i["addresses"])) for i in data["interfaces"]),
        resolved=lookup(data["resolved"]), gloo=Advertised(**data["gloo"]), nccl=Advertised(**data["nccl"]),
        port=int(data["port"]), reverse=tuple(lookup(r) for r in data["reverse"]),
        executable=data.get("executable", ""), env=dict(data.get("env", {})),
        master_port=data.get("master_port"), master_port_error=data.get("master_port_error"))


def link_from(data: dict[str, Any]) -> Link:
    """A probe's reported connection as :class:`Link`."""
    return Link(**{**data, "target": Target(**data["target"])})


# -- what it means ----------------------------------------------------------------------


def analyse(reports: Sequence[HostReport], master: Master) -> list[Finding]:
    """Every finding, errors first; pure."""
    findings = [*_reach_findings(reports), *_version_findings(reports), *_gpu_findings(reports),
                *_resolution_findings(reports), *_interface_findings(reports), *_family_findings(reports, master),
                *_master_findings(reports, master), *_mesh_findings(reports), *_nat_findings(reports)]
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def spans_machines(reports: Sequence[HostReport]) -> bool:
    """Whether the hosts are more than one network stack (a host not heard from counts as its own)."""
    machines = {r.facts.machine for r in reports if r.facts is not None}
    return len(machines) > 1 or any(r.facts is None and not r.host.is_local for r in reports)


def _reach_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    for r in reports:
        if r.unreachable:
            yield Finding("error", "reach", r.name, f"unreachable: {r.unreachable}",
                          "the transport could not log in to the host or find its container",
                          "check that the host is up and that ansible_host, ansible_port, ansible_user and the key "
                          "are right (a new host key needs --accept-new-host-keys)")
        elif r.failure:
            yield Finding("error", "probe", r.name, r.failure,
                          "the host was reached, but the lab's probe could not run there or stopped answering",
                          f"check that ansible_python_interpreter ({r.host.python}) is a Python 3 on {r.name}")


def _version_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    pythons = {r.name: ".".join(r.facts.python.split(".")[:2]) for r in reports if r.facts}
    torches = {r.name: r.runtime.torch.split("+")[0] for r in reports if r.runtime and r.runtime.torch}
    for r in reports:
        if r.runtime is not None and r.runtime.torch is None:
            python = r.facts.executable if r.facts and r.facts.executable else r.host.python
            usual = _most_common(torches)
            yield Finding("error", "versions", r.name, f"torch is not importable by {python}: {r.runtime.torch_error}",
                          "a rank cannot start without torch",
                          f"install torch{' ' + usual if usual else ''} for that Python, or set "
                          f"ansible_python_interpreter to the Python that has it")
    for what, versions, cause in (
            ("Python", pythons, "objects the ranks pickle for each other (the *_object collectives, mp.spawn) "
                                "may not load across Python versions"),
            ("torch", torches, "ranks on different torch versions may disagree at the rendezvous or on the wire: "
                               "init fails or hangs")):
        if len(set(versions.values())) > 1:
            usual = _most_common(versions)
            yield Finding("error", "versions", "cluster", f"{what} differs between hosts: {_grouped(versions)}",
                          cause, f"install the same {what} on every host (most have {usual})")


def _most_common(values: dict[str, str]) -> str | None:
    counts: dict[str, int] = {}
    for value in values.values():
        counts[value] = counts.get(value, 0) + 1
    return max(counts, key=lambda v: counts[v]) if counts else None


def _grouped(values: dict[str, str]) -> str:
    """``2.13.0 on a, b; 2.12.1 on c``."""
    groups: dict[str, list[str]] = {}
    for name, value in values.items():
        groups.setdefault(value, []).append(name)
    return "; ".join(f"{value} on {', '.join(names)}" for value, names in groups.items())


def _gpu_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    short = []
    for r in reports:
        if r.runtime is None or r.runtime.torch is None:
            continue
        seen = r.runtime.cuda_devices
        if r.host.gpus > seen:
            yield Finding("warning", "gpus", r.name,
                          f"the inventory says gpus: {r.host.gpus}, but torch sees {seen} GPU(s)"
                          + (f" ({r.runtime.cuda_error})" if r.runtime.cuda_error else ""),
                          "a CPU-only torch build, a missing driver, or GPUs not given to the container",
                          "correct gpus in the inventory, or install a CUDA build of torch and the driver")
        if seen < r.host.slots:
            short.append(f"{r.name} ({seen} for {r.host.slots} slot{'s' if r.host.slots > 1 else ''})")
    if short:
        yield Finding("info", "gpus", "cluster", f"fewer GPUs than ranks on {', '.join(short)}: runs use gloo "
                      "(nccl needs one GPU per rank)")


def _resolution_fix(r: HostReport) -> str:
    hostname = r.facts.hostname if r.facts else r.name
    return (f"map {hostname} to its routable address in /etc/hosts on {r.name} "
            f"('{data_address(r.host)} {hostname}'), or set network_interface (GLOO_SOCKET_IFNAME) "
            f"to the interface the other hosts reach")


def _resolution_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    several = spans_machines(reports)
    for r in reports:
        if r.facts is None:
            continue
        facts = r.facts
        if "GLOO_SOCKET_IFNAME" not in facts.env and several and facts.gloo.address and is_loopback(facts.gloo.address):
            if facts.resolved.answer and is_loopback(facts.resolved.answer[0]):
                message = (f"its hostname {facts.hostname} resolves to {facts.resolved.answer[0]} (loopback): "
                           f"gloo advertises it, so peers would connect to themselves")
                cause = ("a default /etc/hosts line ('127.0.1.1 hostname' on Debian and Ubuntu); the rendezvous "
                         "completes, then the first collective hangs")
            else:
                why = facts.resolved.error or f"it gives {', '.join(facts.resolved.answer) or 'nothing'}"
                message = (f"its hostname {facts.hostname} resolves to no address of {r.name} ({why}): "
                           f"gloo falls back to {facts.gloo.address}, which peers cannot reach")
                cause = ("gloo advertises the address the hostname resolves to; the rendezvous completes, "
                         "then the mesh hangs")
            yield Finding("error", "resolve", r.name, message, cause, _resolution_fix(r))
        slow = [lookup for lookup in (facts.resolved, *facts.reverse, *r.heard) if lookup.seconds > SLOW_LOOKUP]
        if slow:
            what = ("reverse lookups stall init" if any(lookup is not facts.resolved for lookup in slow)
                    else "resolving the hostname stalls init")
            details = ", ".join(f"{'getaddrinfo' if lookup is facts.resolved else 'gethostbyaddr'}({lookup.query}) "
                                f"took {lookup.seconds:.1f}s" for lookup in slow)
            yield Finding("warning", "lookup", r.name,
                          f"slow name resolution: {what} ({details})",
                          "a DNS server that does not answer for these names; the store and gloo look names up "
                          "at init (seen: about 20s)",
                          "give every host's address a name in /etc/hosts on every host (or fix the DNS server), "
                          "so lookups answer at once")


def _interface_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    for r in reports:
        if r.facts is None:
            continue
        names = ", ".join(f"{i.name} {i.addresses[0]}" for i in r.facts.interfaces
                          if i.addresses and not is_loopback(i.addresses[0])
                          and not i.addresses[0].startswith("fe80:")) or "none but loopback"
        from_inventory = r.host.network_interface is not None
        setting = f"network_interface {r.host.network_interface}" if from_inventory else "GLOO_SOCKET_IFNAME"
        fix = (f"set network_interface of {r.name} in the inventory to one of its interfaces that the other "
               f"hosts reach (it has: {names})" if from_inventory else
               f"unset GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME on {r.name} or name one of its interfaces ({names})")
        if r.facts.gloo.error:
            yield Finding("error", "interface", r.name,
                          f"{setting} ({r.facts.gloo.how}): {r.facts.gloo.error} on {r.name}",
                          "gloo cannot make its device: init_process_group fails on this host", fix)
        gpus = r.host.gpus > 0 or (r.runtime is not None and r.runtime.cuda_devices > 0)
        same_setting = r.facts.env.get("NCCL_SOCKET_IFNAME") == r.facts.env.get("GLOO_SOCKET_IFNAME")
        if r.facts.nccl.error and gpus and not (r.facts.gloo.error and same_setting):
            yield Finding("error", "interface", r.name, f"NCCL: {r.facts.nccl.error} on {r.name}",
                          "NCCL cannot bootstrap: init_process_group('nccl') fails on this host", fix)


def _family_findings(reports: Sequence[HostReport], master: Master) -> Iterable[Finding]:
    advertised = {r.name: r.facts.gloo.address for r in reports if r.facts and r.facts.gloo.address}
    families = {name: family(address) or "?" for name, address in advertised.items()}
    kinds = set(families.values()) - {"?"}
    if len(kinds) > 1:
        yield Finding("error", "family", "cluster",
                      "hosts advertise addresses of both families: "
                      + "; ".join(f"{n} {advertised[n]} ({f})" for n, f in families.items()),
                      "gloo connects each pair address to address: an IPv6 address cannot reach an IPv4-only one",
                      "make every hostname resolve to an address of one family (/etc/hosts), or set "
                      "network_interface to interfaces with IPv4 addresses")
    master_family = family(master.address) or next(
        (family(link.peer_ip) for r in reports for link in r.links if link.target.kind == "master" and link.peer_ip),
        None)
    if master_family and len(kinds) == 1 and master_family not in kinds:
        yield Finding("warning", "family", "cluster", f"MASTER_ADDR {master.address} is {master_family} but the "
                      f"hosts advertise {kinds.pop()} addresses",
                      "the store and gloo's mesh then use different networks: one may be reachable and not the other",
                      f"set data_address of {master.host} to an address of the family the hosts advertise")


def _why(link: Link, source: str) -> str:
    """The likely cause of one failed connection, from how it failed."""
    target = link.target
    return {
        "refused": f"{target.address} answers but nothing listens on port {target.port}: the address is not "
                   f"{target.peer}'s, or a firewall rejects the port",
        "timeout": "no answer: a firewall drops the traffic, or there is no route between the networks",
        "unreachable": f"no route from {source} to {target.address}: the hosts are on different networks",
        "resolve": f"{target.address} does not resolve on {source}",
        "wrong-host": f"{target.address} leads to {link.answered_by}, not {target.peer}: that address is another "
                      f"host's (the same private range in two networks?)",
        "no-probe": f"another program answers on {target.address}:{target.port}",
    }.get(link.failure or "", link.error or "the connection failed")


def _master_findings(reports: Sequence[HostReport], master: Master) -> Iterable[Finding]:
    home = next(r for r in reports if r.name == master.host)
    if home.facts is not None and home.facts.master_port_error:
        yield Finding("error", "master", master.host, f"MASTER_PORT {master.requested_port} cannot be used on "
                      f"{master.host}: {home.facts.master_port_error}",
                      "another job, or a rank left from an earlier run, holds the port",
                      f"choose another port, or stop what holds it (ss -ltnp 'sport = :{master.requested_port}')")
    fix = (f"set data_address of {master.host} to an address every host reaches (same network, VPC peering, or an "
           f"overlay such as WireGuard/Tailscale) and open TCP port {master.port} (the store) on {master.host}")
    failed = [(r.name, link) for r in reports for link in r.links if link.target.kind == "master" and not link.ok]
    tried = [r for r in reports if any(link.target.kind == "master" for link in r.links)]
    if failed and len(failed) == len(tried) > 1:
        yield Finding("error", "master", "cluster",
                      f"no host reaches MASTER_ADDR {master.address}:{master.port} ({failed[0][1].error})",
                      f"{_why(failed[0][1], failed[0][0])}; every rank's init_process_group waits for the store "
                      f"until its timeout", fix)
    else:
        for name, link in failed:
            yield Finding("error", "master", name,
                          f"cannot reach MASTER_ADDR {master.address}:{master.port}: {link.error}",
                          _why(link, name), fix)
    if home.facts is not None and family(master.address) and not is_loopback(master.address) \
            and master.address not in home.facts.addresses:
        own = ", ".join(sorted(a for a in home.facts.addresses if not is_loopback(a)))
        yield Finding("info", "master", master.host,
                      f"MASTER_ADDR {master.address} is not an address {master.host} has ({own}): "
                      f"hosts reach it through NAT or a forwarded port",
                      "the store listens on every address, so the rendezvous works that way; but each rank "
                      "advertises an address it has, not this one")


def _mesh_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    failed: dict[str, list[tuple[str, Link]]] = {}
    other_way: dict[str, set[str]] = {}  # peer -> addresses of it that someone reached (data_address, MASTER_ADDR)
    for r in reports:
        for link in r.links:
            if link.target.kind == "mesh" and not link.ok:
                failed.setdefault(link.target.peer, []).append((r.name, link))
            elif link.target.kind != "mesh" and link.ok:
                other_way.setdefault(link.target.peer, set()).add(link.target.address)
    findings, kinds = [], set()
    for peer, links in failed.items():
        sources = ", ".join(name for name, _ in links)
        link = links[0][1]
        address = link.target.address
        message = (f"{sources} cannot reach {peer} at {address}:{link.target.port}, the address gloo advertises "
                   f"there ({link.error})")
        if is_loopback(address):
            kinds.add("loopback")
            cause = f"{peer} advertises a loopback address: each peer connects to itself"
            fix = _resolution_fix(next(r for r in reports if r.name == peer))
        elif other_way.get(peer, set()) - {address}:
            kinds.add("private")
            reached = ", ".join(sorted(other_way[peer] - {address}))
            cause = (f"{peer} is reachable as {reached}, but gloo advertises {address}, an address of its own "
                     f"network that the others cannot route to (different networks or VPCs, NAT)")
            fix = SAME_NETWORK_FIX
        else:
            kinds.add("blocked")
            cause, fix = _why(link, links[0][0]), PORTS_FIX
        findings.append(Finding("error", "mesh", f"-> {peer}", message, cause, fix))
    tried = [link for r in reports for link in r.links if link.target.kind == "master"]
    if failed and tried and all(link.ok for link in tried):
        private = "private" in kinds or any(True for _ in _nat_findings(reports))
        fix = (SAME_NETWORK_FIX if private else PORTS_FIX if "blocked" in kinds
               else "make each host advertise a routable address (see each host's finding)")
        yield Finding("error", "mesh", "cluster",
                      f"the store (MASTER_ADDR) is reachable but ranks advertise {'private ' if private else ''}"
                      f"addresses other hosts cannot reach: the rendezvous will connect, then the mesh hangs",
                      "init_process_group reaches the store at MASTER_ADDR, then every pair of ranks connects "
                      "directly, to the address each one advertises", fix)
    yield from findings


def _nat_findings(reports: Sequence[HostReport]) -> Iterable[Finding]:
    for r in reports:
        if r.facts is None:
            continue
        seen: dict[str, set[str]] = {}
        for link in r.links:
            if link.ok and link.seen and not is_loopback(link.seen) and link.seen not in r.facts.addresses:
                seen.setdefault(link.seen, set()).add(link.target.peer)
        if not seen:
            continue
        believed = r.facts.gloo.address or ", ".join(sorted(r.facts.addresses))
        by = "; ".join(f"{address} by {', '.join(sorted(peers))}" for address, peers in seen.items())
        yield Finding("warning", "nat", r.name,
                      f"{r.name} is seen as {', '.join(seen)} but believes it is {believed}: behind NAT ({by})",
                      "its peers see another address than the one it has; gloo and NCCL advertise the address a "
                      "host has, which peers outside its network cannot reach",
                      SAME_NETWORK_FIX)


# -- for people and for the runner ------------------------------------------------------


def hang_causes(diagnosis: Diagnosis) -> list[str]:
    """Short lines: the likely causes of a hang at the rendezvous or the first collective
    (errors, and the warnings that slow or break init), each fix said once."""
    lines, fixes = [], set()
    for f in diagnosis.findings:
        if f.severity == "error" or (f.severity == "warning" and f.check in ("lookup", "nat", "family")):
            lines.append(f"{f.subject}: {f.message}" + (f"; fix: {f.fix}" if f.fix and f.fix not in fixes else ""))
            fixes.add(f.fix)
    return lines or [NO_NETWORK_CAUSE]


def explain_hang(inventory: Inventory, ssh: SSHSettings | None = None, master_port: int | None = None,
                 timeout: float = 5.0) -> list[str]:
    """After a run timed out in its rendezvous or first collective: :func:`diagnose` the
    cluster (the run's ranks must be gone: ``master_port`` is tried again) and return the
    likely causes as short lines; one line saying the network is fine when it is."""
    return hang_causes(diagnose(inventory, ssh, master_port, timeout))


SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_diagnosis(console: Console, diagnosis: Diagnosis) -> None:
    """The hosts table, MASTER_ADDR, the mesh, then every finding with its cause and fix."""
    console.print(_hosts_table(diagnosis))
    master = diagnosis.master
    tried = [link for r in diagnosis.reports for link in r.links if link.target.kind == "master"]
    reached = sum(link.ok for link in tried)
    line = Text(f"MASTER_ADDR {master.address}:{master.port or '-'} (rank 0 on {master.host}): ")
    line.append(f"reached from {reached}/{len(tried)} hosts",
                style="green" if tried and reached == len(tried) else "red")
    console.print(line, highlight=False)
    _print_mesh(console, diagnosis)
    for f in diagnosis.findings:
        console.print()
        head = Text(f"{f.severity.upper():8}", style=SEVERITY_STYLES[f.severity])
        head.append(f"{f.subject}: {f.message}")
        console.print(head, highlight=False)
        for label, text in (("cause", f.cause), ("fix", f.fix)):
            if text:
                console.print(Text(f"{'':8}{label}: {text}", style="dim" if label == "cause" else ""), highlight=False)
    console.print()
    console.print(Text(summary(diagnosis), style="bold green" if diagnosis.ok else "bold red"), highlight=False)


def summary(diagnosis: Diagnosis) -> str:
    mesh = diagnosis.mesh()
    counts = {s: sum(f.severity == s for f in diagnosis.findings) for s in SEVERITIES}
    pairs = f"{sum(link.ok for link in mesh.values())}/{len(mesh)} pairs reachable"
    took = f"checked in {diagnosis.seconds.get('total', 0.0):.1f}s"
    hosts = f"{len(diagnosis.reports)} host{'s' if len(diagnosis.reports) > 1 else ''}"
    if diagnosis.ok:
        notes = f", {counts['warning']} warning(s)" if counts["warning"] else ""
        return f"ok: the cluster can run a job ({hosts}, {pairs}{notes}; {took})"
    unreachable = len(diagnosis.unreachable)
    parts = [f"{unreachable} unreachable"] if unreachable else []
    parts += [f"{counts[s]} {s}{'s' if counts[s] > 1 else ''}" for s in ("error", "warning") if counts[s]]
    return f"not ready: {', '.join(parts)} ({hosts}, {pairs}; {took})"


def _hosts_table(diagnosis: Diagnosis) -> Table:
    """One row per host; the NCCL column only where some host has a GPU (else NCCL is not used)."""
    gpus = any(r.host.gpus or (r.runtime and r.runtime.cuda_devices) for r in diagnosis.reports)
    columns = ["host", "python", "torch", "GPUs", "hostname -> address", "gloo advertises",
               *(["NCCL advertises"] if gpus else []), "lookups"]
    table = Table(*columns, box=box.SIMPLE_HEAD, title="hosts", title_justify="left")
    for r in diagnosis.reports:
        if r.facts is None:
            why = Text(r.unreachable or r.failure or "no report", style="red")
            table.add_row(r.name, Text("unreachable" if r.unreachable else "probe failed", style="red"),
                          *([""] * (len(columns) - 3)), why)
            continue
        facts, runtime = r.facts, r.runtime
        torch = (Text(runtime.torch) if runtime.torch else Text("missing", style="red")) if runtime else Text("?")
        devices = f"{runtime.cuda_devices}/{r.host.slots}" + (f" nccl {runtime.nccl}" if runtime.nccl else "") \
            if runtime else "?"
        resolved = facts.resolved
        first = resolved.answer[0] if resolved.answer else (resolved.error or "nothing")
        resolves = Text(f"{facts.hostname} -> {first}", style="yellow" if is_loopback(first) else "")
        slowest = max((lookup.seconds for lookup in (*facts.reverse, *r.heard)), default=0.0)
        lookups = Text(_ms(resolved.seconds), style="red" if resolved.seconds > SLOW_LOOKUP else "")
        lookups.append(f" / {_ms(slowest)}", style="red" if slowest > SLOW_LOOKUP else "")
        table.add_row(r.name, facts.python, torch, devices, resolves, _advertised(facts.gloo),
                      *([_advertised(facts.nccl)] if gpus else []), lookups)
    table.caption = "GPUs: seen by torch / slots; lookups: forward / slowest reverse"
    table.caption_justify = "left"
    return table


def _advertised(advertised: Advertised) -> Text:
    if advertised.error:
        return Text(advertised.error, style="red")
    style = "yellow" if advertised.address and is_loopback(advertised.address) else ""
    return Text(f"{advertised.address} {advertised.interface or '?'}", style=style)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _print_mesh(console: Console, diagnosis: Diagnosis) -> None:
    mesh = diagnosis.mesh()
    names = [r.name for r in diagnosis.reports]
    if len(names) <= MATRIX_MAX:
        console.print(Text("mesh: each host to each peer's advertised address"), highlight=False)
        table = Table("from \\ to", *names, box=box.SIMPLE_HEAD)
        for source in names:
            cells = []
            for peer in names:
                link = mesh.get((source, peer))
                if link is None:  # itself with one slot: not needed; else not checked (see the findings)
                    cells.append(Text("-" if source == peer else "n/a", style="dim"))
                elif link.ok:
                    cells.append(Text(f"ok {_ms(link.seconds)}", style="green"))
                else:
                    cells.append(Text(link.failure or "failed", style="bold red"))
            table.add_row(source, *cells)
        console.print(table)
        return
    failed = [(pair, link) for pair, link in mesh.items() if not link.ok]
    console.print(Text(f"mesh: {len(mesh) - len(failed)}/{len(mesh)} pairs reachable",
                       style="green" if not failed else "red"), highlight=False)
    for (source, peer), link in failed:
        console.print(Text(f"  {source} -> {peer} {link.target.address}:{link.target.port}: {link.error}", style="red"),
                      highlight=False)
