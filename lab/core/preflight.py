"""The preflight, on the controller: before any rank starts, the hosts' launchers check the network
the job will use (the hosts' half: ``lab.rank.preflight``), and this says what to check and whether
the ranks may start.

Each launcher reports its host's facts (the address gloo will advertise there, the port it listens
on; rank 0's host also listens on MASTER_PORT). Once every host has, each gets its targets (the
doctor's: MASTER_ADDR:MASTER_PORT and every peer's advertised address, ``plan_targets``) and
reports how connecting to each went. Once every host has, the doctor's network rules judge the
links (``lab.netcheck.rules``): an error stops the run before any rank starts, with the doctor's
cause and fix; otherwise every launcher is told to go. Pure: the runner carries the lines.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Literal

from lab.core.outcome import Cause, Evidence
from lab.core.plan import Plan, bind_macros
from lab.netcheck.model import Finding, HostReport, Master, facts_from, link_from
from lab.netcheck.rules import analyse, master_endpoint, plan_targets
from lab.rank.events import Probe
from lab.rank.preflight import GO

EVENTS = frozenset({"facts", "links", "closed"})  # what a host's launcher sends in its preflight
# the doctor's checks that apply before a job
NETWORK_CHECKS = frozenset({"resolve", "interface", "master", "mesh", "nat", "family", "mtu", "busy"})
NOTE = ("the preflight checks what `lab doctor` checks of the network, from each host's launcher; "
        "--no-preflight skips it")


class Preflight:
    """What the hosts' launchers reported in the preflight, and what to tell them next (:meth:`lines`)."""

    def __init__(self, plan: Plan, ports: Sequence[int]) -> None:
        first = plan.hosts[0]
        port = int(bind_macros(plan.master_port, "", ports)) if plan.master_port else None
        self.master = Master(first.name, plan.master_addr, port)
        self.reports = {host.name: HostReport(host) for host in plan.hosts}
        self.linked: set[str] = set()  # the hosts whose links came
        self.closed = False  # rank 0's host stopped listening
        self.step: Literal["facts", "links", "closed", "decided"] = "facts"  # what it waits for
        self.cause: Cause | None = None  # why it stopped the run

    @property
    def decided(self) -> bool:
        """Every host was told to go, or the network failed."""
        return self.step == "decided"

    def take(self, host: str, event: Probe) -> None:
        """A preflight event from ``host``'s launcher (one of each; any more are ignored)."""
        report, kind = self.reports[host], event.kind
        try:
            if kind == "facts" and report.facts is None and report.failure is None:
                report.facts = facts_from(event.fields)
            elif kind == "links" and host not in self.linked:
                report.links = tuple(link_from(link) for link in event.fields["links"])
                self.linked.add(host)
        except (KeyError, TypeError, ValueError) as exc:
            report.failure = f"its launcher's preflight {kind} are unreadable: {exc!r}"
            self.linked.add(host)
        self.closed |= kind == "closed" and host == self.master.host

    def lines(self) -> dict[str, bytes]:
        """What to tell which host's launcher now: its targets, once every host reported its facts;
        once every host reported its links and the network passed, ``go`` to rank 0's host, and once
        that one stopped listening on MASTER_PORT (where the others' ranks would reach its listener in
        place of the store), to the others (to all at once when it did not listen there). When the
        network failed: nothing, and ``cause`` says why."""
        if self.step == "facts" and all(r.facts is not None or r.failure is not None for r in self.reports.values()):
            self.step = "links"
            return self._targets()
        if self.step == "links" and len(self.linked) == len(self.reports):
            self.cause = network_cause(self.findings())
            if self.cause is not None:
                self.step = "decided"
                return {}
            home = self.reports[self.master.host].facts
            self.step = "closed" if home is not None and home.master_port is not None else "decided"
            return {self.master.host: GO + b"\n"} if self.step == "closed" else dict.fromkeys(self.reports, GO + b"\n")
        if self.step == "closed" and self.closed:
            self.step = "decided"
            return {name: GO + b"\n" for name in self.reports if name != self.master.host}
        return {}

    def _targets(self) -> dict[str, bytes]:
        self.master = master_endpoint(self.master, self.reports[self.master.host])
        plans = plan_targets(list(self.reports.values()), self.master)
        self.linked.update(set(self.reports) - set(plans))  # (no facts: nothing to connect from)
        return {name: json.dumps({"targets": [asdict(t) for t in targets]}).encode() + b"\n"
                for name, targets in plans.items()}

    def findings(self) -> list[Finding]:
        """The doctor's findings about the network, from what the hosts reported."""
        return [f for f in analyse(tuple(self.reports.values()), self.master)
                if f.check in NETWORK_CHECKS or f.severity == "error" and f.check == "probe"]


def network_cause(findings: Sequence[Finding]) -> Cause | None:
    """Why the run cannot start, from the doctor's findings: the first error is the headline, the
    others and the warnings about addresses (NAT) its evidence; None when none is an error."""
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        return None
    first = errors[0]
    evidence = tuple(Evidence(None, f.subject, f.message, None) for f in findings
                     if f is not first and (f.severity == "error" or f.check in ("nat", "family", "busy")))
    notes = ((first.cause,) if first.cause else ()) + (NOTE,)
    return Cause("network", f"The preflight stopped the run before any rank started: {first.message}.",
                 evidence, first.fix or None, notes)
