"""The flight recorder proper: the torch.distributed calls this rank makes, kept within bounds, so
that the controller can say why ranks hang or fail from what every rank was doing.

Runs on every host: the standard library, and torch once :meth:`Flight.bind` is called by
``lab.rank.calls.install``, whose wrappers (one set, for this and for the method check) call
:meth:`Flight.begin` and :meth:`Flight.ended` around each call the program makes, with where its
function takes what is recorded (``lab.rank.callspec``). A call torch makes inside another
(the sends inside ``send_object_list``) is not recorded again; the isends and irecvs
of ``batch_isend_irecv`` are, each on its own (their peers and waits matter), and it is not.
``new_group`` is recorded on the group it makes, by its members (the group connects them); and as
one of the groups the rank made (``made``: every rank must make every group, members or not, in the
same order, for torch names a group by how many the rank made before it; a ``new_group`` with
``use_local_synchronization=True`` is named by its ranks and is not counted), and
``init_process_group`` on the world (:meth:`Flight.wrap_init`: a rank in the rendezvous is in a
call); ``destroy_process_group`` is no call (nothing is exchanged), but where the program tore the
world down is kept (``destroyed``: a rank that did so and returned early leaves the others
waiting). A call on a group this rank is not in does nothing and is not recorded.

The recorder is four parts, each the one keeper of its own state:

* this one, the records of the program's calls: begun, ended or raised, async and not yet waited
  (a Work's calls), in a Work's wait, in a ``batch_isend_irecv``; and a DDP program's steps. It
  starts no thread: each call is recorded by the thread that makes it, and the async calls whose
  Work completed unwaited are found done when the watcher asks (:meth:`Flight.poll`);
* the groups (``lab.rank.groups``): each process group's name, the same on every rank, its
  sequence numbers and its counts;
* torch's calls (``lab.rank.torchcalls``): what reaches the backend without these functions (DDP's
  reducer in C++, the functional collectives), read from torch's own flight recorder and recorded
  as torch's (``by``), numbered among the group's collectives where it came; a rank whose main
  thread waits in one is in a call;
* the watcher (``lab.rank.watcher``): the thread that looks at the calls in flight and the rank's
  connections and sends the ``progress``, ``flight`` and ``trace`` events, and the last dump.

A record (:func:`to_json`) is one of ``lab.rank.record``'s schema, which says what each field holds.
Its ``where`` is the user's frame (the first outside torch and the lab), and an async call whose Work
completes without a wait is "done" when the recorder sees it (``t1`` then).

Bounded whatever the program does: the last RING_MAX records, the async calls not yet waited (at
most ASYNC_MAX: the oldest are let go of, and counted), per group (at most
``lab.rank.groups.GROUPS_MAX``) the calls completed per op (``counts``: done, not raised). Per call
only objects are kept (the shape, the dtype, the code and offset of the user's frame); they become
text when a dump is sent.

A program that made a DDP model also has its training steps kept (``steps``, the last STEPS_MAX):
each forward of a DDP model and each backward pass, as ``[n, "forward" or "backward", sync, where]``
(``n`` counts them from 1; ``sync``: whether a forward syncs the gradients, False under
``no_sync()``; ``where`` the user's line), so that where ranks part ways in their steps (a rank that
skips a backward, or syncs on another schedule) can be told though DDP's collectives are issued from
C++. The groups it made are kept too (``made``, the first MADE_KEPT since the world formed): each
as ``[n, members, where]`` (``n`` counts them from 1; ``members`` the group's global ranks, sorted),
so that where ranks made different groups, or the same in another order, can be told (a group of
more than ``lab.rank.flightrecords.MEMBERS_MAX`` ranks is not kept), and the timeouts the program gave
them (``timeouts``, ``[group, seconds, where]`` each: ``init_process_group``'s for the world,
``new_group``'s on its members), so that a rank that timed out can be told where its timeout was set.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, TypeAlias

from lab.rank import lastcall
from lab.rank.callspec import INIT_PROCESS_GROUP, NEW_GROUP, Spec, get
from lab.rank.flightrecords import MEMBERS_MAX
from lab.rank.groups import Group, Groups
from lab.rank.labfiles import LAB_DIRS
from lab.rank.record import SPLITS_MAX, Record, to_wire

RING_MAX = 64  # records of the last calls kept
STEPS_MAX = 128  # a DDP program's last forwards and backward passes kept
MADE_KEPT = 64  # the groups a rank made that are kept: its first since the world formed
ASYNC_MAX = 256  # async calls not yet waited kept; the oldest past it are dropped and counted
ERROR_MAX = 500  # characters of a call's error kept
WALK_MAX = 64  # frames looked at to find the user's

_now = time.time


# A record as kept: a list (the cheapest thing to make, once per call), its fields at these places
# (CODE and LASTI: the user's frame's; DUMPED: a dump was sent while the call blocked; BY: who issued
# a collective the program did not call itself, "DDP's gradient"; RETURNED: when the call returned,
# its Work if async; WORLD: the world_size init_process_group was given;
# CALLER: for a collective torch issued, the program's frame that led to the user's, in another file;
# SPLITS: what the call sends each peer and takes from each: an all_to_all_single's input and output
# split sizes as the program gave them (rows), the elements of each tensor of a list a tensor a peer).
(SEQ, GROUP, OP, SHAPE, DTYPE, PEER, ROOT, TAG, REDUCE_OP, ASYNC, CODE, LASTI, STATE, ERROR, T0, T1,
 DUMPED, BY, RETURNED, WORLD, CALLER, SPLITS) = range(22)
Call: TypeAlias = "list[Any]"


def to_json(call: list[Any]) -> dict[str, Any]:
    """A record as the events carry it (``lab.rank.record``'s schema)."""
    shape = _shape(call[SHAPE])
    splits = call[SPLITS] or (None, None)
    return to_wire(Record(
        call[SEQ], call[GROUP].gid, call[OP], call[STATE], call[T0], call[T1],
        None if shape is None else math.prod(shape), None if shape is None else tuple(shape),
        None if call[DTYPE] is None else str(call[DTYPE]).removeprefix("torch."), _rank(call[PEER]),
        _rank(call[ROOT]), _rank(call[TAG]), _op_name(call[REDUCE_OP]), call[ASYNC], _where(call[CODE], call[LASTI]),
        call[ERROR], call[BY], call[WORLD], call[CALLER], *splits))


def _shape(shape: Any) -> list[int] | None:
    try:
        return None if shape is None else [int(n) for n in shape]
    except (TypeError, ValueError):
        return None


def _numels(value: Any) -> tuple[int, ...] | None:
    """The elements of each tensor of a list that holds one a peer; None: no list (a gather's off its
    root), or not one of tensors."""
    try:
        found = tuple(int(t.numel()) for t in value) if value and len(value) <= SPLITS_MAX else None
    except Exception:  # (whatever the program passed: its call goes on as torch takes it)
        return None
    return found if found and all(n >= 0 for n in found) else None


def _splits(value: Any) -> tuple[int, ...] | None:
    """Split sizes as the program gave them (a list of ints, or a tensor of them); None: not given, or not
    of whole numbers (torch says what is wrong)."""
    try:
        found = tuple(int(n) for n in value) if value is not None and len(value) <= SPLITS_MAX else None
    except Exception:  # (whatever the program passed: its call goes on as torch takes it)
        return None
    return found if found and all(n >= 0 for n in found) else None


def _rank(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _op_name(op: Any) -> str | None:
    if op is None:
        return None
    name = getattr(op, "name", None)
    return name if isinstance(name, str) else str(op).rsplit(".", 1)[-1][:40]


def _where(code: CodeType | None, lasti: int) -> str:
    """``file.py:LINE`` of the instruction at ``lasti`` (the lab's own files as ``lab/...``); "" when
    no frame was found."""
    if code is None:
        return ""
    line = next((n for start, end, n in code.co_lines() if start <= lasti < end and n is not None),
                code.co_firstlineno)
    path = code.co_filename
    lab = next((folder for folder in LAB_DIRS if path.startswith(folder)), None)
    name = "lab/" + path[len(lab):] if lab is not None else os.path.basename(path)
    return f"{name}:{line}"


def is_count(value: Any) -> bool:
    """Whether ``value`` is a count: an int (not a bool), 0 or more."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _memo(memo: dict[Any, bytes], key: Any, make: Callable[[], bytes]) -> bytes:
    """``memo[key]``, made and kept (while the memo has room) the first time."""
    try:
        found = memo.get(key)
    except TypeError:  # (a program's unhashable dtype)
        return make()
    if found is None:
        found = make()
        if len(memo) < lastcall.WHERE_MEMO:
            memo[key] = found
    return found


def call_error(exc: BaseException) -> str:
    """The error of a call that raised ``exc``, as its record keeps it."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_MAX]


class _Batch(threading.local):
    """A thread's own: the calls of the ``batch_isend_irecv`` it is in."""

    batch: list[Call] | None = None


class Flight:
    """This process's recorder of the program's calls (one: :data:`FLIGHT`), on ``groups``."""

    def __init__(self, groups: Groups) -> None:
        self.groups = groups
        self.world = groups.world  # (the two that begin takes, looked up once: every call counts)
        self.group_of = groups.of
        self.ring: deque[Call] = deque(maxlen=RING_MAX)
        self.waiting: dict[int, tuple[Call, float]] = {}  # thread -> the call whose Work it waits on, since when
        self.pending: dict[int, tuple[Any, list[Call]]] = {}  # id(Work) -> it, its calls (async, not waited)
        self.pending_calls = 0
        self.completed = 0  # by the threads that made the calls (blocking ones)
        self.completed_async = 0  # async calls, seen done by a wait or a poll (under lock)
        self.dropped = 0
        self.begun = 0  # the calls recorded so far
        self.lock = threading.Lock()
        self.local = _Batch()
        self.internal: tuple[str, ...] = (*LAB_DIRS, "<frozen ")  # frames that are not the user's
        self.torch_dir = "\0"
        self.user_code: CodeType | None = None  # the code of the last call's caller, if the user's
        self.work_class: Any = type(None)
        self.waits_seen = False  # Work.wait is wrapped
        self.c10d: Any = None
        self.changed_at = -math.inf  # when (time.time) the newest call ended
        self.store_ports: set[int] = set()  # a tcp:// rendezvous' port (MASTER_PORT's is read as it is)
        self.ddp = False  # the program made a DistributedDataParallel: the C++ collectives are its reducer's
        # the page the call in flight is kept on for the rank's relay (lab.rank.lastcall), what it takes of
        # the user's frames and the dtypes, as bytes
        self.page: lastcall.Page | None = None
        self.where_bytes: dict[tuple[CodeType | None, int], bytes] = {}
        self.dtype_bytes: dict[Any, bytes] = {}
        # the training steps of a program that made a DDP model, as its forwards and backward passes came
        # (number, "forward" or "backward", whether a forward syncs the gradients, the user's code and offset)
        self.steps: deque[tuple[int, str, bool | None, CodeType | None, int]] = deque(maxlen=STEPS_MAX)
        self.steps_made = 0
        # the groups the program made since the world formed (its first MADE_KEPT), as new_group was called
        # on this rank, a member of them or not: (members, the user's code and offset)
        self.made: list[tuple[tuple[int, ...], CodeType | None, int]] = []
        # where the program's own code destroyed the world (destroy_process_group), since it formed
        self.destroyed: tuple[CodeType | None, int] | None = None
        # the timeouts the program gave its groups since the world formed (init_process_group's for the
        # world, new_group's; the first MADE_KEPT): the group's id -> (seconds, the user's code and offset)
        self.timeouts: dict[str, tuple[float, CodeType | None, int]] = {}

    def bind(self) -> None:
        """Take what the recording needs from torch (imported by now), for the groups too."""
        import torch
        import torch.distributed.distributed_c10d as c10d

        self.torch_dir = os.path.dirname(torch.__file__) + os.sep
        self.internal = (self.torch_dir, *LAB_DIRS, "<frozen ")
        self.work_class, self.c10d = c10d.Work, c10d
        self.groups.bind(c10d)
        self.page = lastcall.PAGE
        ddp = torch.nn.parallel.DistributedDataParallel
        made = ddp.__init__

        forward: Callable[..., Any] = ddp.forward
        backward: Callable[..., Any] = torch.autograd.backward

        @functools.wraps(made)
        def init(*args: Any, **kwargs: Any) -> None:
            self.ddp = True
            made(*args, **kwargs)

        @functools.wraps(forward)
        def forward_step(module: Any, *args: Any, **kwargs: Any) -> Any:
            self.step("forward", sys._getframe(1), getattr(module, "require_backward_grad_sync", True) is not False)
            return forward(module, *args, **kwargs)

        @functools.wraps(backward)
        def backward_step(*args: Any, **kwargs: Any) -> Any:
            if self.ddp:
                self.step("backward", sys._getframe(1), None)
            return backward(*args, **kwargs)

        with contextlib.suppress(AttributeError, TypeError):
            ddp.__init__ = init  # type: ignore[method-assign]
            setattr(ddp, "forward", forward_step)  # noqa: B010 (a method of torch's, typed otherwise)
            setattr(torch.autograd, "backward", backward_step)  # noqa: B010

    # -- recording (the program's threads) -----------------------------------------------------

    def step(self, kind: str, frame: FrameType, sync: bool | None) -> None:
        """A DDP model's forward (``sync``: False under ``no_sync()``) or a backward pass begins."""
        self.steps_made += 1
        self.steps.append((self.steps_made, kind, sync, *self.user_frame(frame)))

    def begin(self, spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any], frame: FrameType,
              group: Group | None = None) -> Call | None:
        """A call starts, on ``group`` or the one its arguments name (None: it is not recorded, being
        on a group this rank is not in). Only what costs nothing is done here: the record keeps
        objects (the shape, the dtype, the code and offset of the user's frame) that become text
        when a dump is sent."""
        if group is None:
            slot = spec.group
            pg = None if slot is None else args[slot[0]] if slot[0] < len(args) else kwargs.get(slot[1])
            group = self.world if pg is None else self.group_of(pg)
            if group is None:
                return None
        code: CodeType | None = frame.f_code
        if code is self.user_code:  # (the caller of the last call: a loop's)
            lasti = frame.f_lasti
        elif frame.f_code.co_filename.startswith(self.internal):
            code, lasti = self.user_frame(frame)
        else:
            self.user_code, lasti = code, frame.f_lasti
        slot = spec.tensor
        tensor = None if slot is None else args[slot[0]] if slot[0] < len(args) else kwargs.get(slot[1])
        if tensor.__class__ is list or tensor.__class__ is tuple:
            tensor = tensor[0] if tensor else None
        slot = spec.reduce_op
        reduce_op = None if slot is None else args[slot[0]] if slot[0] < len(args) else kwargs.get(slot[1], slot[2])
        if spec.p2p:
            group.p2p += 1
            seq = group.p2p
        else:
            group.collectives += 1
            seq = group.collectives
        call = [seq, group, spec.op, getattr(tensor, "shape", None), getattr(tensor, "dtype", None), None, None,
                None, reduce_op, False, code, lasti, "in_flight", None, _now(), None, False, None, None, None, None,
                None]
        if spec.extra:
            self._extra(call, spec, args, kwargs)
        if spec.to_peers is not None or spec.from_peers is not None:  # (copied now: the program may change its
            read = _splits if spec.counts else _numels  # lists once the call returns)
            call[SPLITS] = (None if spec.to_peers is None else read(get(args, kwargs, spec.to_peers)),
                            None if spec.from_peers is None else read(get(args, kwargs, spec.from_peers)))
        if self.page is not None:
            self._on_page(call)
        self.ring.append(call)
        self.begun += 1
        return call

    def _on_page(self, call: Call) -> None:
        """Keep the call that begins where the rank's relay reads it if the rank dies in it."""
        page = self.page
        assert page is not None
        code, lasti, dtype = call[CODE], call[LASTI], call[DTYPE]
        where = _memo(self.where_bytes, (code, lasti), lambda: _where(code, lasti).encode())
        kind = b"" if dtype is None else _memo(self.dtype_bytes, dtype,
                                              lambda: str(dtype).removeprefix("torch.").encode())
        page.begin(call, call[SEQ], call[T0], call[PEER], call[ROOT], call[SHAPE], call[OP].encode(), kind,
                   call[GROUP].label, where)

    def _extra(self, call: Call, spec: Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The call's tag, and peer or root as a global rank (given as a rank of its group: translated)."""
        if spec.tag is not None:
            call[TAG] = get(args, kwargs, spec.tag)
        target = None if spec.target is None else get(args, kwargs, spec.target)
        if target is None and spec.group_target is not None:
            in_group = get(args, kwargs, spec.group_target)
            group = get(args, kwargs, spec.group) if spec.group is not None else None
            try:
                target = in_group if group is None or in_group is None else self.c10d.get_global_rank(group, in_group)
            except Exception:  # torch says what is wrong with the call; the record says what is known
                target = None
        call[PEER if spec.p2p else ROOT] = target

    def user_frame(self, frame: FrameType | None) -> tuple[CodeType | None, int]:
        """The first frame outside torch and the lab (else the first outside torch: the lab's own call)."""
        internal, first = self.internal, None
        for _ in range(WALK_MAX):
            if frame is None:
                break
            code = frame.f_code
            if not code.co_filename.startswith(internal):
                return code, frame.f_lasti
            if first is None and not code.co_filename.startswith((self.torch_dir, "<frozen ")):
                first = (code, frame.f_lasti)
            frame = frame.f_back
        return first or (None, 0)

    def user_line(self, frame: FrameType | None) -> str:
        """``file.py:LINE`` of the first frame outside torch and the lab (:meth:`user_frame`)."""
        return _where(*self.user_frame(frame))

    def caller(self, frame: FrameType | None, code: CodeType | None) -> str | None:
        """``file.py:LINE`` of the first of the program's frames outside the file of ``code`` (the
        user's frame) that led to it: where a project's training loop called its own module's step."""
        if code is None:
            return None
        for _ in range(WALK_MAX):
            if frame is None:
                return None
            other = frame.f_code
            if not other.co_filename.startswith(self.internal) and other.co_filename != code.co_filename \
                    and other.co_filename[:1] != "<":
                return _where(other, frame.f_lasti)
            frame = frame.f_back
        return None

    def ended(self, call: Call, result: Any) -> None:
        """The call returned ``result``: done, or (a Work) async and in flight until waited."""
        if result is None or not isinstance(result, self.work_class):
            call[T1] = call[RETURNED] = self.changed_at = time.time()
            call[STATE] = "done"
            self.completed += 1
            counts = call[GROUP].counts
            counts[call[OP]] = counts.get(call[OP], 0) + 1
            if self.page is not None:
                self.page.ended(call)
            return
        call[ASYNC], call[RETURNED] = True, time.time()
        if self.page is not None:
            self.page.returned_async(call)
        batch = self.local.batch
        if batch is not None:  # (its Work is paired with it when the batch returns)
            batch.append(call)
        else:
            self._pend(result, [call])

    def failed(self, call: Call | None, exc: BaseException) -> None:
        """The call raised ``exc``."""
        if call is not None:
            call[ERROR], call[T1], call[STATE] = call_error(exc), time.time(), "raised"
            self.changed_at = call[RETURNED] = call[T1]
            self.completed += 1
            if self.page is not None:
                self.page.ended(call)

    def _pend(self, work: Any, calls: list[Call]) -> None:
        if not self.waits_seen:
            self._see_waits()
        with self.lock:
            self.pending[id(work)] = (work, calls)
            self.pending_calls += len(calls)
            while self.pending_calls > ASYNC_MAX:
                self.dropped += len(self._unpend(next(iter(self.pending))))

    def _unpend(self, key: int) -> list[Call]:
        """Take Work ``key``'s calls out of the pending ones (under the lock)."""
        calls = self.pending.pop(key)[1]
        self.pending_calls -= len(calls)
        return calls

    def _settle(self, calls: list[Call], error: str | None) -> None:
        """Async calls ended (under the lock)."""
        t1 = self.changed_at = time.time()
        for call in calls:
            call[ERROR], call[T1], call[STATE] = error, t1, "done" if error is None else "raised"
            if self.page is not None:
                self.page.ended(call)
            if error is None:
                counts = call[GROUP].counts
                counts[call[OP]] = counts.get(call[OP], 0) + 1
        self.completed_async += len(calls)

    def poll(self) -> None:
        """Async calls whose Work completed without a wait are done (or raised)."""
        with self.lock:
            entries = list(self.pending.items())
        for key, (work, calls) in entries:
            try:
                if not work.is_completed():
                    continue
                exc = work.exception()
            except Exception:  # a Work that cannot say: it stays in flight until waited
                continue
            with self.lock:
                if self.pending.get(key, (None,))[0] is work:
                    self._unpend(key)
                    self._settle(calls, None if exc is None else call_error(exc))

    def blocking(self) -> list[tuple[Call, float]]:
        """The calls the rank's threads block in, and since when: a call under way (the newest record of
        its thread, in the ring) or a Work's wait."""
        running = [(call, call[T0]) for call in list(self.ring) if call[STATE] == "in_flight" and not call[ASYNC]]
        return running + list(self.waiting.values())

    def not_waited(self) -> tuple[list[Call], int]:
        """The async calls not yet waited (nor seen done), and how many of them were let go of."""
        with self.lock:
            return [call for _, calls in self.pending.values() for call in calls], self.dropped

    def steps_to_json(self) -> list[list[Any]]:
        """The training steps kept, as a ``flight`` dump carries them."""
        return [[n, kind, sync, _where(code, lasti)] for n, kind, sync, code, lasti in list(self.steps)]

    def made_to_json(self) -> list[list[Any]]:
        """The groups made that are kept, as a ``flight`` dump carries them."""
        return [[n, list(members), _where(code, lasti)] for n, (members, code, lasti) in enumerate(self.made[:], 1)]

    def destroyed_to_json(self) -> str | None:
        """Where the program destroyed the world, as a ``flight`` dump carries it (None: it has not)."""
        return None if self.destroyed is None else _where(*self.destroyed)

    def timeouts_to_json(self) -> list[list[Any]]:
        """The timeouts the program gave its groups, as a ``flight`` dump carries them."""
        return [[group, seconds, _where(code, lasti)] for group, (seconds, code, lasti) in list(self.timeouts.items())]

    def _given_timeout(self, group: Group, timeout: Any, frame: FrameType) -> None:
        """``timeout`` (a timedelta, if the program gave one) is ``group``'s, given at ``frame``."""
        try:
            seconds = float(timeout.total_seconds())
        except Exception:  # (none given, or not a timedelta: torch says what is wrong)
            return
        if math.isfinite(seconds) and seconds > 0 and len(self.timeouts) < MADE_KEPT:
            self.timeouts[group.gid] = (seconds, *self.user_frame(frame))

    # -- the functions that make groups, and unmake the world -------------------------------------

    def wrap_new_group(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``new_group`` recorded on the group it makes, by its members (their group connects them), and
        counted among the groups this rank made (a member or not; not one named by its ranks, made with
        ``use_local_synchronization=True``); the group it returns known by its id."""
        groups = self.groups

        @functools.wraps(fn)
        def new_group(*args: Any, **kwargs: Any) -> Any:
            made = groups.new_group(args, kwargs)
            call = None
            if made is not None:
                frame = sys._getframe(1)
                local = kwargs.get("use_local_synchronization", len(args) > 4 and args[4]) is True
                if not local and len(self.made) < MADE_KEPT and len(made[1]) <= MEMBERS_MAX:
                    self.made.append((made[1], *self.user_frame(frame)))
                if made[2]:  # (a member: the group's calls and timeout are its own)
                    self._given_timeout(made[0], kwargs.get("timeout", args[1] if len(args) > 1 else None), frame)
                    call = self.begin(NEW_GROUP, (), {}, frame, made[0])
            pg = self._blocking(call, fn, args, kwargs)
            if made is not None and not isinstance(pg, int):
                groups.remember(pg, made[0])
            return pg

        return new_group

    def wrap_destroy(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``destroy_process_group`` of the world: where the program's own code called it is kept
        (not the lab's: an exercise's stages end with the lab's own)."""

        @functools.wraps(fn)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            group = args[0] if args else kwargs.get("group")
            if group is None or group is self.c10d.GroupMember.WORLD:
                code, lasti = self.user_frame(sys._getframe(1))
                if code is not None and not code.co_filename.startswith(LAB_DIRS):
                    self.destroyed = (code, lasti)
            return fn(*args, **kwargs)

        return destroy_process_group

    def wrap_init(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``init_process_group`` recorded as a collective of the world (the recorder's own: torch has
        none before it returns), so that a rank waiting in the rendezvous is in a call. Every rank
        makes it first: the world's collective 1 on every rank, and after ``destroy_process_group``
        a new one is again the same call on every rank that tore the world down alike."""

        @functools.wraps(fn)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
            if isinstance(init_method, str) and init_method.startswith("tcp://"):
                with contextlib.suppress(ValueError):
                    self.store_ports.add(urllib.parse.urlsplit(init_method).port or 0)
            self.made.clear()  # (a new world: torch counts its groups from none again)
            self.destroyed = None
            self.timeouts.clear()
            frame = sys._getframe(1)
            self._given_timeout(self.world, kwargs.get("timeout", args[2] if len(args) > 2 else None), frame)
            call = self.begin(INIT_PROCESS_GROUP, (), {}, frame, self.world)
            if call is not None:  # (one the program gives, not the environment's: it may disagree with the launcher)
                size = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
                call[WORLD] = size if is_count(size) and size > 0 else None
            result = self._blocking(call, fn, args, kwargs)
            self.groups.remember_world()
            return result

        return init_process_group

    def _blocking(self, call: Call | None, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)``, a blocking call recorded as ``call`` (None: not recorded)."""
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self.failed(call, exc)
            raise
        if call is not None:
            self.ended(call, None)
        return result

    # -- waits and batches ---------------------------------------------------------------------

    def _see_waits(self) -> None:
        """Wrap ``Work.wait`` (on the class), once the program made an async call: until then, a
        program pays nothing for the waits torch makes inside its blocking calls."""
        self.waits_seen = True
        try:
            self.work_class.wait = self.wrap_wait(self.work_class.wait)
        except (AttributeError, TypeError):  # a torch whose Work takes no new attributes: waits unseen
            pass

    def wrap_wait(self, wait: Callable[..., Any]) -> Callable[..., Any]:
        """``Work.wait``: a Work's async calls are "waiting" while it waits."""

        @functools.wraps(wait)
        def wrapper(work: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.pending:  # (torch's own waits, inside the calls: the usual case)
                return wait(work, *args, **kwargs)
            with self.lock:
                entry = self.pending.get(id(work))
                calls = self._unpend(id(work)) if entry is not None and entry[0] is work else None
            if calls is None:
                return wait(work, *args, **kwargs)
            return self._wait(wait, work, calls, args, kwargs)

        return wrapper

    def _wait(self, wait: Callable[..., Any], work: Any, calls: list[Call], args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        for call in calls:
            call[STATE] = "waiting"
        thread = threading.get_ident()
        outer = self.waiting.get(thread)
        self.waiting[thread] = (calls[0], time.time())
        try:
            result = wait(work, *args, **kwargs)
        except BaseException as exc:
            with self.lock:
                self._settle(calls, call_error(exc))
            raise
        finally:
            if outer is None:
                self.waiting.pop(thread, None)
            else:
                self.waiting[thread] = outer
        if result is False:  # (a wait with a timeout that ran out: still in flight)
            for call in calls:
                call[STATE] = "in_flight"
            self._pend(work, calls)
        else:
            with self.lock:
                self._settle(calls, None)
        return result

    def begin_batch(self) -> None:
        """A ``batch_isend_irecv`` starts: its isends and irecvs are recorded as the program's."""
        self.local.batch = []

    def end_batch(self, works: Any) -> None:
        """It returned ``works`` (None: it raised): one per call, or (a backend that coalesces) one for all."""
        calls, self.local.batch = self.local.batch, None
        works = [w for w in works if isinstance(w, self.work_class)] if isinstance(works, list) else []
        if not calls or not works:
            return
        if len(works) == len(calls):
            for work, call in zip(works, calls):
                self._pend(work, [call])
        else:
            self._pend(works[-1], calls)


FLIGHT = Flight(Groups())
