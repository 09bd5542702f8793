"""The doctor's verdict for a person: the hosts table, MASTER_ADDR, the mesh, the findings.

What the hosts reported (versions, names, errors) is shown through :func:`_t`: escapes made
visible, and as Text, never as rich markup."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from lab.netcheck.model import SEVERITIES, Diagnosis
from lab.netcheck.rules import SLOW_LOOKUP
from lab.rank.netfacts import (
    Advertised,
    is_loopback,
)
from lab.rank.text import printable

MATRIX_MAX = 12  # hosts up to which the mesh prints as a matrix
SEVERITY_STYLES = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_diagnosis(console: Console, diagnosis: Diagnosis) -> None:
    """The hosts table, MASTER_ADDR, the mesh, then every finding with its cause and fix."""
    console.print(_hosts_table(diagnosis))
    master = diagnosis.master
    tried = [link for r in diagnosis.reports for link in r.links if link.target.kind == "master"]
    reached = sum(link.ok for link in tried)
    line = _t(f"MASTER_ADDR {master.address}:{master.port or '-'} (rank 0 on {master.host}): ")
    line.append(f"reached from {reached}/{len(tried)} hosts",
                style="green" if tried and reached == len(tried) else "red")
    console.print(line, highlight=False)
    _print_mesh(console, diagnosis)
    for f in diagnosis.findings:
        console.print()
        head = Text(f"{f.severity.upper():8}", style=SEVERITY_STYLES[f.severity])
        head.append(printable(f"{f.subject}: {f.message}"))
        console.print(head, highlight=False)
        for label, text in (("cause", f.cause), ("fix", f.fix)):
            if text:
                console.print(_t(f"{'':8}{label}: {text}", "dim" if label == "cause" else ""), highlight=False)
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
    """One row per host; the machine column only for a lab across Docker machines, the NCCL
    column only where some host has a GPU (else NCCL is not used)."""
    gpus = any(r.host.gpus or (r.runtime and r.runtime.cuda_devices) for r in diagnosis.reports)
    machines = any(r.host.machine for r in diagnosis.reports)
    columns = ["host", *(["machine"] if machines else []), "python", "torch", "GPUs", "hostname -> address",
               "gloo advertises", *(["NCCL advertises"] if gpus else []), "lookups"]
    table = Table(*columns, box=box.SIMPLE_HEAD, title="hosts", title_justify="left")
    for r in diagnosis.reports:
        host = [_t(r.name), *([_t(r.host.machine or "")] if machines else [])]
        if r.facts is None:
            why = _t(r.unreachable or r.failure or "no report", "red")
            table.add_row(*host, Text("unreachable" if r.unreachable else "probe failed", style="red"),
                          *([""] * (len(columns) - len(host) - 2)), why)
            continue
        facts, runtime = r.facts, r.runtime
        torch = (_t(runtime.torch) if runtime.torch else Text("missing", style="red")) if runtime else Text("?")
        devices = f"{runtime.cuda_devices}/{r.host.slots}" + (f" nccl {runtime.nccl}" if runtime.nccl else "") \
            if runtime else "?"
        resolved = facts.resolved
        first = resolved.answer[0] if resolved.answer else (resolved.error or "nothing")
        resolves = _t(f"{facts.hostname} -> {first}", "yellow" if is_loopback(first) else "")
        slowest = max((lookup.seconds for lookup in (*facts.reverse, *r.heard)), default=0.0)
        lookups = Text(_ms(resolved.seconds), style="red" if resolved.seconds > SLOW_LOOKUP else "")
        lookups.append(f" / {_ms(slowest)}", style="red" if slowest > SLOW_LOOKUP else "")
        table.add_row(*host, _t(facts.python), torch, _t(devices), resolves, _advertised(facts.gloo),
                      *([_advertised(facts.nccl)] if gpus else []), lookups)
    table.caption = "GPUs: seen by torch / slots; lookups: forward / slowest reverse"
    table.caption_justify = "left"
    return table


def _advertised(advertised: Advertised) -> Text:
    if advertised.error:
        return _t(advertised.error, "red")
    style = "yellow" if advertised.address and is_loopback(advertised.address) else ""
    return _t(f"{advertised.address} {advertised.interface or '?'}", style)


def _t(text: str, style: str = "") -> Text:
    """Text a host reported, shown as it is: escapes visible, no markup."""
    return Text(printable(text), style=style)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _print_mesh(console: Console, diagnosis: Diagnosis) -> None:
    mesh = diagnosis.mesh()
    names = [r.name for r in diagnosis.reports]
    if len(names) <= MATRIX_MAX:
        console.print(Text("mesh: each host to each peer's advertised address"), highlight=False)
        table = Table("from \\ to", *names, box=box.SIMPLE_HEAD)  # (inventory names: no markup in them)
        for source in names:
            cells = []
            for peer in names:
                link = mesh.get((source, peer))
                if link is None:  # itself with one slot: not needed; else not checked (see the findings)
                    cells.append(Text("-" if source == peer else "n/a", style="dim"))
                elif link.ok:
                    cells.append(Text(f"ok {_ms(link.seconds)}", style="green"))
                else:
                    cells.append(_t(link.failure or "failed", "bold red"))
            table.add_row(_t(source), *cells)
        console.print(table)
        return
    failed = [(pair, link) for pair, link in mesh.items() if not link.ok]
    console.print(Text(f"mesh: {len(mesh) - len(failed)}/{len(mesh)} pairs reachable",
                       style="green" if not failed else "red"), highlight=False)
    for (source, peer), link in failed:
        console.print(_t(f"  {source} -> {peer} {link.target.address}:{link.target.port}: {link.error}", "red"),
                      highlight=False)
