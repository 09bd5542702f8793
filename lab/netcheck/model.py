"""The doctor's data: what each host's probe reported, and the findings drawn from it.

Pure data; :class:`Diagnosis` is what ``lab doctor`` prints (``lab.cli.views.doctor``) and
``--json`` writes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from lab.errors import ExitCode
from lab.inventory.model import Host
from lab.rank.netfacts import (
    Advertised,
    Interface,
    Link,
    Lookup,
    Target,
)

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
Check = Literal["reach", "probe", "versions", "gpus", "resolve", "lookup", "interface", "master", "mesh", "nat",
                "family", "slurm", "mtu", "overlay", "busy"]


@dataclass(frozen=True)
class Finding:
    """One result worth a person's attention; every error and warning says why and what to do."""

    severity: Severity
    check: Check
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
    machine: str  # equal on hosts that share a network stack (see lab.rank.probe.machine_id)
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
            "hosts": [{"name": r.name, "machine": r.host.machine, "connection": r.host.connection,
                       "unreachable": r.unreachable,
                       "failure": r.failure, "facts": asdict(r.facts) if r.facts else None,
                       "runtime": asdict(r.runtime) if r.runtime else None,
                       "heard": [asdict(h) for h in r.heard]} for r in self.reports],
            "links": [{"from": r.name, **asdict(link)} for r in self.reports for link in r.links],
            "findings": [asdict(f) for f in self.findings],
        }


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
