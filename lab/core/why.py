"""Why a run hangs or crashes, named across ranks from what each rank's flight recorder saw.

:func:`explain` takes what the controller knows of each rank (:class:`RankFacts`: its flight records,
untrusted, and how it ended) and returns one :class:`Cause`: a kind, a headline (the report's first
line), evidence per rank, what usually fixes it. The first rule that holds names it, in this order:

0. groups the ranks made differently (new_group: not made by some, made in another order, or
   others), then a collective mismatch that began before any rank failed for a reason of its own
   (its failure follows from it: a wrong sum its own check caught);
1. crash: the first rank to fail for a reason of its own (not a lost connection, not a timeout):
   what the others did after it follows from it, never the reverse; then ranks that timed out
   waiting in a collective for ranks of its group that were not in it (outside any call, where
   their stacks say, or come too late);
2. rendezvous: ranks with no call, not started or still in init_process_group: every other rank
   waits on them;
3. collective mismatch: one group's call #seq in different ops, sizes, dtypes, reduce ops or roots;
4. a send and its receive that differ in tag or size, a point-to-point cycle, a wait on a peer that
   sends to or receives from a third rank: these say why a rank is missing from a collective, so
   before
5. a rank missing from a collective (elsewhere; exited early; ended after fewer calls: uneven
   counts);
6. a send or receive whose peer ended;
7. a straggler (a wait, not a hang), nothing wrong, or unknown: what is known, never a guess; a
   rank with no records is unseen.

Records meet by (group, seq), as lab.rank.flight numbers them.
"""
from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from lab.core import waitfor
from lab.core.outcome import (
    SYS_EXIT,
    Cause,
    CauseKind,
    Evidence,
    ExerciseRun,
    RankState,
    RunOutcome,
    between_cells,
    ended,
)
from lab.core.rankview import (
    TIMED_OUT,
    Ended,
    Finding,
    Rank,
    RankFacts,
    Stage,
    at,
    build,
    describe,
    doing,
    error_of,
    failure_time,
    members,
    named,
    on_group,
    ordinal,
    place,
    rank_list,
    ranks_named,
    size,
    state,
    verb,
    where_of,
)
from lab.core.stacks import called_in, is_stack_line, program_files, where_stopped
from lab.rank.events import Error
from lab.rank.flightrecords import Calls, GroupMade, StepMark, text
from lab.rank.ops import FROM_ROOT, PER_PEER, REDUCING, ROOTED, SIZES_DIFFER, SPLIT_SIZES, canonical
from lab.rank.record import Record

__all__ = ["Cause", "CauseKind", "Evidence", "RankFacts", "explain"]

HEADLINE_RANKS = 3  # ranks named one by one in a headline; the evidence names them all


def explain(facts: Sequence[RankFacts]) -> Cause:
    """The cause across ranks, from every rank's facts (one per rank; a repeated or negative rank is
    skipped, and said in ``notes``). Never raises on what the ranks sent."""
    notes: list[str] = []
    ranks: dict[int, Rank] = {}
    for fact in facts:
        if fact.rank < 0 or fact.rank in ranks:
            notes.append(f"rank {fact.rank}: {'a negative rank' if fact.rank < 0 else 'given twice'}: skipped")
            continue
        ranks[fact.rank] = build(fact, notes)
    # In the module's order. A send and a receive that differ only in tag wait for each other too:
    # the tag is their cause, so it is asked before the cycle.
    rules: tuple[Callable[[dict[int, Rank]], Finding | None], ...] = (
        _groups_differ, _mismatch_first, _crash, _timed_out, _rendezvous, _mismatch, waitfor.unmatched, waitfor.cycle,
        waitfor.crossed, _missing, waitfor.peer_gone,
        _straggler, _nothing)
    found = next((f for f in (rule(ranks) for rule in rules) if f is not None), None) or _unknown(ranks)
    evidence = tuple(_evidence(r, found.shown.get(k)) for k, r in sorted(ranks.items()))
    return Cause(found.kind, _sentence(found.headline), evidence, found.fix, tuple(notes))


def _sentence(headline: str) -> str:
    return headline[:1].upper() + headline[1:] + ("" if headline.endswith(".") else ".")


def _evidence(rank: Rank, call: Record | None) -> Evidence:
    """A rank's line: the call the cause is about, else what it does. An async call it waits on is
    where it was posted; the wait is where the rank's stack shows it (its line, when it has one)."""
    if call is None:
        return Evidence(rank.rank, text(rank.host), state(rank), where_of(rank))
    waited = rank.facts.stopped_at.split(" ", 1)[0] if rank.facts.stopped_at and call.state == "waiting" else None
    if waited and call.where and waited != call.where:
        return Evidence(rank.rank, text(rank.host), f"{describe(call)} (posted at {call.where})", text(waited))
    return Evidence(rank.rank, text(rank.host), describe(call, numbered=call is not rank.died_in), place(call))


def _some(ranks: list[Rank], say: Callable[[Rank], str]) -> str:
    """``rank 1, which is in ...`` for each of the first HEADLINE_RANKS ranks, and how many more."""
    parts = [f"rank {r.rank}, which {say(r)}" for r in ranks[:HEADLINE_RANKS]]
    if len(ranks) > HEADLINE_RANKS:
        parts.append(f"{len(ranks) - HEADLINE_RANKS} more (below)")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]


# 0. Groups made differently

_GROUPS_FIX = ("Every rank must call new_group for every group, members or not, in the same order (torch names a "
               "group by how many the rank made before it): make the groups outside any branch on the rank, and use "
               "each only on its members; a group that only its members make needs use_local_synchronization=True.")
_ORDER_FIX = ("Every rank must make the groups in the same order (torch names a group by how many the rank made "
              "before it): build the list of groups the same way on every rank, not starting from the rank's own, and "
              "pick the rank's own from it after.")


def _groups_differ(ranks: dict[int, Rank]) -> Finding | None:
    """The first of the groups the ranks made (new_group, in order) that they made differently: some
    have not made a group the others made before the one they made in its place (not members of it, in
    a branch on the rank; said so, as they may still make it later), made the same ones in another
    order, or made others. Every failure after it may follow from it (torch pairs the n-th
    group of every rank: from there on the ranks' groups are crossed), so it is asked first."""
    made = {k: r.made for k, r in ranks.items() if r.made}
    for n in range(max((len(m) for m in made.values()), default=0)):
        sides: dict[tuple[int, ...], list[int]] = {}
        for k, m in sorted(made.items()):
            if n < len(m):
                sides.setdefault(m[n].members, []).append(k)
        if len(sides) < 2:
            continue
        ordered = sorted(sides.values(), key=lambda ks: (-len(ks), ks[0]))
        if len(ordered) == 2:
            for making, other in (ordered, ordered[::-1]):
                theirs, ours = made[making[0]], made[other[0]]
                meets = next((j for j in range(n + 1, len(theirs)) if theirs[j].members == ours[n].members), None)
                if meets is None:
                    continue
                skipped, later = theirs[n:meets], {g.members for g in ours[n + 1:]}
                if any(g.members in later for g in skipped):
                    return Finding("collective-mismatch", (
                        f"the ranks make their groups in different orders: {ranks_named(making)} "
                        f"{verb(making, 'makes', 'make')} {_made(theirs[n])} as {verb(making, 'its', 'their')} "
                        f"{ordinal(n + 1)} group, {ranks_named(other)} {verb(other, 'makes', 'make')} "
                        f"{_made(ours[n])}"), _ORDER_FIX)
                said = " and ".join(_made(g) for g in skipped[:2]) + (
                    f" and {len(skipped) - 2} more" if len(skipped) > 2 else "")
                which = f"the {ordinal(n + 1)}" + (f"-{ordinal(meets)} groups" if meets > n + 1 else " group")
                return Finding("collective-mismatch", (
                    f"{ranks_named(other)} {verb(other, 'has', 'have')} not made {said}, {which} {ranks_named(making)} "
                    f"made: {verb(other, 'its', 'their')} {ordinal(n + 1)} is {_made(ours[n])}, "
                    f"{verb(making, 'its', 'their')} {ordinal(meets + 1)}, so from there on the ranks' groups are "
                    "crossed"), _GROUPS_FIX)
        said = "; ".join(f"{ranks_named(ks)} {verb(ks, 'makes', 'make')} {_made(made[ks[0]][n])}" for ks in ordered)
        return Finding("collective-mismatch", f"the ranks make different groups as their {ordinal(n + 1)}: {said}",
                       _GROUPS_FIX)
    return None


def _made(group: GroupMade) -> str:
    """``new_group([0, 1]) at train.py:20``."""
    return f"new_group([{rank_list(group.members)}]){at(group.where)}"


# 1. A crash


def _crash(ranks: dict[int, Rank]) -> Finding | None:
    """The first rank to fail for a reason of its own, and the others' failures as its consequences."""
    own = sorted((r for r in ranks.values() if r.failure == "own"), key=failure_time)
    if not own:
        return None
    root = own[0]
    sizes = _size_abort(root, ranks)
    if sizes is not None:
        return sizes
    if root.facts.ended == "raised" or root.facts.error:
        what = f"raised {error_of(root)}{at(where_of(root))}"
    else:
        died = root.died_in
        what = f"{ended(root.facts.exit_code)}{' in ' + _dying_call(died) if died else ''}{at(where_of(root))}"
        if root.facts.oom:
            what += f" (the kernel: {_oom_said(root.facts.oom)})"
    lost = [r.rank for r in ranks.values() if r.failure == "lost"]
    waiting = [r for r in ranks.values() if r.position is not None]
    also = [r.rank for r in own[1:]]
    after = []
    if lost:
        calls = sorted({named(c) for r in ranks.values() if r.failure == "lost" and (c := r.failed_in)})
        within = f" in {' or '.join(calls)}" if calls else ""
        after.append(f"{ranks_named(lost)} lost {verb(lost, 'its', 'their')} connection to rank {root.rank}{within}")
    if waiting:
        ops = sorted({canonical(r.position.op) for r in waiting if r.position is not None})
        after.append(f"{ranks_named(r.rank for r in waiting)} still {verb(waiting, 'waits', 'wait')} "
                     f"in {' or '.join(ops)}")
    if also:
        after.append(f"{ranks_named(also)} also failed")
    first = " first" if after or len(ranks) > 1 else ""
    headline = f"rank {root.rank} ({text(root.host)}) failed{first}: it {what}"
    said = root.facts.error or ""
    fix = next((fix.format(**{k: text(v) for k, v in found.groupdict().items()}) for pattern, fix in _TRAINING_ERRORS
                if (found := pattern.search(said))), _OOM_FIX if root.facts.oom else None)
    if saved := _saved_elsewhere(root, ranks):
        after.insert(0, saved)
        fix = _SAVED_ELSEWHERE_FIX
    return Finding("crash", headline + ("; " + "; ".join(after) if after else ""), fix)


_SAVED_ELSEWHERE_FIX = (
    "A rank loaded a file that another rank saves, with nothing to make it wait until the file is there: save on "
    "the one rank, then dist.barrier() on every rank, then load. A file is on the disk of the host that saved it: "
    "where the hosts share no file system, send what it holds instead (dist.broadcast_object_list).")


def _saved_elsewhere(root: Rank, ranks: dict[int, Rank]) -> str:
    """Where ``root`` failed for a file it did not find (FileNotFoundError, the file named in the error)
    that another rank's program saved, before or after it looked: that rank's save, its line and when, or
    its host when it is another ("rank 0 saved that file at train.py:30, 0.4 s after rank 2 looked for
    it"); "" where no rank did, as far as their records tell."""
    said = root.facts.error or ""
    if root.facts.files is None or not said.startswith("FileNotFoundError"):
        return ""
    missed = [f for f in root.facts.files.of("missing") if PurePosixPath(f.path).name in said]
    if not missed:
        return ""
    looked = missed[-1]
    for other in sorted(ranks.values(), key=lambda r: r.rank):
        saves = [f for f in other.facts.files.of("saved") if f.path == looked.path] if other.facts.files else []
        if other is root or not saves:
            continue
        save, name = saves[-1], PurePosixPath(looked.path).name
        if other.host != root.host:
            return (f"rank {other.rank} saved {name} on {text(other.host)}{at(save.where)}; rank {root.rank} looked "
                    f"for it on {text(root.host)}{at(looked.where)}")
        gap = save.at - looked.at
        when = f"{abs(gap):.1f} s {'after' if gap >= 0 else 'before'} rank {root.rank} looked for it"
        return f"rank {other.rank} saved {name}{at(save.where)}, {when}{at(looked.where)}"
    return ""


# What DDP and FSDP raise of a program's own mistakes, and what fixes each (a fix may name what its pattern
# found: {param}).
_TRAINING_ERRORS = (
    (re.compile(r"Expected to have finished reduction in the prior iteration"),
     "The model has parameters that no loss used in the step (an unused head, a branch not taken): pass "
     "find_unused_parameters=True to DistributedDataParallel, or leave those parameters out of the model."),
    (re.compile(r"appears not to match sizes of the same param in process|DDP expects same model across"),
     "The ranks built different models (a width from the rank's own data, a rank-dependent config): build the "
     "model from what every rank knows (the whole data set's classes, a config file), the same on every rank."),
    (re.compile(r"Expected to mark a variable ready only once.*?with name (?P<param>\S+) has been marked as ready "
                r"twice", re.DOTALL),
     "DDP got the gradient of {param} twice in one backward pass: reentrant activation checkpointing "
     "(torch.utils.checkpoint with use_reentrant=True) under find_unused_parameters=True, or a module used twice in "
     "one forward, does that. Checkpoint with use_reentrant=False, or give DDP static_graph=True where the model's "
     "graph is the same at every step."),
)


_LATE_FIX = ("A rank that works outside torch.distributed for longer than the process group's timeout (the timeout= of "
             "init_process_group or new_group) makes the others give up waiting for it: move that work (copying a "
             "checkpoint, an evaluation) off the path every rank waits on (a background thread, or every rank "
             "waiting in a barrier of a longer timeout), or give the group a timeout longer than the work.")


def _timed_out(ranks: dict[int, Rank]) -> Finding | None:
    """Ranks that timed out waiting in one collective for ranks of its group that never came to it
    while they waited (elsewhere, outside any call, or later): those are why, and where they were
    (their stacks, where the lab took them) is told."""
    timed = [r for r in ranks.values() if r.failure == "lost" and r.failed_in is not None
             and r.failed_in.direction == "collective" and TIMED_OUT.search(error_of(r))]
    if not timed:
        return None
    first = min(timed, key=lambda r: r.failed_in.t0 if r.failed_in else 0.0).failed_in
    assert first is not None
    waited = [r for r in timed if r.failed_in is not None and (r.failed_in.group, r.failed_in.seq) == (
        first.group, first.seq)]
    gave_up = max((r.failed_in.t1 or r.failed_in.t0) for r in waited if r.failed_in is not None)

    def came(r: Rank) -> Record | None:
        return next((c for c in r.calls if (c.group, c.seq) == (first.group, first.seq)), None)

    absent = [ranks[k] for k in sorted(members(first.group, ranks.values()) & ranks.keys())
              if ranks[k] not in waited and ((c := came(ranks[k])) is None or c.t0 > gave_up)]
    if not absent:
        return None
    said = next((m.group(1) for r in waited if (m := TIMED_OUT.search(error_of(r))) and m.group(1)), None)
    # the timeout the program gave the group, where the ranks that waited agree on it (else none is told)
    given = {(t.seconds, t.where) for r in waited if r.facts.timeouts and (t := r.facts.timeouts.of(first.group))}
    timeout = next(iter(given)) if len(given) == 1 else None
    seconds = f"{int(said) / 1000:g} s" if said else f"{timeout[0]:g} s" if timeout else ""
    set_at = (f" (the timeout {'init_process_group' if first.group == 'world' else 'new_group'} was given at "
              f"{timeout[1]})" if timeout else "")
    after = f" after {seconds}{set_at}" if seconds else set_at

    def where(r: Rank) -> str:
        c = came(r)
        late = f"; it began {named(c)} only {c.t0 - gave_up:.1f} s after they gave up" if c is not None else ""
        if r.running or c is None:
            last = max((k for k in r.calls if k.group == first.group and k.t0 <= gave_up), key=lambda k: k.t0,
                       default=None)
            was = (f"is not in a torch.distributed call{at(r.facts.stopped_at)}" if r.running and r.position is None
                   else doing(r))
            before = (f" (its last call there, {named(last)}, ended {gave_up - (last.t1 or last.t0):.1f} s before "
                      "they gave up)") if last is not None else ""
            return f"{was}{before}{late}"
        return f"was not in it while they waited{late}"

    headline = (f"{ranks_named(r.rank for r in waited)} timed out{after} waiting in {named(first)}"
                f"{at(place(first))} for {_some(absent, where)}")
    return Finding("missing-rank", headline, _LATE_FIX)


def _size_abort(root: Rank, ranks: dict[int, Rank]) -> Finding | None:
    """gloo aborts a rank whose tensor's size differs from its peers' before any record leaves it: its
    abort message says the sizes differ, and the others' records, lost in the same call, say theirs."""
    found = _GLOO_SIZE.search(error_of(root))
    lost = [r for r in ranks.values() if r.failure == "lost" and r.failed_in is not None
            and r.failed_in.direction == "collective"]
    if found is None or not lost:
        return None
    call = lost[0].failed_in
    assert call is not None
    same = {r.rank: c for r in lost if (c := r.failed_in) is not None and (c.group, c.seq) == (call.group, call.seq)}
    sizes = f" ({found[1]} vs {found[2]} bytes)" if found[1] else ""
    stopped = where_of(root)
    if call.by or (stopped and call.where and stopped.split(" ", 1)[0] != call.where):
        # The others are in a collective torch issued, or the aborted rank was at another line: it was
        # in a collective of its own, not theirs with another size. (gloo's bytes are one message's, a
        # piece of the tensor: no size of the call is said from them.)
        mine = _dying_call(root.died_in) if root.died_in else root.facts.aborted_in or "a collective"
        alone = "makes {}, a collective the others do not make," if call.by else "is in {}, a call other than theirs,"
        headline = (f"rank {root.rank} ({text(root.host)}) {alone.format(mine)}"
                    f"{at(stopped)}: {ranks_named(same)} {verb(same, 'is', 'are')} in {named(call)}"
                    f"{at(place(call))}; gloo aborted rank {root.rank} on their sizes: Received data size doesn't "
                    f"match expected size{sizes}")
        return Finding("collective-mismatch", headline, _OWN_COLLECTIVE, same)
    # the ranks gloo aborted in the same call (their relays' word: no number, and no lists of its tensors)
    died = {r.rank: r.died_in for r in ranks.values() if r.failure == "own" and r.died_in is not None
            and canonical(r.died_in.op) == canonical(call.op) and r.died_in.where == call.where}
    if (crossed := _peers_crossed(died | same, sorted(members(call.group, ranks.values())))) is not None:
        return replace(crossed, headline=f"{crossed.headline}; gloo aborted {ranks_named(died or [root.rank])} on "
                                         f"them: Received data size doesn't match expected size{sizes}")
    theirs = f" {size(call)}" if size(call) else " theirs"
    own = size(root.died_in) if root.died_in else None
    whose = f", which passes {own}" if own else ", whose size differs"
    headline = (f"the ranks pass different sizes to {named(call)}: {ranks_named(same)} {verb(same, 'passes', 'pass')}"
                f"{theirs}; gloo aborted rank {root.rank} ({text(root.host)}){whose}: Received data "
                f"size doesn't match expected size{sizes}")
    return Finding("collective-mismatch", headline, _ASPECTS[1][2], same)


def _dying_call(call: Record) -> str:
    """The call a rank died in, as its relay kept it: ``all_reduce of 1 float``, ``recv from 2 of 4
    floats`` (no number: a rank's count may miss the collectives torch issued that it never read)."""
    said = size(call)
    return f"{named(call) if call.direction in ('send', 'recv') else call.op}{' of ' + said if said else ''}"


_OOM_SAID = re.compile(r"^(.*?Killed process \d+ \([^)]*\)(?:[^,]*,){0,2})")


_OOM_FIX = ("The kernel's OOM killer ended the rank: it needed more memory than its host, or its memory cgroup's "
            "limit, allows. Lower its batch size or what it keeps alive between steps, or give it more memory.")


def _oom_said(line: str) -> str:
    """The kernel's OOM line, to its process and memory: "Memory cgroup out of memory: Killed process
    5193 (python3) total-vm:426168kB, anon-rss:102016kB"."""
    found = _OOM_SAID.match(line)
    return f'"{text(found[1].rstrip(", ") if found else line)}"'


_OWN_COLLECTIVE = ("Every rank must make the collectives DDP and FSDP make: a collective on some ranks only (rank-0 "
                   "evaluation, checkpointing, logging) runs against the others' next gradient all_reduce. Make it "
                   "on every rank, or keep the rank-0-only work free of collectives.")
_GLOO_SIZE = re.compile(r"(?:(\d{1,18}) vs (\d{1,18})\. )?Received data size doesn't match expected size")


def _mismatch_first(ranks: dict[int, Rank]) -> Finding | None:
    """A collective mismatch that began before the first rank failed for a reason of its own: that
    failure follows from it (a rank whose own check saw the wrong sum gloo made of different ops)."""
    found = _mismatch(ranks)
    if found is None:
        return None
    own = [failure_time(r)[0] for r in ranks.values() if r.failure == "own"]
    return found if not own or min(c.t0 for c in found.shown.values()) <= min(own) else None


# 2. The rendezvous


def _rendezvous(ranks: dict[int, Rank]) -> Finding | None:
    """Ranks that never joined: no call seen, not started or still in init_process_group; where some
    wait in init_process_group, the ranks that are not there (exited before it, elsewhere, not started)."""
    absent = [r for r in ranks.values() if r.absent]
    if not absent:
        return None
    joining = [r for r in absent if r.facts.stage == "rendezvous"]
    asked = [r for r in joining if r.facts.world_asked not in (None, len(ranks))]
    if asked:
        size = asked[0].facts.world_asked
        return Finding("rendezvous", f"{ranks_named(r.rank for r in asked)} {verb(asked, 'waits', 'wait')} in "
                       f"init_process_group for a world of {size} ranks (world_size={size}{at(where_of(asked[0]))}), "
                       f"but the job has {len(ranks)} ranks",
                       "Take the world size from the launcher: leave world_size out of init_process_group (env:// "
                       "reads WORLD_SIZE), or pass int(os.environ['WORLD_SIZE']).")
    if len(joining) == len(ranks):
        return Finding("rendezvous", f"no rank got past the rendezvous: {ranks_named(ranks)} "
                       f"{verb(ranks, 'is', 'are')} still in init_process_group",
                       "Every rank must reach MASTER_ADDR:MASTER_PORT and pass the same world size; "
                       "'lab doctor' checks the network between the hosts.")
    away = [r for r in ranks.values() if not r.absent and not r.calls and (r.outside or not r.running)]
    if joining and (away or len(joining) < len(absent)):
        return _not_there(joining, [r for r in ranks.values() if r not in joining and (r.absent or r in away)])
    starting = [r for r in absent if r.facts.stage == "starting"]
    missing = starting or absent
    named = sorted({text(r.host) for r in missing})
    hosts = ", ".join(named)
    gone = {r.rank for r in missing}
    others = [r.rank for r in ranks.values() if r.rank not in gone and r.running]
    if starting:
        what, fix = "never started", _NOT_STARTED
    else:
        what = "never joined the process group: still in init_process_group"
        fix = (f"Check that {hosts} {verb(named, 'reaches', 'reach')} MASTER_ADDR:MASTER_PORT and the other hosts "
               "('lab doctor' checks it), and that every rank passes the same world size.")
    them = verb(missing, "it", "them")
    wait = f"; {ranks_named(others)} {verb(others, 'waits', 'wait')} for {them}" if others else ""
    return Finding("rendezvous", f"{ranks_named(r.rank for r in missing)} on {hosts} {what}{wait}", fix)


_NOT_STARTED = "See the output of its host above, and run 'lab doctor' to check the hosts."


def _not_there(joining: list[Rank], missing: list[Rank]) -> Finding:
    """Ranks wait in init_process_group for ranks that are not in it: ended before it, not started,
    or elsewhere (a rank that computes may still come: a wait, until --timeout)."""
    said = [f"rank {r.rank} on {text(r.host)}, which {doing(r)}" for r in missing[:HEADLINE_RANKS]]
    if len(missing) > HEADLINE_RANKS:
        said.append(f"{len(missing) - HEADLINE_RANKS} more (below)")
    headline = (f"{ranks_named(r.rank for r in joining)} {verb(joining, 'waits', 'wait')} in init_process_group "
                f"for {said[0] if len(said) == 1 else ', '.join(said[:-1]) + ', and ' + said[-1]}")
    if any(not r.running for r in missing):
        fix = ("Every rank of the world must call init_process_group, also one with nothing to do (it can leave "
               "with destroy_process_group).")
    elif any(r.facts.stage == "starting" for r in missing):
        fix = _NOT_STARTED
    else:
        fix = None
    return Finding("rendezvous", headline, fix)


# 3. A collective mismatch

# What ranks must agree on at one collective, in the order asked: (aspect, value of a call, fix).
_SKIP_FIX = ("Every rank of a group must make the same collectives: a collective inside a branch on something "
             "only this rank knows (its own loss, its own batch) is skipped by the ranks where it is false; decide "
             "on values every rank agrees on (all_reduce them first).")
_ASPECTS: tuple[tuple[str, Callable[[Record], object], str], ...] = (
    ("op", lambda c: canonical(c.op),
     "Every rank of a group must make the same collectives in the same order: look for a collective in a branch "
     "on the rank, or a loop that runs more times on some ranks (uneven data: DDP's join(), drop_last=True)."),
    ("size", lambda c: None if canonical(c.op) in SIZES_DIFFER else c.numel,
     "Every rank must pass a tensor of the same size to a collective (pad to a common size, or gather the sizes "
     "first)."),
    ("dtype", lambda c: c.dtype, "Every rank must pass a tensor of the same dtype to a collective."),
    ("reduce op", lambda c: c.reduce_op if canonical(c.op) in REDUCING else None,
     "Every rank must pass the same op= to a reduction."),
    ("root", lambda c: c.root if canonical(c.op) in ROOTED else None,
     "Every rank must pass the same src or dst: compute it from what all ranks know, not from the rank itself."),
)


def _mismatch(ranks: dict[int, Rank]) -> Finding | None:
    """The first call of a group (by when it began) that ranks made in different ops, or with different
    sizes, dtypes, reduce ops or roots; gloo turns some of these into crashes, the records still show them."""
    slots: dict[tuple[str, int], dict[int, Record]] = {}
    for k, r in ranks.items():
        for c in r.calls:
            if c.direction == "collective":
                slots.setdefault((c.group, c.seq), {})[k] = c
    for (group, seq), calls in sorted(slots.items(), key=lambda kv: (min(c.t0 for c in kv[1].values()), kv[0])):
        # (a call that sends each peer its own tensor, its lists recorded, is held to them pair by pair: below)
        by_peer = any(canonical(c.op) in PER_PEER and (c.in_splits or c.out_splits) for c in calls.values())
        for aspect, value, fix in _ASPECTS:
            if aspect == "size" and by_peer:
                continue
            values = {k: v for k, v in ((k, value(c)) for k, c in calls.items()) if v is not None}
            if len(set(values.values())) > 1:
                return (aspect == "op" and _skipped(ranks, calls)) or _against_torch(calls) or Finding(
                    "collective-mismatch", _disagree(aspect, group, seq, calls, values), fix, calls)
        if found := _peers_crossed(calls, sorted(members(group, ranks.values()))) or _unequal_for_gloo(calls):
            return found
    return None


_SPLITS_FIX = ("In all_to_all_single, each rank's output_split_sizes must be what each peer sends it (that peer's "
               "input_split_sizes): exchange the counts first (an all_to_all_single of a tensor of one count per "
               "rank), then size the output and its splits from what came.")
_PEER_SIZES_FIX = {
    "all_gather": "In all_gather, each rank's tensor_list[i] must be as large as the tensor rank i passes, and gloo "
                  "gathers equal sizes only: all_gather the counts first, pad every rank's tensor to the largest, "
                  "gather, and cut each back to its count (for a few Python values, all_gather_object).",
    "gather": "In gather, the root's gather_list[i] must be as large as the tensor rank i passes: gather the counts "
              "first, pad every rank's tensor to the largest, and cut each back to its count on the root.",
    "scatter": "In scatter, each rank's tensor must be as large as its tensor in the root's scatter_list: broadcast "
               "the sizes first, or scatter equal pieces.",
    "all_to_all": "In all_to_all, each rank's output_tensor_list[i] must be as large as what rank i sends it (its "
                  "input_tensor_list[j]): exchange the counts first, then size the outputs from what came.",
    "all_to_all_single": _SPLITS_FIX,
}


def _peer_sizes(call: Record, places: dict[int, int]) -> tuple[dict[int, tuple[int, str]], dict[int, tuple[int, str]]]:
    """What one rank's call sends each peer and what it takes from each, by the peer's place in the group
    (its global rank's index among the group's, sorted): the amount and the argument that gave it. Only
    what the rank's record holds (a gather's list is its root's; a rank that died has no lists)."""
    op, n = canonical(call.op), len(places)
    to_peers, from_peers = PER_PEER[op]
    root = places.get(call.root) if call.root is not None else None
    ins, outs = call.in_splits, call.out_splits
    sends: dict[int, tuple[int, str]] = {}
    takes: dict[int, tuple[int, str]] = {}
    if to_peers and ins is not None and len(ins) == n:
        sends = {j: (ins[j], f"{to_peers}[{j}]") for j in range(n)}
    elif not to_peers and call.numel is not None:  # (all_gather's tensor goes to every rank, gather's to its root)
        sends = {j: (call.numel, "tensor") for j in range(n) if op == "all_gather" or j == root}
    if from_peers and outs is not None and len(outs) == n:
        takes = {i: (outs[i], f"{from_peers}[{i}]") for i in range(n)}
    elif not from_peers and call.numel is not None and root is not None:  # (scatter's tensor comes from its root)
        takes = {root: (call.numel, "tensor")}
    return sends, takes


def _peers_crossed(calls: dict[int, Record], group: list[int]) -> Finding | None:
    """Where the ranks at one call that sends each peer its own tensor (all_to_all_single's splits,
    all_gather's list...) gave sizes that do not meet: a rank sends a peer what the peer does not
    expect from it, said pair by pair; None where they meet, or were not recorded. A place in a list
    or the splits is a rank of ``group``, sorted."""
    place = {r: n for n, r in enumerate(group)}
    known = {k: _peer_sizes(c, place) for k, c in calls.items() if k in place and canonical(c.op) in PER_PEER}
    pairs = [(i, j, known[i][0][place[j]], known[j][1][place[i]]) for i in sorted(known) for j in sorted(known)
             if place[j] in known[i][0] and place[i] in known[j][1]]
    crossed = [(i, j, sent, expected) for i, j, sent, expected in pairs if sent[0] != expected[0]]
    if not crossed:
        return None
    call = calls[crossed[0][1]]  # (named as the rank that expected it recorded it: a whole record, numbered)
    op = canonical(call.op)
    rows = op in SPLIT_SIZES

    def amount(n: int) -> str:
        return f"{n} row{'' if n == 1 else 's'}" if rows else size(replace(call, numel=n)) or str(n)

    said = [f"rank {i} sends {'itself' if i == j else f'rank {j}'} {amount(sent)} ({how}), "
            f"{'and' if i == j else 'which'} expects {amount(expected) if not rows else expected}"
            f"{'' if i == j else ' from it'} ({whence})"
            for i, j, (sent, how), (expected, whence) in crossed[:HEADLINE_RANKS]]
    more = f"; and {len(crossed) - HEADLINE_RANKS} more" if len(crossed) > HEADLINE_RANKS else ""
    word = "splits" if rows else "sizes"
    whole = len(group) == sum(bool(sends and takes) for sends, takes in known.values())
    recorded = "" if whole else f" whose {word} were recorded"
    counted = f" ({len(crossed)} of the {len(pairs)} pairs{recorded})" if len(crossed) > 1 else ""
    headline = f"The ranks' {word} of {named(call)}{at(call.where)} do not meet{counted}: {'; '.join(said)}{more}"
    return Finding("collective-mismatch", headline, _PEER_SIZES_FIX[op], calls)


_GLOO_UNEQUAL = re.compile(r"ProcessGroupGloo::allgather: invalid tensor size")
_GLOO_UNEQUAL_FIX = ("gloo's all_gather takes tensors of one size from every rank (NCCL's takes uneven ones): "
                     "pad every rank's tensor to the largest of the counts gathered, gather, and cut each back to its "
                     "count.")


def _unequal_for_gloo(calls: dict[int, Record]) -> Finding | None:
    """An all_gather whose sizes differ from rank to rank but meet (each rank's tensor_list sized from
    what each passes: _peers_crossed found none crossed), that gloo refused: it gathers equal sizes only."""
    refused = {k: c for k, c in calls.items() if c.error and _GLOO_UNEQUAL.search(c.error)}
    call = next(iter(calls.values()))
    sizes = sorted({c.numel for c in calls.values() if c.numel is not None})
    if not refused or canonical(call.op) != "all_gather" or len(sizes) < 2 or any(
            c.out_splits is None for c in calls.values()):
        return None
    least, most = (size(replace(call, numel=n)) for n in (sizes[0], sizes[-1]))
    headline = (f"The ranks' sizes of {named(call)}{at(call.where)} differ ({least} to {most}) and meet, each rank's "
                f"tensor_list sized as its peers pass, but gloo gathers equal sizes only: it refused the call on "
                f"{ranks_named(refused)} (ProcessGroupGloo::allgather: invalid tensor size)")
    return Finding("collective-mismatch", headline, _GLOO_UNEQUAL_FIX, calls)


def _against_torch(calls: dict[int, Record]) -> Finding | None:
    """At one call, some ranks in a collective of the program's own and the others in one torch issued
    (DDP's gradient all_reduce): the former make a collective the others do not."""
    own = {k: c for k, c in calls.items() if not c.by}
    issued = {k: c for k, c in calls.items() if c.by}
    if not own or not issued:
        return None
    mine, theirs = next(iter(own.values())), next(iter(issued.values()))
    headline = (f"{ranks_named(own)} {verb(own, 'makes', 'make')} {named(mine)}{at(mine.where)}, a collective "
                f"the others do not make: {ranks_named(issued)} {verb(issued, 'is', 'are')} in {named(theirs)}"
                f"{at(place(theirs))}")
    return Finding("collective-mismatch", headline, _OWN_COLLECTIVE, calls)


def _skipped(ranks: dict[int, Rank], calls: dict[int, Record]) -> Finding | None:
    """Ranks in different collectives at one call, where the fewer are already in a call the others
    made before at the same line: those skipped the others' call (a collective in a branch on the
    rank's own data), rather than making another one in its place."""
    sides: dict[tuple[str, str | None], list[int]] = {}
    for k, c in sorted(calls.items()):
        sides.setdefault((canonical(c.op), c.where), []).append(k)
    if len(sides) != 2:
        return None
    (op, where), most = max(sides.items(), key=lambda kv: len(kv[1]))
    (ahead_op, ahead_where), ahead = min(sides.items(), key=lambda kv: len(kv[1]))
    some = calls[most[0]]
    made_before = any(canonical(c.op) == ahead_op and c.where == ahead_where and c.group == some.group
                      and c.seq < some.seq for k in most for c in ranks[k].calls)
    if len(ahead) >= len(most) or ahead_where is None or not made_before:
        return None
    headline = (f"{ranks_named(ahead)} skipped {op} #{some.seq}{on_group(some.group)}{at(where)}, where "
                f"{ranks_named(most)} wait for {verb(ahead, 'it', 'them')}: {verb(ahead, 'it', 'they')} went on "
                f"to the next {ahead_op}{at(ahead_where)}")
    return Finding("missing-rank", headline, _SKIP_FIX, calls)


def _disagree(aspect: str, group: str, seq: int, calls: dict[int, Record], values: dict[int, object]) -> str:
    sides: dict[object, list[int]] = {}
    for k, v in sorted(values.items()):
        sides.setdefault(v, []).append(k)
    ordered = sorted(sides.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    op = canonical(calls[ordered[0][1][0]].op)
    if aspect == "op":
        said = ", ".join(f"{ranks_named(ks)} in {v}" for v, ks in ordered)
        return f"the ranks are in different collectives at the same call (#{seq}{on_group(group)}): {said}"
    if aspect == "size":
        said = ", ".join(f"{ranks_named(ks)} {verb(ks, 'passes', 'pass')} {size(calls[ks[0]])}" for _, ks in ordered)
        return f"the ranks pass different sizes to {op} #{seq}{on_group(group)}: {said}"
    if aspect == "root":
        which = "source" if op in FROM_ROOT else "root"
        said = ", ".join(f"{ranks_named(ks)} {verb(ks, 'says', 'say')} rank {v}" for v, ks in ordered)
        return f"the ranks disagree on the {which} of {op} #{seq}{on_group(group)}: {said}"
    said = ", ".join(f"{ranks_named(ks)} {verb(ks, 'passes', 'pass')} {v}" for v, ks in ordered)
    return f"the ranks pass different {aspect}s to {op} #{seq}{on_group(group)}: {said}"


# 5. A rank missing from a collective


@dataclass
class _Waited:
    """A collective some ranks wait in (or failed in, waiting), and the ranks of its group not there."""

    group: str
    seq: int
    there: list[Rank] = field(default_factory=list)
    missing: list[Rank] = field(default_factory=list)

    @property
    def waits(self) -> str:
        """How the ranks there wait: gloo ends many waits in an error when a peer ends."""
        return "failed waiting" if all(not r.running for r in self.there) else verb(self.there, "waits", "wait")

    @property
    def call(self) -> Record:
        call = self.there[0].stuck
        assert call is not None  # (a rank is there because it is stuck in it)
        return call


def _waited_calls(ranks: dict[int, Rank]) -> list[_Waited]:
    """Every collective ranks are stuck in, the one with the most ranks first."""
    slots: dict[tuple[str, int], _Waited] = {}
    for r in ranks.values():
        call = r.stuck
        if call is not None and call.direction == "collective":
            slots.setdefault((call.group, call.seq), _Waited(call.group, call.seq)).there.append(r)
    last: dict[tuple[int, str], int] = {}  # (rank, group) -> the highest number of its collectives there
    for k, r in ranks.items():
        for c in r.calls:
            if c.direction == "collective":
                last[k, c.group] = max(last.get((k, c.group), 0), c.seq)
    for slot in slots.values():
        # A rank with a record of this collective, or of a later one of the group, came there.
        came = {k for k in ranks if last.get((k, slot.group), 0) >= slot.seq}
        slot.missing = [ranks[k] for k in sorted(members(slot.group, ranks.values()) & ranks.keys() - came)]
    return sorted(slots.values(), key=lambda s: (-len(s.there), s.group, s.seq))


def _missing(ranks: dict[int, Rank]) -> Finding | None:
    """Ranks wait in a collective that a rank of its group is not in: it is elsewhere, or ended (after
    fewer such calls than the others: uneven counts). Ranks that only compute are stragglers (7)."""
    for slot in _waited_calls(ranks):
        if not slot.missing or all(r.outside for r in slot.missing):
            continue
        if all(not r.running and r.failure is None and r.facts.exit_call is None for r in slot.missing):
            return _uneven(slot)  # (they ran to their end: a rank that called exit left early)
        call = slot.call
        said = {doing(r, many=True) for r in slot.missing}
        missing = (f"{ranks_named(r.rank for r in slot.missing)}, which {said.pop()}"
                   if len(slot.missing) > 1 and len(said) == 1 else _some(slot.missing, doing))
        headline = (f"{ranks_named(r.rank for r in slot.there)} {slot.waits} in {_by(call)}{canonical(call.op)} "
                    f"#{call.seq}{on_group(call.group)} for {missing}")
        elsewhere = any(r.position is not None for r in slot.missing)
        fix = (_CELL_FIX if any(r.facts.cell_ended for r in slot.missing) else
               "Every rank of a group must reach each of its collectives: look for one in a branch on the rank, "
               "or a call only some ranks make before it." if elsewhere else
               "Every rank must make the same collective calls before it ends." if
               any(not r.running for r in slot.missing) else None)
        return Finding("missing-rank", headline, fix, {r.rank: r.stuck for r in slot.there if r.stuck})
    return None


_CELL_FIX = ("Every rank of the group must make each of its collectives in the same cell: look for one in a branch on "
             "the rank (if rank == 0:), or a cell run with --ranks on some ranks that calls a collective of the world "
             "(make a group of those ranks with dist.new_group, on every rank, and call it on that group).")


def _by(call: Record) -> str:
    return f"{call.by} " if call.by else ""


def _uneven(slot: _Waited) -> Finding:
    """Ranks wait in their n-th call of an op that the ranks that ended made fewer times."""
    call, op = slot.call, canonical(slot.call.op)
    there, gone = [r.rank for r in slot.there], [r.rank for r in slot.missing]
    made = {r.count(call.group, op) for r in slot.missing}
    nth = {None if (n := r.count(call.group, op)) is None else n + 1 for r in slot.there}
    (n, k) = (nth.pop(), made.pop()) if len(made) == 1 and len(nth) == 1 else (None, None)
    if n is not None and k is not None:
        finished = f"finished after {k}" if k else f"finished without calling {op}"
        nth_call = f"{verb(there, 'its', 'their')} {ordinal(n)} {op}{on_group(call.group)}"
        if call.by:  # (torch issued it: its number says which call of the group it is)
            nth_call = f"{named(call)} ({nth_call}){at(place(call))}"
        headline = f"{ranks_named(there)} {slot.waits} in {nth_call}; {ranks_named(gone)} {finished}"
    else:
        headline = (f"{ranks_named(there)} {slot.waits} in {op} #{call.seq}{on_group(call.group)}; "
                    f"{ranks_named(gone)} exited with status 0 before calling it")
    fix = _UNEVEN
    torn: dict[str, list[int]] = {}  # where -> the ranks that destroyed the process group there before they ended
    for r in slot.missing:
        if r.facts.destroyed:
            torn.setdefault(r.facts.destroyed, []).append(r.rank)
    if torn:
        headline += "; " + "; ".join(f"{ranks_named(ks)} destroyed the process group at {where} and returned"
                                      for where, ks in list(torn.items())[:HEADLINE_RANKS])
        fix = _LEFT_ALONE
    if parted := _parted([*slot.there, *slot.missing]):
        headline += f"; where their steps parted: {parted.said}"
        fix = _DECIDED_ALONE
        if parted.extra_forward:
            headline += f"; {parted.extra_forward}"
            fix = _FORWARD_ALONE
    return Finding("uneven-counts", headline, fix, {r.rank: r.stuck for r in slot.there if r.stuck})


_UNEVEN = ("Every rank must make the same number of collective calls: give every rank the same number of batches "
           "(a DistributedSampler with drop_last=True), or train under DDP's join() context manager "
           "(`with model.join():`) where the data are uneven.")
_LEFT_ALONE = ("A rank made fewer collective calls than the others and destroyed the process group while they went "
               "on. If it stopped on a decision of its own (its own loss stopped improving: a return or break), "
               "decide on what every rank shares (all_reduce the stop flag, or the loss, first) so that every rank "
               "leaves at the same step; if it ran out of data, give every rank the same number of batches "
               "(drop_last=True) or train under DDP's join(). Destroy the group only after the loop, on every rank.")
_DECIDED_ALONE = ("A rank took a decision that changes its steps on its own data (skipping a step on a non-finite "
                  "loss, when to sync its gradients): take it from what every rank shares, e.g. all_reduce the "
                  "flag (or the token count) first, so that every rank skips or syncs at the same step.")

_FORWARD_ALONE = ("A forward of the DDP model that not every rank runs (an evaluation, a sample, a log on rank 0) is "
                  "a collective the others never make: DDP's forward broadcasts the module's buffers (a BatchNorm's "
                  "running statistics) from rank 0 first, and the others' next collective meets it. Run it on the "
                  "module DDP wraps, `model.module(x)` (its forward makes no collective), or on every rank.")


@dataclass(frozen=True)
class _Parting:
    """Where the ranks' training steps first differ (:func:`_parted`)."""

    said: str  # each set of ranks and the step it ran there
    # ranks whose forward was followed by a forward where the others' was by a backward pass, the forward made
    # at a place other than the others': a forward of their own (an evaluation), said; "" where none was
    extra_forward: str = ""


def _parted(ranks: Sequence[Rank]) -> _Parting | None:
    """Where the ranks' training steps (a DDP program's forwards and backward passes, as each recorded
    them) first differ, among the steps every rank made: "rank 1 ran its 5th forward at train.py:18,
    ranks 0, 2, 3 ran a backward pass after their 4th forward at train.py:25"; None where they do not
    (a rank that only made fewer steps, or ranks that recorded none)."""
    logs = {r.rank: {mark.n: mark for mark in r.steps} for r in ranks if r.steps}
    if len(logs) < 2 or len(logs) < len(ranks):
        return None
    first = max(min(log) for log in logs.values())
    whole = first == 1  # (each rank's steps from its first: the forwards can be counted)
    for n in range(first, min(max(log) for log in logs.values()) + 1):
        marks = {k: mark for k, log in logs.items() if (mark := log.get(n)) is not None}
        if len(marks) < len(logs):
            return None
        kinds = {k: (mark.kind, mark.sync) for k, mark in marks.items()}
        if len(set(kinds.values())) == 1:
            continue
        together: dict[tuple[str, bool | None], list[int]] = {}
        for k in sorted(kinds):
            together.setdefault(kinds[k], []).append(k)
        synced = any(sync is False for _, sync in together)
        said = []
        for (kind, sync), ks in sorted(together.items(), key=lambda item: (len(item[1]), item[1])):
            forwards = sum(1 for m in logs[ks[0]].values() if m.n < n and m.kind == "forward") if whole else None
            its = verb(ks, "its", "their")
            if kind == "forward":
                nth = f"{its} {ordinal(forwards + 1)} forward" if forwards is not None else "a forward"
                how = " under no_sync()" if sync is False else " (syncing the gradients)" if synced else ""
                what = f"ran {nth}{how}"
            else:
                what = "ran a backward pass" + (f" after {its} {ordinal(forwards)} forward" if forwards else "")
            said.append(f"{ranks_named(ks)} {what}{at(marks[ks[0]].where)}")
        return _Parting(", ".join(said), _extra_forward(logs, n, together, whole))
    return None


def _extra_forward(logs: dict[int, dict[int, StepMark]], n: int, together: dict[tuple[str, bool | None], list[int]],
                   whole: bool) -> str:
    """Where the ranks' steps part at ``n`` into forwards and backward passes: the forward before step ``n`` of
    the ranks that run a forward at ``n`` (no backward pass followed it), if the others made theirs, the one a
    backward pass followed, at another place: "the 5th forward of rank 0 at eval.py:14 had no backward pass
    after it (the others' at train.py:44 had)"; "" where it is not so (a rank that skipped a backward pass after
    the forward every rank made, at the same place, decided alone: ``_DECIDED_ALONE``)."""
    kinds = {kind for kind, _ in together}
    if kinds != {"forward", "backward"}:
        return ""
    ahead = [k for (kind, _), ks in together.items() if kind == "forward" for k in ks]
    rest = [k for (kind, _), ks in together.items() if kind == "backward" for k in ks]
    before = {k: mark.where for k in (*ahead, *rest) if (mark := logs[k].get(n - 1)) and mark.kind == "forward"}
    if len(before) < len(ahead) + len(rest):
        return ""
    own, theirs = ({before[k] for k in ks} for ks in (ahead, rest))
    if len(own) != 1 or not own.isdisjoint(theirs):
        return ""
    forwards = sum(1 for m in logs[ahead[0]].values() if m.n < n - 1 and m.kind == "forward") + 1 if whole else None
    nth = f"{ordinal(forwards)} forward" if forwards is not None else "forward before that"
    others = f" (the others' at {next(iter(theirs))} had)" if len(theirs) == 1 else ""
    return f"the {nth} of {ranks_named(ahead)}{at(next(iter(own)))} had no backward pass after it{others}"


# 7. A straggler, nothing wrong, or what is known


def _straggler(ranks: dict[int, Rank]) -> Finding | None:
    """Ranks that wait only on ranks computing outside torch.distributed: a wait, not a hang (yet)."""
    waiting: set[int] = set()
    on: set[int] = set()
    for slot in _waited_calls(ranks):
        if slot.missing and any(r.running for r in slot.there):
            waiting |= {r.rank for r in slot.there if r.running}
            on |= {r.rank for r in slot.missing}
    live = waitfor.blocked(ranks)
    for k in live:
        if ends := waitfor.endpoint(k, live, ranks):
            waiting.add(k)
            on |= set(ends)
    if not on or not all(ranks[k].outside for k in on):
        return None
    outside = [ranks[k] for k in sorted(on)]
    where = at(where_of(outside[0])) if len(outside) == 1 else ""
    return Finding("straggler", f"{ranks_named(waiting)} {verb(waiting, 'is', 'are')} waiting on {ranks_named(on)}, "
                   f"which {verb(on, 'is', 'are')} not in a torch.distributed call{where}; not a hang while "
                   f"{verb(on, 'it computes', 'they compute')}")


def _nothing(ranks: dict[int, Rank]) -> Finding | None:
    """No rank waits and none failed."""
    if not ranks or any(r.position is not None or r.failure is not None or r.absent for r in ranks.values()):
        return None
    if all(not r.running for r in ranks.values()):
        return Finding("none", "every rank finished; none is left in a torch.distributed call")
    return Finding("none", "no rank is waiting in a torch.distributed call")


def _unknown(ranks: dict[int, Rank]) -> Finding:
    """What the ranks do, grouped, where no rule names a cause: never a guess."""
    if not ranks:
        return Finding("unknown", "no rank to explain")
    full = [s for s in _waited_calls(ranks) if not s.missing and any(r.running for r in s.there)]
    said: dict[str, list[int]] = {}
    for k, r in sorted(ranks.items()):
        said.setdefault(doing(r, many=True), []).append(k)
    parts = [f"{ranks_named(ks)} {what if len(ks) > 1 else doing(ranks[ks[0]])}" for what, ks in said.items()]
    known = "; ".join(parts[:HEADLINE_RANKS + 1]) + (f"; and {len(parts) - HEADLINE_RANKS - 1} more (below)"
                                                     if len(parts) > HEADLINE_RANKS + 1 else "")
    agree = " (every rank of its group is in it, and their calls agree)" if full else ""
    return Finding("unknown", f"no cause found in the records: {known}{agree}")


# The facts of a run's ranks, from what the runner knows of each


def explain_run(outcome: RunOutcome) -> Cause | None:
    """Why a run hung or failed, across its ranks; None when it completed with every rank done."""
    if outcome.status == "completed" and all(s.done for s in outcome.ranks):
        return None
    order = sorted((s.ended_at, s.spec.rank) for s in outcome.ranks if s.ended_at is not None)
    arrival = {rank: i for i, (_, rank) in enumerate(order)}
    programs = program_files(outcome.plan)
    cells = between_cells(outcome.ranks)  # (a notebook's ranks)
    return explain([replace(facts_of(s, outcome.exercises, arrival.get(s.spec.rank), programs),
                            cell_ended=cell.name if (cell := cells.get(s.spec.rank)) else None,
                            cell_error=cell.error if cell else "")
                    for s in outcome.ranks])


def facts_of(state: RankState, runs: Mapping[str, ExerciseRun], arrival: int | None = None,
             programs: Mapping[str, Path] | None = None) -> RankFacts:
    """What the runner knows of one rank, as the analysis takes it: its last flight dump (and, where a
    progress event came after it, the call that says it is in), and how it ended by itself, if it did;
    for a rank aborted by a C++ exception, where the stacks it printed as it died show it (``programs``:
    the run's, lab.core.stacks.program_files)."""
    records, inflight = _flight_of(state)
    ended_by_itself = state.ended_at is not None
    error, traceback = _error_of(state, runs) if ended_by_itself else (None, None)
    how: Ended = "running"
    if ended_by_itself:
        how = "raised" if error is not None else "exited"
    exit_call = _exit_call(state, runs) if ended_by_itself and error is None else None
    failed_at = None if state.ended_at is None else time.time() - (time.monotonic() - state.ended_at)
    raised = _exercise_error(state, runs) if not ended_by_itself else None
    if raised is not None and not raised.error.startswith(SYS_EXIT):
        # Its exercise raised, and it waits in the lab's barrier after it: its program failed there, and
        # what the lab does after that is no party to the cause (nor are its calls: Calls.of_the_program).
        how, error, traceback = "raised", raised.error, raised.traceback
        failed_at = time.time() - (time.monotonic() - state.step_started)
        records = records.of_the_program() if records is not None else None
        inflight = inflight.of_the_program() if inflight is not None else None
    stage: Stage = "starting" if not state.info else "rendezvous" if state.step.kind == "rendezvous" else "joined"
    stopped_at, aborted_in, died_in, oom = state.stopped_at, None, None, None
    died = state.last_call
    if died is not None and ended_by_itself and state.exit_code is not None and _by_signal(state.exit_code):
        # (what its relay says it was in: a rank that ended otherwise said so itself; its number is the
        # program's count alone where torch issued collectives it never read, so it is kept out of its calls)
        died_in, oom = died.call, died.oom or None
    if state.exit_code in ABORTED:  # (its stacks, as it died: where it was, and in which call)
        dump = [line for line in state.tail if is_stack_line(line)]
        if stopped_at is None and programs is not None:
            stopped_at = where_stopped(dump, dict(programs))
        aborted_in = called_in(dump)
    return RankFacts(state.spec.rank, state.spec.host, records, inflight, state.flight.counts if state.flight
                     else None, how, state.exit_code if ended_by_itself else None, error, traceback,
                     stopped_at, stage, failed_at, arrival, exit_call, aborted_in=aborted_in,
                     died_in=died_in, oom=oom, steps=state.flight.steps if state.flight else None,
                     made=state.flight.made if state.flight else None,
                     destroyed=state.flight.destroyed if state.flight else None,
                     timeouts=state.flight.timeouts if state.flight else None,
                     files=state.flight.files if state.flight else None)


def _flight_of(state: RankState) -> tuple[Calls | None, Calls | None]:
    """A rank's records and calls in flight: its last dump's, the newer progress event's call in flight
    in place of the dump's where the progress came after it; (None, None) where it sent neither."""
    records = state.flight.records if state.flight else None
    inflight = state.flight.inflight if state.flight else None
    progress = state.progress
    if progress is not None and (state.flight_at is None or (state.progress_at or 0.0) > state.flight_at):
        inflight = Calls((progress.inflight,) if progress.inflight else (), 1 if progress.inflight else 0)
        records = Calls() if records is None else records
    return records, inflight


def _exit_call(state: RankState, runs: Mapping[str, ExerciseRun]) -> str | None:
    """Where the program of a rank that exited called sys.exit or os._exit, where it says."""
    end = state.end
    if end is not None:
        return end.where or None if end.how == "exited" else None
    error = _exercise_error(state, runs)
    return error.where or None if error is not None and error.error.startswith(SYS_EXIT) else None


def _exercise_error(state: RankState, runs: Mapping[str, ExerciseRun]) -> Error | None:
    """The error the rank reported in the exercise it was in (or in the barrier after), if any."""
    run = runs.get(state.step.exercise or "")
    return run.errors.get(state.spec.rank) if run is not None else None


def _error_of(state: RankState, runs: Mapping[str, ExerciseRun]) -> tuple[str | None, str | None]:
    """The exception a rank that ended raised, with its traceback: its program's (a script's end
    event, a fatal error), else the one its exercise reported; (None, None): it did not raise."""
    end = state.end
    if end is not None:
        return (end.error or "an exception", end.traceback) if end.how == "raised" else (None, None)
    if state.fatal:
        return state.fatal, state.traceback
    error = _exercise_error(state, runs)
    if error is not None and not error.error.startswith(SYS_EXIT):
        return error.error, error.traceback
    return (_aborted_with(state.tail), None) if state.exit_code in ABORTED else (None, None)


def _by_signal(code: int) -> bool:
    """Whether an exit status (as Popen gives it, or a shell's 128+N) says a signal ended the process."""
    return code < 0 or 128 < code < 128 + 65


ABORTED = (-signal.SIGABRT, 128 + signal.SIGABRT)  # a C++ exception nothing caught ends the process so
_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']{1,200})'")
_WHAT = re.compile(r"^\s*what\(\):\s*(.+)")


def _aborted_with(tail: list[str]) -> str | None:
    """The C++ exception a rank killed by SIGABRT printed as it ended (gloo's own checks end a rank
    so: "gloo::EnforceNotMet: [enforce fail at pair.cc:446] ... Received data size doesn't match")."""
    for i in range(len(tail) - 1, -1, -1):
        if thrown := _TERMINATE.search(tail[i]):
            what = next((m[1] for line in tail[i + 1:i + 3] if (m := _WHAT.match(line))), "")
            return f"{thrown[1]}: {what}".rstrip(": ")
    return None
