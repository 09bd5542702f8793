"""The process groups as a rank's flight recorder counts its calls on them (``lab.rank.flight``):
each named once, by a name that is the same on every rank, and known again by the process group
object torch gave the program.

The default group is "world". A group that ``new_group`` makes is ``g<its global ranks, sorted,
joined by ,>#<n>``, n the groups of those ranks the rank made before: every rank makes its groups in
the same order, so the n-th is the same group on every rank (:meth:`Groups.new_group`, the name
given before torch makes it: its members are in a call while it forms). Any other group torch knows
(``split_group``'s, a DeviceMesh's) is ``g<ranks>@<its torch group name>``, named the first time a
call is made on it or torch's own recorder names it (:meth:`Groups.of`).

A process group is known by its id while it lives (a weak reference: once it is freed another may
come at its address) and by torch's name for it, which is how torch's recorder names the group of
each of its entries (:meth:`Groups.by_torch_name`, read by ``lab.rank.torchcalls``). At most
GROUPS_MAX groups are kept, with each one's sequence numbers and the calls it completed per op (the
oldest other than the world's go first).

Standard library only: torch.distributed's ``distributed_c10d`` is given (:meth:`Groups.bind`) and
asked the ranks and names of the groups, so the naming is tested with made-up process groups.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any

GROUPS_MAX = 256  # groups whose counts are kept
MADE_MAX = GROUPS_MAX * 16  # sets of ranks whose groups made are counted (a set seen before is counted past it)


class Group:
    """One process group as this rank counts its calls."""

    __slots__ = ("gid", "label", "collectives", "p2p", "counts")

    def __init__(self, gid: str) -> None:
        self.gid, self.collectives, self.p2p = gid, 0, 0  # (the latter two: the last seq of each kind)
        self.label = gid.encode()  # (as the page of the call in flight takes it: lab.rank.lastcall)
        self.counts: dict[str, int] = {}  # op -> calls completed


class Groups:
    """This rank's process groups, by the recorder's name for each."""

    def __init__(self) -> None:
        self.world = Group("world")
        self.by_gid: dict[str, Group] = {"world": self.world}
        self.by_group: dict[int, tuple[weakref.ref[Any], Group]] = {}  # id(ProcessGroup) -> its Group
        self.by_name: dict[str, Group] = {}  # torch's name for a group -> its Group
        self.made: dict[tuple[int, ...], int] = {}  # a new group's ranks -> groups of them made before
        self.c10d: Any = None

    def bind(self, c10d: Any) -> None:
        """Ask ``c10d`` (torch.distributed's ``distributed_c10d``) about the groups from now on."""
        self.c10d = c10d

    def of(self, pg: Any) -> Group | None:
        """The Group of process group ``pg`` (None: this rank is not in it)."""
        if pg is None:
            return self.world
        entry = self.by_group.get(id(pg))
        if entry is not None and entry[0]() is pg:
            return entry[1]
        if isinstance(pg, int):  # GroupMember.NON_GROUP_MEMBER: the call does nothing here
            return None
        if pg is self.c10d.GroupMember.WORLD:
            group = self.world
        else:
            try:
                ranks = self.c10d.get_process_group_ranks(pg)
                group = self._group(f"g{','.join(map(str, sorted(ranks)))}@{pg.group_name}")
            except Exception:  # no group torch knows: the call will say so
                return self._group("g?")
        self.remember(pg, group)
        return group

    def new_group(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Group, tuple[int, ...], bool] | None:
        """The Group that ``new_group(*args, **kwargs)`` makes, its members (global ranks, sorted) and
        whether this rank is one of them; None when not known (the world not formed yet)."""
        try:
            ranks = args[0] if args else kwargs.get("ranks")
            ranks = tuple(sorted(ranks)) if ranks else tuple(range(self.c10d.get_world_size()))
            member = self.c10d.get_rank() in ranks
        except Exception:  # torch says what is wrong
            return None
        made = self.made.get(ranks, 0)
        if len(self.made) < MADE_MAX or ranks in self.made:
            self.made[ranks] = made + 1
        return self._group(f"g{','.join(map(str, ranks))}#{made}"), ranks, member

    def remember(self, pg: Any, group: Group) -> None:
        """Process group ``pg`` is ``group``, by its id while it lives and by torch's name for it."""
        with contextlib.suppress(Exception):  # (a group torch names: its entries in torch's recorder)
            self.by_name[str(pg.group_name)] = group
        key = id(pg)
        try:  # (once pg is freed, another group may come at its address)
            ref = weakref.ref(pg, lambda _: self.by_group.pop(key, None))
        except TypeError:  # (not a ProcessGroup: the call will say so)
            return
        self.by_group[key] = (ref, group)

    def remember_world(self) -> None:
        """The default process group ``init_process_group`` made is the world (its name in torch's
        recorder known before any teardown)."""
        with contextlib.suppress(Exception):
            self.remember(self.c10d._get_default_group(), self.world)

    def by_torch_name(self) -> dict[str, Group]:
        """The groups by torch's name for them, the world's and any torch made that the program has not
        used yet (a DeviceMesh's) included."""
        with contextlib.suppress(Exception):
            for pg, name in list(self.c10d._world.pg_names.items()):
                if str(name) not in self.by_name:
                    self.of(pg)
        return self.by_name

    def ranks_by_name(self) -> dict[str, list[int]]:
        """Every process group's global ranks, by torch's name for it."""
        found: dict[str, list[int]] = {}
        with contextlib.suppress(Exception):
            for pg, name in list(self.c10d._world.pg_names.items()):
                found[str(name)] = sorted(self.c10d.get_process_group_ranks(pg))
        return found

    def counts(self) -> dict[str, dict[str, int]]:
        """The calls each group completed, per op (the groups that completed any)."""
        return {group.gid: dict(group.counts) for group in list(self.by_gid.values()) if group.counts}

    def _group(self, gid: str) -> Group:
        group = self.by_gid.get(gid)
        if group is None:
            group = self.by_gid[gid] = Group(gid)
            if len(self.by_gid) > GROUPS_MAX:  # the oldest other than the world's go
                del self.by_gid[next(g for g in self.by_gid if g != "world")]
        return group
