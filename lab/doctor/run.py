"""``python -m lab doctor``: can this cluster run a job, and if not, why and what to do.

:func:`diagnose` starts one probe (:mod:`lab.rank.probe`) per host through the host's
transport, all at once, and drives them in two phases. Phase 1: every probe reports its
facts (versions, name resolution, interfaces, the addresses gloo and NCCL will
advertise) and keeps a listener open. Phase 2: the controller sends each probe its
targets, MASTER_ADDR and every peer's advertised address (and its data_address where
that differs), and every probe connects to all of them at once, so the all-pairs check
takes about as long as the slowest pair. Listeners tell each connecting host the source
address they saw, which is how NAT shows. Every wait is bounded; nothing is left
running on any host.

What the probes said goes to :mod:`lab.netcheck.rules` , which
turns it into findings; :func:`explain_hang` gives a run that timed out the likely network
cause in a few lines.
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import deque
from dataclasses import asdict
from typing import Any

from lab.core.plan import interface_env, new_token, public_id
from lab.core.streams import read_events
from lab.doctor import slurm
from lab.doctor.overlay import overlay_findings
from lab.errors import HostUnreachable
from lab.inventory.model import Host, Inventory
from lab.netcheck.model import (
    SEVERITIES,
    Diagnosis,
    HostReport,
    Master,
    Runtime,
    facts_from,
    link_from,
)
from lab.netcheck.rules import analyse, hang_causes, master_endpoint, plan_targets
from lab.rank.events import MalformedEvent, Probe
from lab.rank.netfacts import (
    Lookup,
    Target,
)
from lab.rank.probe import PROBE_VAR
from lab.rank.protocol import LINE_MAX
from lab.transport.base import RankProcess, code_uploads, for_each_host, release
from lab.transport.reach import transport_for
from lab.transport.ssh.settings import SSHSettings

log = logging.getLogger(__name__)

FACTS_GRACE = 20.0  # seconds, on top of its lookups' timeouts, for a probe to start and report its facts
RUNTIME_WAIT = 60.0  # seconds for torch to import on a host
LINKS_GRACE = 5.0  # seconds, on top of the connections' timeouts, for a probe to report them
READERS_WAIT = 2.0  # seconds for a stopped probe's readers to meet the end of its streams
STDERR_KEPT = 20  # lines of a probe's stderr kept for the reason it failed
PROBE_FILES = ("code/lab/__init__.py", "code/lab/rank/__init__.py", "code/lab/rank/probe.py",
               "code/lab/rank/netfacts.py", "code/lab/rank/protocol.py", "code/lab/rank/tcpinfo.py")


class _ProbeRun:
    """One host's probe process: its events as they come, and the end of its stderr."""

    def __init__(self, name: str, process: RankProcess, token: str) -> None:
        self.name, self.process = name, process
        self.started = time.monotonic()
        self.events: dict[str, dict[str, Any]] = {}
        self.stderr: deque[str] = deque(maxlen=STDERR_KEPT)
        self._token = token
        self._ended = False
        self._changed = threading.Condition()
        self._readers = [threading.Thread(target=self._read_events, name=f"lab-doctor-{name}-out", daemon=True),
                         threading.Thread(target=self._read_stderr, name=f"lab-doctor-{name}-err", daemon=True)]
        for reader in self._readers:
            reader.start()

    def stop(self) -> None:
        """Kill the probe and release its streams and channel, then let its readers finish (they
        meet the end of the streams), so that nothing holds a stream once the doctor is done."""
        self.process.kill()
        for reader in self._readers:
            reader.join(READERS_WAIT)

    def _read_events(self) -> None:
        """Its stdout's events, read within bounds (lab.core.streams.read_events)."""
        try:
            said = lambda line: log.debug("%s: %s", self.name, line)  # (the probe's other lines)
            for event in read_events(self.process.stdout, self._token, said):
                with self._changed:
                    self.events[event.kind] = event.fields if isinstance(event, Probe) else {}
                    self._changed.notify_all()
        except (OSError, MalformedEvent) as exc:
            log.debug("%s: reading the probe: %s", self.name, exc)
        finally:
            with self._changed:
                self._ended = True
                self._changed.notify_all()

    def _read_stderr(self) -> None:
        try:
            for raw in iter(lambda: self.process.stderr.readline(LINE_MAX), b""):  # (a longer line: in pieces)
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
    master = Master(first.name, first.peer_address, None, master_port)
    token = new_token()
    uploads = {rel: path for rel, path in code_uploads().items() if rel in PROBE_FILES}
    lifetime = 5 * timeout + FACTS_GRACE + RUNTIME_WAIT + LINKS_GRACE
    transports = {name: transport_for(h, ssh) for name, h in hosts.items()}
    reports = {name: HostReport(h) for name, h in hosts.items()}
    probes: dict[str, _ProbeRun] = {}
    seconds: dict[str, float] = {}

    def launch(host: Host) -> None:
        transport = transports[host.name]
        run_dir = transport.prepare(f"lab-doctor-{public_id(token)}", uploads)
        spec = {"token": token, "name": host.name, "timeout": timeout, "lifetime": lifetime,
                "master_addr": master.address, "master_port": master_port if host is first else None,
                "lookup_peers": host is first}
        env = {"PYTHONPATH": f"{run_dir}/code", "PYTHONUNBUFFERED": "1", PROBE_VAR: json.dumps(spec),
               **interface_env(host)}
        process = transport.start(transport.module_argv("lab.rank.probe"), env, run_dir)
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
        master = master_endpoint(master, reports[first.name])
        mesh_started = time.monotonic()
        _connect_all(probes, reports, plan_targets(list(reports.values()), master), timeout)
        seconds["mesh"] = time.monotonic() - mesh_started
        _gather_runtime(probes, reports)  # (asked only now: see lab.rank.probe)
        for probe in probes.values():
            probe.process.close_stdin()  # the end of phase 2: each probe closes its listeners and exits
        _gather_heard(probes.get(first.name), reports[first.name], timeout)
        scheduler_started = time.monotonic()
        scheduler = None if first.is_local or reports[first.name].unreachable else \
            slurm.ask(transports, inventory.hosts, timeout)
        seconds["slurm"] = time.monotonic() - scheduler_started
    finally:
        for_each_host(probes, lambda probe: probe.stop())  # streams and channels first, then the connections
        for_each_host(transports, release)
    seconds["total"] = time.monotonic() - started
    ordered = tuple(reports[name] for name in hosts)
    found = (analyse(ordered, master) + (slurm.findings(scheduler, inventory.hosts) if scheduler else [])
             + overlay_findings(inventory.hosts))
    return Diagnosis(ordered, master, tuple(sorted(found, key=lambda f: SEVERITIES.index(f.severity))), seconds)


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


def _connect_all(probes: dict[str, _ProbeRun], reports: dict[str, HostReport],
                 plans: dict[str, list[Target]], timeout: float) -> None:
    sent: dict[str, float] = {}
    for name, targets in plans.items():
        try:
            probes[name].process.send(json.dumps({"targets": [asdict(t) for t in targets]}).encode() + b"\n")
            sent[name] = time.monotonic()
        except (OSError, EOFError) as exc:
            reports[name].failure = f"the probe stopped before phase 2: {exc}"
    waited = 3 * timeout + LINKS_GRACE  # connect, answer, large message
    for name, at in sent.items():
        data = probes[name].wait("links", at + waited)
        if data is None:
            reports[name].failure = probes[name].silence("connections", waited)
            continue
        reports[name].links = tuple(link_from(link) for link in data["links"])


def _gather_runtime(probes: dict[str, _ProbeRun], reports: dict[str, HostReport]) -> None:
    """Tell every probe to ask torch now, and wait for each one's answer."""
    asked = time.monotonic()
    for probe in probes.values():
        with contextlib.suppress(OSError, EOFError):  # (a probe that is gone says so below)
            probe.process.send(b'{"runtime": true}\n')
    for name, probe in probes.items():
        if reports[name].facts is None:
            continue
        data = probe.wait("runtime", asked + RUNTIME_WAIT)
        reports[name].runtime = Runtime(**data) if data is not None else Runtime(
            None, f"torch did not answer within {RUNTIME_WAIT:g}s")


def _gather_heard(probe: _ProbeRun | None, report: HostReport, timeout: float) -> None:
    """The reverse lookups MASTER_ADDR's host made of its peers, once its stdin is closed."""
    if probe is None:
        return
    data = probe.wait("heard", time.monotonic() + timeout + LINKS_GRACE)
    if data is not None:
        report.heard = tuple(Lookup(**{**lookup, "answer": tuple(lookup["answer"])}) for lookup in data["lookups"])


def explain_hang(inventory: Inventory, ssh: SSHSettings | None = None, timeout: float = 5.0) -> list[str]:
    """After a run timed out in its rendezvous or first collective: :func:`diagnose` the cluster and
    return the likely causes as short lines; one line saying the network is fine when it is. The
    run's own MASTER_PORT is not tried again: its store held it (a port another program held would
    have failed the run's rank 0, which says so), and its closed connections may hold it a while."""
    return hang_causes(diagnose(inventory, ssh, timeout=timeout))

