"""The cross-VPC scenario: the tutorial's failure, reproduced, diagnosed, then fixed.

``python -m lab run cross-vpc`` on the cross-VPC lab runs the tutorial's job twice:

1. without peering, MASTER_ADDR = the master's external address: every rank connects to
   the store, then the mesh hangs (each rank advertises the private address it knows) and
   the run is stopped at its (short) timeout;
2. the doctor says why: who advertised what, and which pairs cannot reach each other;
3. with peering on, the same job passes.

It passes when the failure was the expected one, the diagnosis names it, and the fixed
run succeeds. :func:`run_scenario` runs the steps and leaves peering as it found it;
:func:`judge_scenario` judges them. Neither prints: what to show goes to callbacks.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from lab.containerlab import containers, crossvpc, engine
from lab.containerlab.engine import EngineError
from lab.core.judge import ExerciseReport, judge
from lab.core.outcome import OnLine, RunOutcome
from lab.core.plan import Options
from lab.core.planner import build_plan
from lab.core.runner import run_plan
from lab.doctor.run import diagnose
from lab.inventory.model import Inventory
from lab.netcheck.model import Diagnosis
from lab.transport.ssh.settings import SSHSettings

BROKEN_RUN_TIMEOUT = 20.0  # seconds: long enough for the store, short enough not to wait in vain
_STORE = re.compile(r"rank (?P<rank>\d+): connected to the store at (?P<master>\S+); I advertise (?P<mine>\S+)")


@dataclass(frozen=True)
class Step:
    what: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class ScenarioResult:
    steps: list[Step]
    diagnosis: Diagnosis

    @property
    def passed(self) -> bool:
        return all(step.passed for step in self.steps)


def run_scenario(inventory: Inventory, options: Options, ssh: SSHSettings, on_line: OnLine,
                 say: Callable[[str], None], show: Callable[[Diagnosis], None], keep: bool = False) -> ScenarioResult:
    """The three steps on the running cross-VPC lab; peering is left as it was found."""
    client = engine.client()
    lab = containers.lab_with_hosts(client, [h.address for h in inventory.hosts])
    if lab is None:
        raise EngineError(f"{inventory.path}: its hosts are no running lab's: start the cross-VPC lab with "
                          "`python -m lab up --topology cross-vpc` and use the inventory it writes")
    topology = containers.running_topology(client, lab)
    peered = crossvpc.peering(client, topology)  # also: is this the cross-VPC lab at all?
    try:
        say("1/3 peering off: the tutorial's job with MASTER_ADDR = the master's external address")
        crossvpc.set_peering(client, topology, False)
        # (without the preflight, which would stop it before the ranks start: the lesson is the hang)
        short = replace(options, timeout=min(options.timeout, BROKEN_RUN_TIMEOUT), preflight=False)
        broken = run_plan(build_plan(inventory, short), on_line=on_line, keep=keep, ssh=ssh)
        say("2/3 why: the doctor checks every host and pair")
        diagnosis = diagnose(inventory, ssh)
        show(diagnosis)
        for line in explain(broken, diagnosis):
            say(line)
        say("3/3 peering on: the same job")
        crossvpc.set_peering(client, topology, True)
        fixed = run_plan(build_plan(inventory, options), on_line=on_line, keep=keep, ssh=ssh)
    finally:
        crossvpc.set_peering(client, topology, peered)
    return ScenarioResult(judge_scenario(broken, diagnosis, judge(fixed)), diagnosis)


def store_connections(outcome: RunOutcome) -> dict[int, str]:
    """Rank -> the address it advertised, for every rank that got through the store."""
    found: dict[int, str] = {}
    for state in outcome.ranks:
        for line in state.tail:
            m = _STORE.search(line)
            if m and int(m["rank"]) == state.spec.rank:
                found[state.spec.rank] = m["mine"]
    return found


def unreachable_pairs(diagnosis: Diagnosis) -> list[tuple[str, str, str]]:
    """(from host, to host, the address tried) for every mesh connection that failed."""
    return sorted((src, dst, f"{link.target.address}:{link.target.port}")
                  for (src, dst), link in diagnosis.mesh().items() if not link.ok)


def explain(broken: RunOutcome, diagnosis: Diagnosis) -> list[str]:
    """What happened in the broken run, in the order it happened."""
    plan = broken.plan
    advertised = store_connections(broken)
    lines = [f"MASTER_ADDR={plan.master_addr} (rank 0's external address): "
             f"{len(advertised)} of {plan.world_size} ranks connected to the store"]
    for state in broken.ranks:
        mine = advertised.get(state.spec.rank)
        if mine:
            lines.append(f"rank {state.spec.rank} ({state.spec.host}) advertised {mine} to its peers"
                         + (f", then stopped in {state.stopped_at}" if state.stopped_at else ""))
    pairs = unreachable_pairs(diagnosis)
    for src, dst, address in pairs:
        lines.append(f"{src} cannot reach {dst} at {address}")
    if pairs:
        lines.append("each VM knows only its private address, and the other VPC cannot route to it: "
                     "the store connects through the external address, then the mesh hangs. "
                     "Fix: VPC peering, an overlay/VPN between the hosts, or one network")
    return lines


def judge_scenario(broken: RunOutcome, diagnosis: Diagnosis, fixed: list[ExerciseReport]) -> list[Step]:
    """The three things the scenario must show, each passed or not, with what was seen."""
    world = broken.plan.world_size
    advertised = store_connections(broken)
    stuck_in_mesh = [s for s in broken.ranks if s.stopped_at and "process_group" in s.stopped_at]
    hung = Step("without peering: the store connects, then the mesh hangs (the lab stops it)",
                broken.stopped and len(advertised) == world and bool(stuck_in_mesh),
                f"run {broken.status}; {len(advertised)}/{world} ranks through the store; "
                f"{len(stuck_in_mesh)} stopped in init_process_group")
    pairs = unreachable_pairs(diagnosis)
    nat = [f for f in diagnosis.findings if f.check == "nat"]
    crossing = [p for p in pairs if _vpc_of(diagnosis, p[0]) != _vpc_of(diagnosis, p[1])]
    diagnosed = Step("the doctor finds the pairs that cannot reach each other across the VPCs, and the NAT",
                     bool(pairs) and len(crossing) == len(pairs) and bool(nat),
                     f"{len(pairs)} unreachable pairs ({len(crossing)} across VPCs); {len(nat)} NAT findings")
    passed = [r for r in fixed if r.passed]
    fixed_step = Step("with peering: the same job passes", bool(fixed) and len(passed) == len(fixed),
                      "; ".join(f"{r.name}: {r.status}{' ' + r.reason if r.reason else ''}" for r in fixed))
    return [hung, diagnosed, fixed_step]


def _vpc_of(diagnosis: Diagnosis, host: str) -> str:
    """A host's private network, by the first three octets of its advertised address."""
    report = next(r for r in diagnosis.reports if r.name == host)
    address = report.facts.gloo.address if report.facts and report.facts.gloo.address else ""
    return address.rsplit(".", 1)[0]
