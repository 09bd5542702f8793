"""The error strings every multi-node torch user meets, and the cause the doctor would name. Pure.

A failed run's report reads its failed ranks' last lines for them, so a student sees "your
hostname resolves to 127.0.1.1" beside "Connection refused" without running anything else.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from lab.core.judge import ExerciseReport
from lab.core.outcome import RankState, RunOutcome


@dataclass(frozen=True)
class Known:
    kind: str  # the fault it is (lab break KIND), or the class of trouble
    pattern: re.Pattern[str]
    cause: str
    fix: str


# The most telling first: a rank's lines get the first that matches.
KNOWN = (
    Known("loopback-hostname", re.compile(r"127\.0\.1\.1"),
          "a rank advertised 127.0.1.1: its hostname resolves to loopback (Debian's '127.0.1.1 hostname' line)",
          "map the hostname to the host's routable address in /etc/hosts, or set GLOO_SOCKET_IFNAME "
          "(network_interface) to the interface the other hosts reach"),
    Known("wrong-ifname", re.compile(r"Unable to find (?:address|interface) for:? *\S+"),
          "GLOO_SOCKET_IFNAME (or NCCL_SOCKET_IFNAME) names an interface this host lacks",
          "unset it, or name an interface the host has (ip -brief addr)"),
    Known("port-taken", re.compile(r"EADDRINUSE|[Aa]ddress already in use"),
          "MASTER_PORT is already taken on MASTER_ADDR's host (another job, or a rank left from an earlier run)",
          "choose another MASTER_PORT, or stop what holds it (ss -ltnp 'sport = :PORT')"),
    Known("address-family", re.compile(r"Address family not supported"),
          "a rank bound or connected an IPv6 address on a host without IPv6 (or the reverse)",
          "give MASTER_ADDR as an IPv4 address, or enable IPv6 on every host"),
    Known("refused", re.compile(r"Connection refused|ECONNREFUSED"),
          "a peer's address answered but nothing listened on the port: a firewall rejecting it, or an address "
          "that is not that peer's",
          "run `python -m lab doctor --hosts INVENTORY`: it tries every pair and names the one that fails"),
    Known("resolve", re.compile(r"Name or service not known|Temporary failure in name resolution|"
                                r"getaddrinfo failed|nodename nor servname"),
          "a host name did not resolve on that host",
          "give every host's name and address in /etc/hosts on every host, or use addresses"),
)


def printed_causes(states: Iterable[RankState], details: Mapping[int, str] | None = None) -> list[str]:
    """One line per known error these ranks printed (in their last lines, or ``details``: rank ->
    traceback): what it was, its cause, the fix."""
    causes: dict[str, str] = {}
    for state in states:
        text = "\n".join([*state.tail, state.fatal or "", (details or {}).get(state.spec.rank, "")])
        for known in KNOWN:
            found = known.pattern.search(text)
            if found is not None:
                causes.setdefault(known.kind, f"rank {state.spec.rank} ({state.spec.host}) printed {found[0]!r}: "
                                              f"{known.cause}; fix: {known.fix}")
                break
    return list(causes.values())


def run_causes(outcome: RunOutcome, reports: Iterable[ExerciseReport]) -> list[str]:
    """The known errors the ranks of the exercises that did not pass printed."""
    failed = [r for r in reports if not r.passed]
    ranks = sorted({rank for r in failed for rank in (r.ranks or range(len(outcome.ranks)))})
    details = {rank: text for r in failed for rank, text in r.details.items()}
    return printed_causes([outcome.ranks[rank] for rank in ranks], details)
