"""Each rank as the analysis of lab.core.why sees it, and the words it says ranks and calls in.

:class:`RankFacts` is what the controller knows of one rank (the runner builds it); :func:`build`
turns it into a :class:`Rank`: its records checked (lab.rank.flightrecords), the call it is blocked
in now, the call its failure came from, and whether that failure was its own or a consequence of
another rank's (a lost connection, a timeout: what every peer of a rank that died says).
Pure: no I/O.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath
from typing import Literal

from lab.core.outcome import CauseKind, ended
from lab.rank.flightrecords import (
    TEXT_MAX,
    Calls,
    Counts,
    FilesSeen,
    GroupMade,
    GroupsMade,
    GroupTimeouts,
    StepMark,
    Steps,
    merged,
    text,
)
from lab.rank.ops import FROM_ROOT, PER_PEER, SPLIT_SIZES, canonical
from lab.rank.record import Record

Ended = Literal["running", "exited", "raised"]
Stage = Literal["starting", "rendezvous", "joined"]
Failure = Literal["own", "lost", "backend"]

# What a rank says when a peer went away or went silent: the consequence of another rank's failure.
LOST = re.compile(r"connection (?:closed|reset|refused)|closed by peer|broken pipe|read error|socket closed|"
                  r"enforce fail[^\n]*\bread\b|timed out|timeout|got 0 bytes|communicator was aborted", re.I)
# A peer that went silent past the process group's timeout (gloo: "Timed out waiting 4000ms for recv
# operation to complete"): the timeout, in milliseconds, where the error says it
TIMED_OUT = re.compile(r"Timed out waiting (\d{1,12})ms|timed out|timeout", re.I)
# What the backend itself raises inside a call (gloo's size checks, NCCL's errors): a symptom of a
# mismatch between ranks that the records show better, not a reason of the rank's own.
BACKEND = re.compile(r"gloo|enforce fail|pair\.cc|DistBackendError|NCCL|c10d", re.I)
_FRAME = re.compile(r'File "([^"\n]+)", line (\d+)')
# Not the user's: Python's own and site-packages, torch, the lab's rank side, <frozen ...>
_NOT_USERS = re.compile(r"/lib/python3[^/]*/|/torch/|/lab/rank/|^<")
_GROUP = re.compile(r"g(\d{1,9}(?:,\d{1,9})*)#\d{1,9}")
JOIN = "init_process_group"  # how the recorder names the rendezvous (lab.rank.flight)
TRACEBACK_MAX = 65536  # characters of a traceback searched for the user's frame (its end)
GROUP_SHOWN = 60  # characters of a group's name shown in a call


@dataclass(frozen=True)
class RankFacts:
    """What the controller knows of one rank. ``records``, ``inflight``, ``counts`` and ``steps`` are its
    last flight dump's, as read (untrusted: lab.rank.flightrecords; where only a progress event came,
    ``inflight`` may be its one call); the rest is the runner's. ``ended`` and ``exit_code`` say how it
    ended by itself: a rank the lab stopped (a hang, the timeout) is running."""

    rank: int
    host: str
    records: Calls | None = None  # None: no flight dump came (the rank is unseen, not guessed)
    inflight: Calls | None = None
    counts: Counts | None = None  # its completed calls per group and op
    ended: Ended = "running"  # raised: its program raised (error, traceback); exited: ended otherwise
    exit_code: int | None = None  # as Popen gives it: negative, killed by that signal; 128+N, by signal N
    error: str | None = None  # "ExceptionType: message"
    traceback: str | None = None
    stopped_at: str | None = None  # where its stack dump shows it ("file.py:LINE in f: ...")
    stage: Stage = "joined"  # starting: not started yet; rendezvous: in init_process_group
    failed_at: float | None = None  # time.time() its failure was seen at, for a failure no record dates
    arrival: int | None = None  # the order in which the controller learnt of its failure (0 first)
    exit_call: str | None = None  # where its program called sys.exit or os._exit ("file.py:LINE"), if it did
    world_asked: int | None = None  # the world_size its program passed to init_process_group, if it passed one
    aborted_in: str | None = None  # the torch.distributed function its stacks showed it in as it was aborted
    died_in: Record | None = None  # the call it was in as it died by a signal (its relay's word)
    oom: str | None = None  # the kernel's line that it killed the rank for memory (its relay's word)
    steps: Steps | None = None  # its last dump's training steps (a DDP program's forwards and backward passes)
    made: GroupsMade | None = None  # its last dump's groups made (new_group), in order
    destroyed: str | None = None  # where its program destroyed the world ("file.py:LINE"), as its last dump says
    timeouts: GroupTimeouts | None = None  # the timeouts its program gave its groups, as its last dump says
    files: FilesSeen | None = None  # the files its program saved and looked for in vain, as its last dump says
    cell_ended: str | None = None  # a notebook's rank: the cell it ended and waits for the next one after ("cell [7]")
    cell_error: str = ""  # the exception that cell raised on it, if it raised one


@dataclass(frozen=True)
class Rank:
    """One rank, its records checked."""

    facts: RankFacts
    calls: tuple[Record, ...]  # one per group and sequence number, oldest first
    counts: dict[str, Counter[str]] | None
    position: Record | None  # the call it is blocked in now (a running rank)
    failed_in: Record | None  # the call its failure came from (a rank that ended)
    failure: Failure | None
    died_in: Record | None = None  # the call it was in as it died by a signal (its relay's word)
    steps: tuple[StepMark, ...] | None = None  # a DDP program's forwards and backward passes, oldest first
    made: tuple[GroupMade, ...] | None = None  # the groups it made (new_group), in order

    @property
    def rank(self) -> int:
        return self.facts.rank

    @property
    def host(self) -> str:
        return self.facts.host

    @property
    def running(self) -> bool:
        return self.facts.ended == "running"

    @property
    def seen(self) -> bool:
        return self.facts.records is not None or self.facts.inflight is not None

    @property
    def absent(self) -> bool:
        """Running, with no call seen, and not started or still in the rendezvous."""
        return self.running and not self.calls and self.facts.stage != "joined"

    @property
    def outside(self) -> bool:
        """Running, seen, and in no torch.distributed call: it computes, and may still call (a notebook's
        rank that ended its cell and waits for the next will not)."""
        return self.running and self.seen and self.position is None and not self.absent and \
            self.facts.cell_ended is None

    @property
    def stuck(self) -> Record | None:
        """Where it waits, or where its wait ended in the backend's error (gloo turns many hangs into
        crashes); not a call its own failure came from."""
        if self.running:
            return self.position
        return self.failed_in if self.failure in ("lost", "backend") else None

    def pending(self) -> list[Record]:
        return [c for c in self.calls if c.pending]

    def count(self, group: str, op: str) -> int | None:
        """Its completed calls of ``op`` on ``group``, where its counts say."""
        return None if self.counts is None or group not in self.counts else self.counts[group][canonical(op)]


@dataclass(frozen=True)
class Finding:
    """What one rule of lab.core.why found: the cause, without the evidence (a line per rank) it adds."""

    kind: CauseKind
    headline: str
    fix: str | None = None
    shown: dict[int, Record] = field(default_factory=dict)  # rank -> the call its evidence shows (else where it is)


def build(facts: RankFacts, notes: list[str]) -> Rank:
    """A rank's facts, its records checked (what is skipped goes to ``notes``)."""
    who = f"rank {facts.rank}"
    calls = merged({name: given for name, given in (("records", facts.records), ("inflight", facts.inflight))
                    if given is not None}, who, notes)
    if facts.counts is not None and facts.counts.malformed:
        notes.append(f"{who}: malformed or too many call counts skipped")
    if facts.steps is not None and facts.steps.malformed:
        notes.append(f"{who}: {facts.steps.malformed} malformed steps skipped")
    if facts.made is not None and facts.made.malformed:
        notes.append(f"{who}: {facts.made.malformed} malformed groups made skipped")
    if facts.timeouts is not None and facts.timeouts.malformed:
        notes.append(f"{who}: {facts.timeouts.malformed} malformed group timeouts skipped")
    if facts.files is not None and facts.files.malformed:
        notes.append(f"{who}: {facts.files.malformed} malformed files skipped")
    # init_process_group says where a rank is in the rendezvous, and is no call that ranks meet in
    joining = next((c for c in calls if c.op == JOIN and c.blocking), None) if facts.ended == "running" else None
    calls = [c for c in calls if c.op != JOIN]
    if joining is not None:
        facts = replace(facts, stage="rendezvous", stopped_at=facts.stopped_at or joining.where,
                        world_asked=joining.world_size)
    blocking = [c for c in calls if c.blocking]
    position = max(blocking, key=lambda c: c.t0) if blocking and facts.ended == "running" else None
    raised = [c for c in calls if c.state == "raised"]
    failed_in = None
    if facts.ended != "running" and raised and not any(c.state == "done" and c.t0 > raised[-1].t0 for c in calls):
        failed_in = raised[-1]  # its last call raised: its failure came from there
    return Rank(facts, tuple(calls), facts.counts.by_group if facts.counts is not None else None, position, failed_in,
                _failure(facts, failed_in), facts.died_in, facts.steps.marks if facts.steps is not None else None,
                facts.made.groups if facts.made is not None else None)


def _failure(facts: RankFacts, failed_in: Record | None) -> Failure | None:
    """Whether the rank failed, and for whose reason: an exit with status 0 is no failure; a lost
    connection or a timeout is a consequence; the backend's own error inside a call is a symptom."""
    if facts.ended == "running" or (facts.ended == "exited" and facts.exit_code == 0):
        return None
    said = facts.error or (failed_in.error if failed_in else None) or ""
    if LOST.search(said[:TEXT_MAX * 8]):
        return "lost"
    if failed_in is not None and BACKEND.search(said[:TEXT_MAX * 8]):
        return "backend"
    return "own"


def failure_time(rank: Rank) -> tuple[float, float, int]:
    """When it failed, to order failures: the time its failing call ended (its host's clock), else
    when the controller saw the failure, then the controller's order of arrival, then the rank."""
    call = rank.failed_in
    when = (call.t1 if call.t1 is not None else call.t0) if call is not None else rank.facts.failed_at
    when = when if when is not None and math.isfinite(when) else math.inf
    arrival = rank.facts.arrival
    return when, math.inf if arrival is None else arrival, rank.rank


def members(group: str, ranks: Iterable[Rank]) -> set[int]:
    """The ranks of a group: every rank for "world", those its id names ("g0,2#0"), else those seen
    calling on it."""
    ranks = list(ranks)
    if group == "world":
        return {r.rank for r in ranks}
    if match := _GROUP.fullmatch(group):
        return {int(n) for n in match.group(1).split(",")}
    return {r.rank for r in ranks if any(c.group == group for c in r.calls) or group in (r.counts or {})}


def user_frame(traceback: str | None) -> str | None:
    """The innermost frame of a traceback in the user's code (not Python's, torch's or the lab's),
    as ``file.py:LINE``."""
    frames = [(path, line) for path, line in _FRAME.findall((traceback or "")[-TRACEBACK_MAX:])
              if not _NOT_USERS.search(path)]
    return text(f"{PurePosixPath(frames[-1][0]).name}:{frames[-1][1]}") if frames else None


# Words


def ranks_named(ranks: Iterable[int]) -> str:
    """``rank 3``, ``ranks 0, 2, 3``, ``ranks 0-2`` (three or more in a row), ``ranks 0-2, 5``."""
    ordered = sorted(set(ranks))
    return f"rank {ordered[0]}" if len(ordered) == 1 else f"ranks {rank_list(ordered)}"


def rank_list(ranks: Iterable[int]) -> str:
    """``0, 2, 3``, ``0-2, 5``: ranks, three or more in a row as a range."""
    runs: list[list[int]] = []
    for n in sorted(set(ranks)):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) >= 3 else ", ".join(map(str, run)) for run in runs)


def verb(ranks: Iterable[object], one: str, many: str) -> str:
    return one if len(list(ranks)) == 1 else many


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def on_group(group: str) -> str:
    """How a call names its group: nothing for the world, else `` on group [1, 2]`` (``[0-63]``)."""
    if group == "world":
        return ""
    match = _GROUP.fullmatch(group)
    said = f"[{rank_list(int(n) for n in match.group(1).split(','))}]" if match else group
    return f" on group {text(said, GROUP_SHOWN)}"


def size(call: Record) -> str | None:
    """``4 floats``, ``4 float64 values``: a call's (first) tensor."""
    if call.numel is None:
        return None
    if call.dtype == "float32":
        return f"{call.numel} float{'' if call.numel == 1 else 's'}"
    return f"{call.numel} {call.dtype + ' ' if call.dtype else ''}value{'' if call.numel == 1 else 's'}"


def named(call: Record, numbered: bool = True) -> str:
    """Which call it is: ``recv from 0``, ``all_reduce #5``, ``broadcast #2 on group [0, 1] from 0``
    (``all_reduce`` unnumbered: a rank's relay counts only the collectives the program called itself)."""
    direction = call.direction
    if direction == "send":
        return f"{call.op} to {call.peer}"
    if direction == "recv":
        return f"{call.op} from {'any rank' if call.peer is None else call.peer}"
    if direction == "batch":
        return call.op
    head = f"{call.by + ' ' if call.by else ''}{call.op}{f' #{call.seq}' if numbered else ''}{on_group(call.group)}"
    if call.root is not None:
        head += f" {'from' if canonical(call.op) in FROM_ROOT else 'to'} {call.root}"
    return head


def describe(call: Record, numbered: bool = True) -> str:
    """A call as a person reads it: ``recv from 0, tag 0, 4 floats``, ``all_reduce #5, SUM, 1024 floats``,
    ``all_to_all_single #2, 512 floats, input_split_sizes [9, 7, 8, 8], output_split_sizes [8, 8, 8, 8]``,
    ``all_gather #3, 30 floats, tensor_list sizes [30, 31, 30, 31]``."""
    direction = call.direction
    parts = [named(call, numbered), *([call.reduce_op] if call.reduce_op and direction == "collective" else [])]
    if direction in ("send", "recv") and call.tag is not None:
        parts.append(f"tag {call.tag}")
    parts += [s for s in (size(call),) if s]
    names = PER_PEER.get(canonical(call.op), ("", ""))  # (the arguments that gave them: counts, or a list's sizes)
    parts += [f"{name}{'' if canonical(call.op) in SPLIT_SIZES else ' sizes'} [{_counts(found)}]"
              for name, found in zip(names, (call.in_splits, call.out_splits), strict=True) if name and found]
    if call.state == "waiting" and not call.by:
        parts.append("in wait()")
    return ", ".join(parts)


def _counts(values: tuple[int, ...], shown: int = 8) -> str:
    """``9, 7, 8, 8``; past ``shown`` of them, ``... (64 in all)``."""
    more = f", ... ({len(values)} in all)" if len(values) > shown else ""
    return ", ".join(str(n) for n in values[:shown]) + more


def error_of(rank: Rank) -> str:
    """The error a rank failed with, as shown: its first line, without the C++ source places gloo
    prefixes it with, and what matters of the rest (:func:`gist`)."""
    said = rank.facts.error or (rank.failed_in.error if rank.failed_in else None)
    return gist(_SOURCE_PLACE.sub("", said)) if said else "an exception"


# An exception raised in another process and raised again here with its traceback in the message (a
# DataLoader worker's: "Caught ValueError in DataLoader worker process 0.")
_ORIGINAL = "Original Traceback (most recent call last):"
# What a long message of torch's names past its first line's cut: the parameter DDP saw twice, those
# that got no gradient (their names, with TORCH_DISTRIBUTED_DEBUG=INFO or DETAIL, else their indices)
_NAMING = re.compile(r"Parameter at index \d{1,9}(?: with name [^\s]{1,200})? has been marked as ready twice"
                     r"|Parameters which did not receive grad for rank \d{1,9}: [^\n]{1,300}?(?=\s*Parameter indices|$)"
                     r"|Parameter indices which did not receive grad for rank \d{1,9}:(?: \d{1,9}){1,40}", re.M)


def gist(said: str) -> str:
    """An error as shown: its first line (cut), then, in brackets, the exception another process
    raised that it carries (its last line, where in the user's code) and the names a long message of
    torch's gives past the cut."""
    head = text(said)
    also = []
    if _ORIGINAL in said:
        original = said.split(_ORIGINAL, 1)[1]
        lines = [line for line in original.splitlines() if line.strip()]
        if lines:
            also.append(f"from there: {text(lines[-1])}{at(user_frame(original))}")
    also += [text(named, TEXT_MAX * 2) for m in _NAMING.finditer(said[:TRACEBACK_MAX])
             if (named := m.group(0).strip().rstrip(".")) not in head]
    return f"{head} ({'; '.join(also)})" if also else head


# "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] ", "[enforce fail at .../pair.cc:456] "
_SOURCE_PLACE = re.compile(r"\[(?:enforce fail at )?[^\]\s]{0,300}\.(?:cc|cpp|h|hpp):\d{1,9}\] ?")


def where_of(rank: Rank) -> str | None:
    """Where the rank is or failed: its call's line, its traceback's, its stack dump's, the line of the
    call it died in; none for a notebook's rank that waits for its next cell (in the lab's loop)."""
    if rank.facts.cell_ended is not None and rank.position is None:
        return None
    for call in (rank.position, rank.failed_in):
        if call is not None and call.where:
            return call.where
    found = (user_frame(rank.facts.traceback.split(_ORIGINAL, 1)[0] if rank.facts.traceback else None)
             if rank.facts.ended == "raised" else rank.facts.exit_call)  # (its own frames: not another process's)
    found = found or rank.facts.stopped_at or (rank.died_in.where if rank.died_in else None)
    return text(found) if found else None


def place(call: Record) -> str | None:
    """Where a call was made: ``_common.py:35 (called at train.py:21)`` for one torch issued inside a
    function of the program's that another file of it called."""
    return f"{call.where} (called at {call.caller})" if call.where and call.caller else call.where


def at(where: str | None) -> str:
    return f" at {where}" if where else ""


def doing(rank: Rank, many: bool = False, where: bool = True) -> str:
    """What a rank does, after its name ("rank 1 is in recv from 0, tag 0 at ring.py:12"), or after
    several ranks' names (``many``: "ranks 0, 2 are in ...")."""
    be, have, its = ("are", "have", "their") if many else ("is", "has", "its")
    said = at(where_of(rank)) if where else ""
    if rank.position is not None:
        return f"{be} in {describe(rank.position)}{said}"
    if not rank.running:
        if rank.failure == "lost":
            return f"{'timed out' if TIMED_OUT.search(error_of(rank)) else f'lost {its} connection'}: " \
                   f"{error_of(rank)}{said}"
        if rank.facts.ended == "raised" or rank.failure == "backend":
            return f"raised {error_of(rank)}{said}"
        how = ended(rank.facts.exit_code)
        return (how.replace("was ", "were ", 1) if many else how) + said
    if rank.facts.cell_ended is not None:
        how = f"raising {rank.facts.cell_error}" if rank.facts.cell_error else "without it"
        return f"{have} ended {rank.facts.cell_ended} {how} and {'wait' if many else 'waits'} for the next cell"
    if rank.absent:
        return f"{have} not started" if rank.facts.stage == "starting" else f"{be} still in init_process_group{said}"
    if not rank.seen:
        return f"{have} sent no flight records{said}"
    return f"{be} not in a torch.distributed call{said}"


def state(rank: Rank) -> str:
    """What a rank does, as its line of evidence says it: ``recv from 0, tag 0, 4 floats``, ``exited
    with status 0``, ``not in a torch.distributed call`` (its file:line apart)."""
    if rank.position is not None:
        return describe(rank.position)
    said = doing(rank, where=False)
    if rank.failed_in is not None:
        return f"{describe(rank.failed_in)}: {said}"
    if rank.died_in is not None:  # (its relay's word: the call it died in, by a signal)
        return f"{describe(rank.died_in, numbered=False)}: {said.removeprefix('was ')}"
    return next((said.removeprefix(word) for word in ("is ", "has ", "was ") if said.startswith(word)), said)
