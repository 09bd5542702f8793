"""Point to point: who waits for whom, from the sends and receives the ranks are blocked in.

A blocking recv waits for its source; a blocking send for its destination's matching recv (a large
message's send does not return before it is received); a wait() on an isend or irecv likewise; a
recv from any source waits for every other rank. A call that its peer's call matches now (blocked
in it, or posted as an isend or irecv) waits for nobody: it is under way. Three findings: a cycle
of waits (a deadlock), a send and its receive that differ in tag or size, and a wait whose chain
ends at a rank that ended, and a wait on a peer that sends to or receives from a third rank. Pure:
no I/O.
"""
from __future__ import annotations

from lab.core.rankview import Finding, Rank, at, describe, doing, ranks_named, size
from lab.rank.record import Record

P2P = ("send", "recv")
NAMED_WAITS = 8  # waits of a cycle or a chain named one by one in a headline


def _same_tag(a: Record, b: Record) -> bool:
    return a.tag is None or b.tag is None or a.tag == b.tag


def _meets(call: Record, rank: int, other: Record) -> bool:
    """Whether ``other`` (a call of the peer) is the other half of ``call`` (a call of ``rank``)."""
    if call.direction == "recv":
        return other.direction == "send" and other.peer == rank and _same_tag(call, other)
    return other.direction == "recv" and other.peer in (rank, None) and _same_tag(call, other)


def _peers(call: Record, rank: int, ranks: dict[int, Rank]) -> list[Rank]:
    """The ranks a send or receive waits for: its peer, or for a recv from any source every other rank."""
    if call.peer is None:
        return [r for k, r in sorted(ranks.items()) if k != rank]
    return [ranks[call.peer]] if call.peer in ranks and call.peer != rank else []


def blocked(ranks: dict[int, Rank]) -> dict[int, Rank]:
    """The running ranks blocked in a send or receive that no call of a peer of theirs matches now."""
    found = {}
    for k, r in sorted(ranks.items()):
        call = r.position
        if call is None or call.direction not in P2P:
            continue
        if not any(_meets(call, k, other) for peer in _peers(call, k, ranks) for other in peer.pending()):
            found[k] = r
    return found


def _free(ranks: dict[int, Rank]) -> bool:
    """Whether some rank may still send: it computes, or nothing of it was seen."""
    return any(r.outside or (r.running and not r.seen and not r.absent) for r in ranks.values())


def cycle(ranks: dict[int, Rank]) -> Finding | None:
    """Ranks that wait for each other in a cycle, named from its lowest rank: "0 waits for 3, 3 for 2,
    2 for 1, 1 for 0: every rank receives first"."""
    live, free = blocked(ranks), _free(ranks)
    changed = True
    while changed:  # drop every rank whose wait can end: its peer is not (or no longer) blocked
        changed = False
        for k in sorted(live):
            call = live[k].position
            targets = [p.rank for p in _peers(call, k, ranks) if p.rank in live] if call else []
            if not targets or (call is not None and call.peer is None and free):
                del live[k]
                changed = True
    if not live:
        return None
    path, k = [], min(live)
    while k not in path:
        path.append(k)
        call = live[k].position
        k = min(p.rank for p in _peers(call, k, ranks) if p.rank in live) if call is not None else k
    loop = path[path.index(k):]
    loop = loop[loop.index(min(loop)):] + loop[:loop.index(min(loop))]
    names = waits_named(list(zip(loop, loop[1:] + loop[:1])))
    shown = {k: c for k in loop if (c := live[k].position) is not None}
    return _cycle_finding(names, shown, everyone=len(loop) == len(ranks))


def waits_named(pairs: list[tuple[int, int]]) -> str:
    """``0 waits for 3, 3 for 2, 2 for 1``; past NAMED_WAITS waits, the first and last few and how many."""
    said = [f"{a} waits for {b}" if i == 0 else f"{a} for {b}" for i, (a, b) in enumerate(pairs)]
    if len(said) > NAMED_WAITS:
        said = [*said[:3], f"... ({len(said) - 5} more)", *said[-2:]]
    return ", ".join(said)


def _cycle_finding(names: str, shown: dict[int, Record], everyone: bool) -> Finding:
    directions = {c.direction for c in shown.values()}
    who = "both" if len(shown) == 2 else "every rank" if everyone else "each of them"
    if directions == {"recv"}:
        verb = "receive" if who == "both" else "receives"
        return Finding("p2p-cycle", f"{names}: {who} {verb} first",
                       "Let one side send first (even ranks send then receive, odd ranks receive then send), "
                       "or post irecv and isend and wait on both (batch_isend_irecv).", shown)
    if directions == {"send"}:
        verb = "send" if who == "both" else "sends"
        return Finding("p2p-cycle", f"{names}: {who} {verb} first, and a blocking send of a large message "
                       "waits until it is received",
                       "Let one side receive first, or post isend and irecv and wait on both (batch_isend_irecv).",
                       shown)
    return Finding("p2p-cycle", f"{names}: each waits for a call its peer does not make",
                   "Make every send meet its receive: check the dst and src each rank passes.", shown)


def unmatched(ranks: dict[int, Rank]) -> Finding | None:
    """A send or receive, blocked or failed in the backend, whose peer sends or receives with another
    tag or size: its call now, one it posted, or (for a receive) a send it made that was not received."""
    for k, r in sorted(ranks.items()):
        call = r.stuck
        if call is None or call.direction not in P2P or call.peer not in ranks or call.peer == k:
            continue
        peer = ranks[call.peer]
        other = None if peer.outside else _counterpart(call, r, peer)
        if other is None:
            continue
        send, recv = (other, call) if call.direction == "recv" else (call, other)
        sender, receiver = (peer.rank, k) if call.direction == "recv" else (k, peer.rank)
        shown = {sender: send, receiver: recv}
        if not _same_tag(send, recv):
            return Finding("p2p-unmatched", f"Rank {receiver} receives from rank {sender} with tag {recv.tag}, "
                           f"but rank {sender} sends to it with tag {send.tag}{at(send.where)}",
                           "Pass the same tag to a send and to its receive (or no tag to both).", shown)
        if None not in (send.numel, recv.numel) and (send.numel, send.dtype) != (recv.numel, recv.dtype):
            return Finding("p2p-unmatched", f"Rank {receiver} receives {size(recv)} from rank {sender}, "
                           f"but rank {sender} sends {size(send)}{at(send.where)}",
                           "A receive's tensor must have the size and dtype of the tensor sent to it.", shown)
    return None


def crossed(ranks: dict[int, Rank]) -> Finding | None:
    """A blocked send or receive whose peer is blocked in a send or receive with a third rank, which
    waits in a call of its own that does not meet it: "rank 1 receives from rank 0, but rank 0 sends
    to rank 3". (Where the third rank computes, it may still meet it: a wait, not yet a hang.)"""
    live = blocked(ranks)
    for k, r in live.items():
        call = r.position
        peer = ranks.get(call.peer) if call is not None and call.peer is not None else None
        other = peer.position if peer is not None else None
        if call is None or peer is None or other is None or other.direction not in P2P or other.peer in (k, None):
            continue
        third = ranks.get(other.peer) if other.peer is not None else None
        if third is None or not third.running or third.position is None or any(
                _meets(other, peer.rank, c) for c in third.pending()):
            continue
        verb = "receives from" if call.direction == "recv" else "sends to"
        its = "sends to" if other.direction == "send" else "receives from"
        return Finding("p2p-unmatched", f"Rank {k} {verb} rank {peer.rank}{at(call.where)}, but rank {peer.rank} "
                       f"{its} rank {third.rank}{at(other.where)}, which {doing(third)}",
                       "Make every send meet its receive: check the dst and src each rank passes (global ranks).",
                       {k: call, peer.rank: other})
    return None


def _counterpart(call: Record, rank: Rank, peer: Rank) -> Record | None:
    """The peer's call that ``call`` should meet: the one it is in or posted toward ``rank``; for a
    receive, else the peer's first send to it that it did not receive (the last one where the records
    do not both go back to the group's first call, if all the visible ones agree)."""
    opposite = "send" if call.direction == "recv" else "recv"
    for other in [c for c in (peer.stuck,) if c is not None] + peer.pending():
        if other.direction == opposite and (other.peer == rank.rank or (opposite == "recv" and other.peer is None)):
            return other
    if call.direction != "recv":
        return None
    sends = [c for c in peer.calls if c.direction == "send" and c.peer == rank.rank and c.state == "done"]
    received = sum(1 for c in rank.calls if c.direction == "recv" and c.peer == peer.rank and c.state == "done")
    if _whole(peer, call.group) and _whole(rank, call.group):
        return sends[received] if len(sends) > received else None
    return sends[-1] if sends and len({(c.tag, c.numel, c.dtype) for c in sends}) == 1 else None


def _whole(rank: Rank, group: str) -> bool:
    """Whether its point-to-point records of a group go back to the first (none were dropped)."""
    seqs = {c.seq for c in rank.calls if c.group == group and c.direction != "collective"}
    return seqs == set(range(1, max(seqs, default=0) + 1))


def _chain(start: int, live: dict[int, Rank]) -> tuple[list[int], int | None]:
    """The ranks a blocked rank waits for in turn, while each is blocked too, and the rank the chain
    ends at (None: at a recv from any source, or back in the chain: a cycle)."""
    chain: list[int] = []
    end: int | None = start
    while end is not None and end in live and end not in chain:
        chain.append(end)
        call = live[end].position
        end = call.peer if call is not None else None
    return chain, None if end in chain else end


def peer_gone(ranks: dict[int, Rank]) -> Finding | None:
    """A blocked send or receive whose wait ends at a rank that ended, or that is no rank of the job:
    "Rank 2 waits for 1, 1 for 0, but rank 0 exited with status 0"."""
    live = blocked(ranks)
    for k, r in live.items():
        call = r.position
        if call is None:
            continue
        if call.peer is None:
            if all(not p.running for p in _peers(call, k, ranks)) and len(ranks) > 1:
                return Finding("p2p-unmatched", f"Rank {k} waits in {describe(call)}{at(call.where)}, "
                               "but every other rank has ended", _GONE, {k: call})
            continue
        chain, end = _chain(k, live)
        if end is None or (end in ranks and ranks[end].running):
            continue
        if end not in ranks:
            what = f"there is no rank {end}: the job has {ranks_named(ranks)}"
            fix = "A send's dst and a receive's src are global ranks, from 0 to the world size - 1."
        else:
            what, fix = f"rank {end} {doing(ranks[end])}", _GONE
        waits = (f"Rank {k} waits in {describe(call)}{at(call.where)}" if len(chain) == 1 else
                 "Rank " + waits_named(list(zip(chain, [*chain[1:], end]))))
        shown = {c: p for c in chain if (p := ranks[c].position) is not None}
        return Finding("p2p-unmatched", f"{waits}, but {what}", fix, shown)
    return None


_GONE = "Every send needs its receive on the peer, and every receive its send, before either rank ends."


def endpoint(rank: int, live: dict[int, Rank], ranks: dict[int, Rank]) -> list[int]:
    """The ranks a blocked rank (one of ``live``: :func:`blocked`) ends up waiting for, following the
    chain of ranks blocked in turn: the rank the chain ends at, or where it ends at a recv from any
    source, every rank not blocked (a cycle waits for no one outside it)."""
    chain, end = _chain(rank, live)
    last = live[chain[-1]].position
    if end is None and last is not None and last.peer is None:
        return [p.rank for p in _peers(last, chain[-1], ranks) if p.rank not in live]
    return [] if end is None else [end]
