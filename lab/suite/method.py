"""The method an exercise must use, checked from the calls each rank made.

Where an exercise is about *how* the result is reached (a ring all-reduce built from
point-to-point messages, non-blocking sends), right values are not enough: a ring that just
calls ``dist.all_reduce`` computes the right sums. Each rank's worker records the
torch.distributed calls its exercise made and the bytes it sent to each peer
(``lab.rank.calls``); the registry says, per exercise, what the method allows
(:class:`Method`), and :func:`check_method` holds the calls to it.

A rank's calls summary comes as JSON data, untrusted, as the checkers' results do::

    {"counts": {"isend": 4, "recv": 4}, "sent": {"1": 4096},
     "functions": {"ring_allreduce": {"calls": 48, "tensor_bytes": 1699296,
                                      "counts": {...}, "sent": {"1": 2265728}}}}

and is read once (:func:`read_summaries`, where an exercise is judged) into what the checks take: a
:class:`Recorded` a rank, each field as its checks may use it (a count a positive whole number, a
part that is not what it should be left out, as if not said).

Pure Python, never torch, like the checkers.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lab.suite.check import Carried, Mismatch, Verdict, World, ranks_named

TAMPERED_MAX = 300  # characters kept of what a summary says was done to its recorder


@dataclass(frozen=True)
class Recorded:
    """What a rank's call recorder (``lab.rank.calls``) says of its calls during an exercise, in all or
    inside one of the student's functions, as read (:func:`read_summary`)."""

    counts: dict[str, int] | None = None  # op -> times called (each at least 1); None: not said
    sent: dict[str, int] | None = None  # peer, as said -> bytes sent to it (each at least 1); None: not said
    messages: int = 0  # tensors sent point to point
    groups: int = 0  # process groups the program made
    tampered: str = ""  # what the program did to the recorder, said in one text
    functions: dict[str, Recorded] | None = None  # the student's functions, each its own; None: none said
    calls: int = 0  # a function's: times it was called
    tensor_bytes: int = 0  # a function's: bytes of its first tensor argument, summed over its calls
    reference: bool = False  # a function's: the reference program's own
    missing: bool = False  # a function's: the solution does not define it

    @property
    def bytes_sent(self) -> int | None:
        """The bytes it says were sent, to every peer; None when it does not say."""
        return None if self.sent is None else sum(self.sent.values())


Calls = Mapping[int, Recorded]  # rank -> what its recorder says, read (a rank whose summary was none is absent)
TrafficCheck = Callable[[Calls, World], Verdict]


def read_summaries(raw: Mapping[int, Any]) -> dict[int, Recorded]:
    """Each rank's calls summary as it came (JSON data, untrusted), read; a rank whose summary is no
    object is left out."""
    return {rank: found for rank, summary in raw.items() if (found := read_summary(summary)) is not None}


def read_summary(summary: Any) -> Recorded | None:
    """A calls summary (or a function's part of one) read: None when it is no object."""
    if not isinstance(summary, Mapping):
        return None
    counts, sent, functions, tampered = (summary.get(k) for k in ("counts", "sent", "functions", "tampered"))
    read = {name: found for name, part in functions.items() if (found := read_summary(part)) is not None} \
        if isinstance(functions, Mapping) and functions else None
    return Recorded(
        counts={str(k): v for k, v in counts.items() if _whole(v)} if isinstance(counts, Mapping) else None,
        sent={str(k): v for k, v in sent.items() if _whole(v)} if isinstance(sent, Mapping) else None,
        messages=_whole(summary.get("messages")), groups=_whole(summary.get("groups")),
        tampered="; ".join(str(f) for f in tampered if isinstance(f, str))[:TAMPERED_MAX]
        if isinstance(tampered, list) else "",
        functions={str(k): v for k, v in read.items()} if read is not None else None,
        calls=_whole(summary.get("calls")), tensor_bytes=_whole(summary.get("tensor_bytes")),
        reference=summary.get("reference") is True, missing=summary.get("missing") is True)


@dataclass(frozen=True)
class WireBudget:
    """What a run's connections must carry, over all its ranks, for the exercise's functions to have
    done their work (``least``) and may carry at most (``most``), computed from the exercise's cases
    and the world size alone, never from what a rank says; each with why, as a reason shows it."""

    least: int
    least_why: str
    most: int
    most_why: str


Budget = Callable[[World], WireBudget]

# The point-to-point calls: a message from one rank to one other. The *_object variants are
# point-to-point too (a pickled object in a tensor), and so are a group's own send/recv.
P2P: frozenset[str] = frozenset({
    "send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list",
    "ProcessGroup.send", "ProcessGroup.recv", "ProcessGroup.recv_anysource"})
NONBLOCKING: frozenset[str] = frozenset({"isend", "irecv", "batch_isend_irecv"})
# A barrier carries no data (it cannot compute a sum), so a point-to-point exercise may use one.
SYNC: frozenset[str] = frozenset({"barrier", "monitored_barrier", "ProcessGroup.barrier",
                                  "ProcessGroup.monitored_barrier"})
P2P_NAMES = "send/recv/isend/irecv"


@dataclass(frozen=True)
class Method:
    """What an exercise's ranks may call and must call.

    ``rule`` completes "<exercise> ...", e.g. "must be built from point-to-point calls
    (send/recv/isend/irecv)"; every failure of the method quotes it.
    """

    rule: str
    allowed: frozenset[str] | None = None  # the only calls a rank may make (None: any)
    needs: frozenset[str] = frozenset()  # every rank makes at least one of these
    traffic: TrafficCheck | None = None  # more about the bytes sent (e.g. the ring's bandwidth)
    sends: bool = False  # with more than one rank, every rank sends (in each function it writes)
    budget: Budget | None = None  # what the connections must and may carry, where they are measured


def point_to_point(traffic: TrafficCheck | None = None, budget: Budget | None = None) -> Method:
    """Only point-to-point calls (and barriers, which move no data)."""
    return Method(f"must be built from point-to-point calls ({P2P_NAMES})", P2P | SYNC, traffic=traffic, sends=True,
                  budget=budget)


def nonblocking() -> Method:
    """Point-to-point, and every rank uses the non-blocking calls."""
    return Method("must use the non-blocking point-to-point calls (isend/irecv, or batch_isend_irecv)",
                  P2P | SYNC, NONBLOCKING, sends=True)


def uses(*names: str) -> Method:
    """Every rank calls the collective the exercise practises (anything else too)."""
    return Method(f"practises {' or '.join(n for n in names if '.' not in n)}: every rank calls it",
                  needs=frozenset(names))


def check_method(exercise: str, method: Method | None, calls: Calls, world: World) -> Verdict:
    """Whether every rank's calls keep to ``method``: a failing verdict names the forbidden (or
    missing) calls and the ranks, e.g. "rank 0 called all_reduce: ring-allreduce must be built
    from point-to-point calls (send/recv/isend/irecv)"."""
    if method is None:
        return Verdict(True)
    tampered = {rank: t for rank in range(world.world_size) if (t := calls[rank].tampered if rank in calls else "")}
    if tampered:
        tampering = [f"rank {rank}'s call recorder was tampered with during the exercise ({what}): its records "
                     f"are no evidence of the method" for rank, what in tampered.items()]
        return Verdict(False, "; ".join(tampering), tuple(Mismatch(rank, "the call recorder", "left as the lab set it",
                                                                   what) for rank, what in tampered.items()))
    counts = {rank: c for rank in range(world.world_size) if rank in calls and (c := calls[rank].counts) is not None}
    unrecorded = [r for r in range(world.world_size) if r not in counts]
    notes = ((f"the calls of {ranks_named(unrecorded)} were not recorded: their method is not checked",)
             if unrecorded else ())
    mismatches: list[Mismatch] = []
    forbidden: dict[tuple[str, ...], list[int]] = {}  # the calls -> the ranks that made them
    absent: list[int] = []
    for rank, made in counts.items():
        wrong = tuple(sorted(n for n in made if method.allowed is not None and n not in method.allowed))
        if wrong:
            forbidden.setdefault(wrong, []).append(rank)
            mismatches.append(Mismatch(rank, "calls outside the method", "none", _made(made, wrong)))
        if method.needs and not method.needs & set(made):
            absent.append(rank)
            needed = _names(method.needs)
            mismatches.append(Mismatch(rank, "calls of the method", f"one of {needed}" if "/" in needed else needed,
                                       _made(made, tuple(made)) or "no call at all"))
    reasons = [f"{ranks_named(ranks)} called {', '.join(names)}" for names, ranks in forbidden.items()]
    if absent:
        reasons.append(f"{ranks_named(absent)} made no {_names(method.needs, ' or ')} call")
    said = [f"{'; '.join(reasons)}: {exercise} {method.rule}"] if reasons else []
    if method.sends and world.world_size > 1:
        outside = {rank for ranks in forbidden.values() for rank in ranks}
        for rank, where in _silent(calls, [r for r in counts if r not in outside]):
            said.append(f"rank {rank} sent 0 bytes{where}: it computed the result without communicating")
            mismatches.append(Mismatch(rank, f"bytes sent{where}", "more than 0", "0"))
    verdict = Verdict(not mismatches, "; ".join(said), tuple(mismatches), notes)
    if method.traffic is not None and counts and not forbidden:
        return combine(verdict, method.traffic(calls, world))
    return verdict


# What a run's connections carry beyond the tensors its ranks sent point to point (lab.rank.wire measures it):
# gloo's three headers a message (the sender's two, the receiver's one: 48 bytes each), a barrier's small
# messages, the groups a program makes (their members connect anew), and the lab's own traffic (the
# rendezvous store, the group's connections, its barriers), which grows with the ranks that meet. Measured:
# 144 bytes a message, 2.5 KB a rank for 3 ranks, 3.5 KB a group of 3; allowed with room to spare, and a
# fraction of the bytes besides.
CARRIED_PER_MESSAGE = 160
CARRIED_PER_BARRIER = 1024  # per rank of the run, for each barrier a rank called (its messages go to every rank)
CARRIED_FIXED = 16 * 1024
CARRIED_PER_RANK_PAIR = 512  # for each (rank, peer) pair: the rendezvous's addresses, the connections' greetings
CARRIED_PER_GROUP = 1024  # for each (rank, peer) pair, for each group made (measured: 3.5 KB a group of 3 ranks)
CARRIED_SLACK = 0.01


def lab_overhead(world_size: int, messages: int, groups: int = 0, barriers: int = 0) -> int:
    """What a run's connections may carry beyond its tensors' bytes: gloo's headers of ``messages``
    messages, the lab's own traffic for ``world_size`` ranks, ``groups`` groups made and ``barriers``
    barriers called (over all ranks)."""
    return (CARRIED_FIXED + (CARRIED_PER_RANK_PAIR + CARRIED_PER_GROUP * groups) * world_size ** 2
            + CARRIED_PER_MESSAGE * messages + CARRIED_PER_BARRIER * world_size * barriers)


def check_carried(exercise: str, method: Method | None, calls: Calls, world: World) -> Verdict:
    """Whether what the run's connections carried, as each host's launcher measured them outside the
    ranks (``world.carried``), and what the ranks' records say they sent agree both ways: where more
    went, calls the recorder did not see carried it (switched off however it was, torch's C++ bindings
    called directly, a socket or the store of the program's own); where the records say more, they
    were written to look like the method. And, where the method has a budget, whether the connections
    carried at least what the exercise's functions must move and at most what they may (every byte
    counts, sent inside the functions or not). Only for a method of point-to-point calls, whose every
    byte a rank's record counts."""
    if world.carried is None or method is None or not method.sends or world.world_size < 2:
        return Verdict(True)
    hosts = sorted(set(world.hosts))
    silent = [h for h in hosts if h not in world.carried]
    if silent:
        launchers = "the launcher of {} ended before it said" if len(silent) == 1 else \
            "the launchers of {} ended before they said"
        return Verdict(False, f"{launchers.format(', '.join(silent))} what the connections carried: {exercise}'s "
                              "method is not shown",
                       (Mismatch(None, "bytes the connections carried", "measured on every host", "not said"),))
    failed = [f"{h} ({world.carried[h].failed})" for h in hosts if world.carried[h].failed]
    if failed:  # (it began, so the kernel can: what stopped it happened while the program ran)
        return Verdict(False, f"the measure of the connections failed while the ranks ran on {', '.join(failed)}: "
                              f"{exercise}'s method is not shown",
                       (Mismatch(None, "bytes the connections carried", "measured on every host", "not measured"),))
    unmeasured = [f"{h}: {world.carried[h].error}" for h in hosts if world.carried[h].error]
    if unmeasured:
        return Verdict(True, notes=(f"the connections were not measured ({'; '.join(unmeasured)})",))
    carried = sum(_carried_once(world.carried, hosts).values())
    summaries = [calls[r] for r in range(world.world_size) if r in calls]
    recorded = sum(s.bytes_sent or 0 for s in summaries)
    messages = sum(s.messages for s in summaries)
    groups = max((s.groups for s in summaries), default=0)  # (every rank makes every group)
    barriers = sum(n for s in summaries for name, n in (s.counts or {}).items() if name in SYNC)
    allowed = recorded + lab_overhead(world.world_size, messages, groups, barriers) + int(CARRIED_SLACK * recorded)
    notes = (f"the connections carried {_size(carried)}; the ranks' records account for {_size(recorded)} in "
             f"{messages} message(s)",)
    lost = [h for h in hosts if world.carried[h].lost]
    if lost:  # (an honest run closes a few connections: these closed more than the kernel could report)
        return Verdict(False, f"the launcher of {', '.join(lost)} lost count of the connections the ranks closed "
                              f"(more at once than the kernel could report): {exercise}'s method is not shown",
                       (Mismatch(None, "closed connections counted", "all", "not all"),), notes)
    if recorded > carried * (1 + CARRIED_SLACK):
        return Verdict(False, f"the ranks' records say they sent {_size(recorded)} but their connections carried "
                              f"{_size(carried)}: records that claim more than went over the wire are no evidence "
                              f"of the method (measured outside the ranks, by each host's launcher)",
                       (Mismatch(None, "bytes the records say were sent", f"at most what the connections carried, "
                                 f"{_size(carried)}", _size(recorded)), *_by_host(calls, world, hosts)), notes)
    if carried > allowed:
        unseen = carried - recorded
        return Verdict(False, f"the ranks' connections carried {_size(carried)} but their records account for "
                              f"{_size(recorded)}: {_size(unseen)} went by calls the call recorder did not see "
                              f"(measured outside the ranks, by each host's launcher)",
                       (Mismatch(None, "bytes the connections carried", f"at most {_size(allowed)} (the records' "
                                 f"{_size(recorded)}, headers and the lab's own)", _size(carried)),
                        *_by_host(calls, world, hosts)), notes)
    if method.budget is not None:
        budget = method.budget(world)
        if carried < budget.least:
            return Verdict(False, f"the ranks' connections carried {_size(carried)}, less than {exercise}'s functions "
                                  f"must move to compute their results ({budget.least_why}: {_size(budget.least)}): "
                                  f"the results came some other way than over the wire (measured outside the "
                                  f"ranks, by each host's launcher)",
                           (Mismatch(None, "bytes the connections carried", f"at least {_size(budget.least)}",
                                     _size(carried)),), notes)
        if carried > budget.most:
            return Verdict(False, f"the ranks' connections carried {_size(carried)}, more than {exercise}'s functions "
                                  f"may move ({budget.most_why}: {_size(budget.most)}): what a rank sends outside "
                                  f"them counts too (measured outside the ranks, by each host's launcher)",
                           (Mismatch(None, "bytes the connections carried", f"at most {_size(budget.most)}",
                                     _size(carried)),), notes)
    return Verdict(True, notes=notes)


def _carried_once(measures: Mapping[str, Carried], hosts: list[str]) -> dict[tuple[str, ...], int]:
    """What the hosts' connections carried, each network namespace's once: the hosts whose launchers
    counted every socket of one namespace (a sandbox's ranks share theirs) counted the same bytes, of
    which the launcher that saw the most (it began first) is taken. By the hosts each count covers."""
    spaces: dict[str, list[str]] = {}
    for host in hosts:
        spaces.setdefault(measures[host].space or f"host {host}", []).append(host)
    return {tuple(together): max(measures[h].carried for h in together) for together in spaces.values()}


def _by_host(calls: Calls, world: World, hosts: list[str]) -> tuple[Mismatch, ...]:
    """Where the run had several hosts (or namespaces), what each one's connections carried against its
    ranks' records."""
    assert world.carried is not None
    counts = _carried_once(world.carried, hosts)
    if len(counts) < 2:
        return ()
    rows = []
    for together, carried in counts.items():
        ranks = [r for r in range(world.world_size) if world.hosts[r] in together]
        recorded = sum(calls[r].bytes_sent or 0 for r in ranks if r in calls)
        rows.append(Mismatch(None, f"bytes {', '.join(together)}'s connections carried ({ranks_named(ranks)})",
                             f"its records' {_size(recorded)}, and headers", _size(carried)))
    return tuple(rows)


def _whole(value: Any) -> int:
    """A count as a summary says it: a whole number of at least 1, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _size(count: int) -> str:
    for unit, size in (("MB", 10 ** 6), ("KB", 10 ** 3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def _silent(calls: Calls, ranks: list[int]) -> list[tuple[int, str]]:
    """(rank, `` in NAME()``, or nothing for the whole rank) for each of ``ranks``, or function of the
    student's, whose record says it sent no byte to any peer."""
    found = []
    for rank in ranks:
        summary = calls[rank]
        parts = {f" in {name}()": f for name, f in summary.functions.items()} if summary.functions is not None \
            else {"": summary}
        found += [(rank, where) for where, part in parts.items() if part.bytes_sent == 0]
    return found


def function_summary(summary: Recorded | None, function: str) -> Recorded | None:
    """What a rank's summary says of one of the student's functions, if anything."""
    return None if summary is None or summary.functions is None else summary.functions.get(function)


def scoped_calls(calls: Calls, function: str) -> dict[int, Recorded]:
    """Each rank's calls inside ``function`` alone, as a rank's summary (where they were recorded)."""
    return {rank: Recorded(counts=inside.counts, sent=inside.sent, functions={function: inside})
            for rank, summary in calls.items() if (inside := function_summary(summary, function)) is not None}


def unwritten(calls: Calls, world: World, function: str) -> str | None:
    """Why ``function`` is not the student's work, if a rank's record says so: the solution lacks it,
    or took the reference's (None: it is the student's, as far as the records tell)."""
    said = set()
    for rank in range(world.world_size):
        inside = function_summary(calls.get(rank), function)
        if inside is not None:
            said |= {key for key, true in (("missing", inside.missing), ("reference", inside.reference)) if true}
    if "missing" in said:
        return "not written (the solution does not define it)"
    if "reference" in said:
        return f"not written: it uses the reference's {function}()"
    return None


def combine(values: Verdict, method: Verdict) -> Verdict:
    """One verdict of the values and the method: failed if either did, its reason the values'
    first (then the method's), every mismatch and every note of both."""
    reasons = [v.reason for v in (values, method) if not v.passed and v.reason]
    return Verdict(values.passed and method.passed, "; also ".join(reasons),
                   values.mismatches + method.mismatches,
                   values.notes + tuple(n for n in method.notes if n not in values.notes))


def _names(names: frozenset[str], sep: str = "/") -> str:
    """The names as a person reads them: a group's own methods only when nothing else is named."""
    plain = sorted(n for n in names if "." not in n)
    return sep.join(plain or sorted(names))


def _made(made: Mapping[str, int], names: tuple[str, ...]) -> str:
    return ", ".join(f"{name} x{made[name]}" for name in sorted(names))
