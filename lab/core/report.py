"""Report: what a run says, as data: its one-line summary, JSON, JUnit XML (a person's view of it
is the CLI's: lab.cli.views.run).

Whatever a rank printed or raised is untrusted: the JUnit XML shows it through
:func:`lab.rank.text.printable` (escapes made visible); JSON escapes control characters itself."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

from lab.core.judge import ExerciseReport
from lab.core.outcome import RunOutcome, ended
from lab.core.stacks import users_lines
from lab.rank.text import printable

TAIL_SHOWN = 12


def dropped_output(outcome: RunOutcome) -> list[str]:
    """One line for each rank that printed more than the lab shows (lab.core.outcome: bounded output)."""
    return [f"rank {s.spec.rank} ({s.spec.host}) printed {s.output.lines} lines ({_size(s.output.size)}): the "
            f"first {s.output.shown} were shown, the other {s.output.dropped} counted and dropped"
            for s in outcome.ranks if s.output.dropped]


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    return f"{count / 1024:.1f} KiB" if count < 1 << 20 else f"{count / (1 << 20):.1f} MiB"


def summary(outcome: RunOutcome, reports: list[ExerciseReport]) -> str:
    counts = {s: sum(r.status == s for r in reports) for s in ("pass", "fail", "timeout", "not run")}
    parts = [f"{counts['pass']} passed", f"{counts['fail']} failed"]
    parts += [f"{counts[s]} {s}" for s in ("timeout", "not run") if counts[s]]
    plan = outcome.plan
    extra = "" if outcome.status in ("completed", "timeout") else f", {status(outcome)}"
    return (f"{', '.join(parts)} in {outcome.seconds:.1f}s (world size {plan.world_size}, "
            f"{plan.backend}, init {plan.init}{extra})")


def status(outcome: RunOutcome) -> str:
    """How the run ended: ``completed``, ``crashed``, ``timeout``, ``hung: nothing moved on any rank's
    connections for 10s``..."""
    if outcome.status == "hung":
        return f"hung: nothing moved on any rank's connections for {outcome.plan.options.hang_after:g}s"
    if outcome.status == "preflight":
        return "stopped by the preflight: no rank started"
    return outcome.status


def to_json(outcome: RunOutcome, reports: list[ExerciseReport], exit_code: int) -> dict[str, Any]:
    return {
        "passed": all(r.passed for r in reports),
        "exit_code": exit_code,
        "status": outcome.status,
        "seconds": round(outcome.seconds, 3),
        "cause": outcome.cause.to_json() if outcome.cause else None,
        "ports": list(outcome.ports),  # held on rank 0's host for the run: ${port0}, ${port1}...
        "plan": {k: v for k, v in outcome.plan.to_dict().items() if k not in ("ranks", "launches", "run_dir")},
        "exercises": [{
            "name": r.name, "status": r.status, "seconds": r.seconds, "reason": r.reason, "score": r.score,
            "parts": [{"name": p.name, "passed": p.passed, "reason": p.reason} for p in r.parts],
            "ranks": list(r.ranks), "notes": list(r.notes),
            "mismatches": [{"rank": m.rank, "what": m.what, "expected": m.expected, "got": m.got}
                           for m in r.mismatches],
        } for r in reports],
        "ranks": _ranks(outcome),
    }


def launch_json(outcome: RunOutcome, script: str, exit_code: int) -> dict[str, Any]:
    """``lab launch --json``: how the job ended, why (its cause across ranks), and each rank."""
    return {"script": script, "exit_code": exit_code, "status": outcome.status, "seconds": round(outcome.seconds, 3),
            "succeeded": sum(s.done for s in outcome.ranks) - len(early := outcome.ended_early()),
            "ended_early": [s.spec.rank for s in early], "world_size": outcome.plan.world_size,
            "cause": outcome.cause.to_json() if outcome.cause else None, "ranks": _ranks(outcome),
            "attempts": len(outcome.restarts) + 1, "brought_back": list(outcome.brought_back),
            "restarts": [{"restart": r.count, "attempt_seconds": round(r.seconds, 3), "ended": list(r.ended)}
                         for r in outcome.restarts]}


def _ranks(outcome: RunOutcome) -> list[dict[str, Any]]:
    return [{"rank": s.spec.rank, "host": s.spec.host, "hostname": s.info.hostname if s.info else None,
             "pid": s.info.pid if s.info else None, "exit_code": s.exit_code, "done": s.done,
             "ended": ended(s.exit_code) if s.exit_code is not None else None,
             "output": {"lines": s.output.lines, "bytes": s.output.size, "shown": s.output.shown,
                        "dropped": s.output.dropped},
             "step": s.step.wire(), "stopped_at": s.stopped_at, "fatal": s.fatal,
             "torch": s.info.torch or None if s.info else None} for s in outcome.ranks]


def to_junit(outcome: RunOutcome, reports: list[ExerciseReport], suite_name: str = "lab") -> bytes:
    """JUnit XML: one test case per exercise, so any CI can show a class's submissions.

    A failed check is a <failure> (the reason, then the mismatches); a hang is an <error>;
    an exercise that never ran is <skipped>. The failing ranks' last lines go to system-out.
    """
    plan = outcome.plan
    counts = {"failures": sum(r.status == "fail" for r in reports),
              "errors": sum(r.status == "timeout" for r in reports),
              "skipped": sum(r.status == "not run" for r in reports)}
    suite_name = printable(suite_name)  # (lab grade's: the student's file name)
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name=suite_name, tests=str(len(reports)),
                          attrib={"time": f"{outcome.seconds:.3f}", **{k: str(v) for k, v in counts.items()}})
    properties = ET.SubElement(suite, "properties")
    for key in ("world_size", "backend", "init"):
        ET.SubElement(properties, "property", name=key, value=str(getattr(plan, key)))
    cause = outcome.cause
    if cause is not None:  # why the run hung or failed: every case that did not pass says it too
        ET.SubElement(properties, "property", name="cause", value=cause.kind)
        ET.SubElement(properties, "property", name="cause_headline", value=printable(cause.headline))
    why = [] if cause is None else [cause.headline, *(e.line() for e in cause.evidence)]
    for r in reports:
        case = ET.SubElement(suite, "testcase", classname=f"{suite_name}.{plan.backend}", name=r.name,
                             time=f"{r.seconds or 0.0:.3f}")
        if r.parts:  # partial credit: each function the student writes, and the score they make
            scored = ET.SubElement(case, "properties")
            ET.SubElement(scored, "property", name="score", value=f"{r.score:g}")
            for part in r.parts:
                ET.SubElement(scored, "property", name=f"part {part.name}",
                              value="pass" if part.passed else printable(f"fail: {part.reason}"))
        reason = printable(r.reason)
        if r.status == "fail":
            ET.SubElement(case, "failure", message=reason, type="CheckFailed").text = \
                "\n".join(printable(line) for line in [r.reason, *map(str, r.mismatches),
                                                          *(f"note: {n}" for n in r.notes), *why])
        elif r.status == "timeout":
            ET.SubElement(case, "error", message=reason, type="Hang" if outcome.status == "hung" else "Timeout"
                          ).text = "\n".join(printable(line) for line in [r.reason, *why])
        elif r.status == "not run":
            ET.SubElement(case, "skipped", message=reason)
        if not r.passed:
            tails = [f"--- rank {rank} ({outcome.ranks[rank].spec.host})\n"
                     + "\n".join(printable(line) for line in tail[-TAIL_SHOWN:]) for rank in r.ranks
                     if rank < len(outcome.ranks) and (tail := users_lines(outcome.ranks[rank].tail))]
            if tails:
                ET.SubElement(case, "system-out").text = "\n".join(tails)
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data
