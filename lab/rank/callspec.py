"""Where torch.distributed's functions take what the flight recorder records (``lab.rank.flight``):
the tensor, the group, the peer or root, the tag, the reduce op, what goes to and comes from each
peer (an all_to_all_single's splits, the lists of all_gather, gather, scatter, all_to_all); found once
per function, from its signature, so that each call costs a few lookups. Standard library only: it runs on every host.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab.rank.ops import METHOD, P2P, PER_PEER, ROOTED, SPLIT_SIZES, TO_TARGET

Slot = tuple[int, str, Any]  # an argument: its position, its name, its default


@dataclass(frozen=True, slots=True)
class Spec:
    """Where one function's arguments are (found once, from its signature)."""

    op: str
    p2p: bool = False
    batch: bool = False  # batch_isend_irecv: its isends and irecvs are recorded, not itself
    tensor: Slot | None = None  # the tensor (or list of them: its first) whose shape and dtype are recorded
    group: Slot | None = None
    target: Slot | None = None  # the peer (p2p) or root, a global rank
    group_target: Slot | None = None  # the same as a rank of the group
    tag: Slot | None = None
    reduce_op: Slot | None = None
    extra: bool = False  # any of target, group_target, tag
    # what goes to each peer and what comes from each (lab.rank.ops.PER_PEER): split sizes where ``counts``,
    # else lists of a tensor a peer
    to_peers: Slot | None = None
    from_peers: Slot | None = None
    counts: bool = False


def spec_for(name: str, fn: Callable[..., Any]) -> Spec:
    """The spec of torch.distributed's function ``name`` (``fn``), from its signature."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return Spec(name, p2p=name in P2P)
    slots = {p.name: (i if p.kind is p.POSITIONAL_OR_KEYWORD else 1 << 30, p.name,
                      None if p.default is p.empty else p.default) for i, p in enumerate(params)}
    first = params[0].name if params else ""
    side = "dst" if name in TO_TARGET else "src"
    rooted = name in P2P or name in ROOTED
    extra = {"target": slots.get(side) if rooted else None,
             "group_target": slots.get(f"group_{side}") if rooted else None, "tag": slots.get("tag")}
    # (all_gather's tensor is the one it sends, not the first of its output list: the ranks' may differ)
    tensor = slots.get("tensor") or (slots[first] if first not in ("group", "p2p_op_list", "") else None)
    to_peers, from_peers = PER_PEER.get(name, ("", ""))
    return Spec(name, p2p=name in P2P, batch=name == "batch_isend_irecv", tensor=tensor,
                to_peers=slots.get(to_peers), from_peers=slots.get(from_peers), counts=name in SPLIT_SIZES,
                group=slots.get("group"), reduce_op=slots.get("op"), extra=any(extra.values()), **extra)


NEW_GROUP = Spec("new_group")
INIT_PROCESS_GROUP = Spec("init_process_group")  # (its arguments record nothing: it is on the world)


def method_spec(name: str) -> Spec:
    """The spec of ``ProcessGroup.<name>``, called as ``(group, tensors, ...)``; its send and recv
    take ``(tensors, group rank, tag)``; the options of the others are not looked into."""
    label = METHOD + name
    p2p = name in ("send", "recv")
    return Spec(label, p2p=label in P2P, tensor=(1, "tensors", None), group=(0, "self", None),
                group_target=(2, "rank", None) if p2p else None,
                tag=(3 if p2p else 2, "tag", 0) if label in P2P else None, extra=label in P2P)


def get(args: tuple[Any, ...], kwargs: dict[str, Any], slot: Slot) -> Any:
    """The argument at ``slot`` of a call."""
    index, name, default = slot
    return args[index] if index < len(args) else kwargs.get(name, default)
