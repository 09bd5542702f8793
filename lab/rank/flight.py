"""The flight recorder: the torch.distributed calls this rank makes, kept within bounds, so that the
controller can say why ranks hang or fail from what every rank was doing.

Runs on every host: the standard library, and torch once :meth:`Flight.bind` is called by
``lab.rank.calls.install``, whose wrappers (one set, for this and for the method check) call
:meth:`Flight.begin` and :meth:`Flight.ended` around each call the program makes, with where its
function takes what is recorded (``lab.rank.callspec``). A call torch makes inside another
(the sends inside ``send_object_list``) is not recorded again; the isends and irecvs
of ``batch_isend_irecv`` are, each on its own (their peers and waits matter), and it is not.
``new_group`` is recorded on the group it makes, by its members (the group connects them), and
``init_process_group`` on the world (:meth:`Flight.wrap_init`: a rank in the rendezvous is in a
call); ``destroy_process_group`` is not recorded (nothing is exchanged). A call on a group this
rank is not in does nothing and is not recorded. What reaches the backend without these functions
(DDP's reducer in C++, the functional collectives) is read from torch's own flight recorder
(:meth:`Flight.read_torch`, lab.rank.torchfr) and recorded as torch's (``by``), numbered among the
group's collectives where it came; a rank whose main thread waits in one is in a call.

A record (:func:`to_json`) is one of ``lab.rank.record``'s schema, which says what each field holds.
Its ``where`` is the user's frame (the first outside torch and the lab), and an async call whose Work
completes without a wait is "done" when the recorder sees it (``t1`` then).

Bounded whatever the program does: the last RING_MAX records, the async calls not yet waited (at
most ASYNC_MAX: the oldest are let go of, and counted), per group (at most GROUPS_MAX) the calls
completed per op (``counts``: done, not raised). Per call only objects are kept (the shape, the
dtype, the code and offset of the user's frame); they become text when a dump is sent.

A daemon thread sends on the rank's channel (``lab.rank.protocol.CHANNEL``) ``progress`` {rank,
completed, inflight, moved, quiet}: the calls completed (or raised) so far, the blocking call the
rank is in (the oldest, if several threads are) and, while one is, the bytes the process's TCP
connections carried (``lab.rank.tcpinfo.traffic``; the rendezvous stores' connections left out:
polling them is no progress) and for how many seconds (on the rank's own clock) none of that
changed; when it is news and when to look next is the rule of quiet's (``lab.rank.quiet``), which
the thread only feeds and obeys. Once per blocking call in flight FLIGHT_AFTER
seconds, right after the progress that says a call has been quiet for --hang-after, and at the end
(:meth:`Flight.finish`: the worker's "done", atexit), a ``flight`` dump {rank, records, inflight,
counts, dropped, [steps]} that fits an event line (the oldest records go first; ``dropped`` counts
the calls left out). Dumps but the last stop after FLIGHT_BUDGET bytes, so that a program with many
slow calls is not cut off for sending too much.

A program that made a DDP model also has its training steps kept (``steps``, the last STEPS_MAX):
each forward of a DDP model and each backward pass, as ``[n, "forward" or "backward", sync, where]``
(``n`` counts them from 1; ``sync``: whether a forward syncs the gradients, False under
``no_sync()``; ``where`` the user's line), so that where ranks part ways in their steps (a rank that
skips a backward, or syncs on another schedule) can be told though DDP's collectives are issued from
C++.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import sys
import threading
import time
import urllib.parse
import weakref
from collections import deque
from collections.abc import Callable
from types import CodeType, FrameType, TracebackType
from typing import Any, TypeAlias

from lab.rank import lastcall, protocol, tcpinfo, torchfr
from lab.rank.callspec import INIT_PROCESS_GROUP, NEW_GROUP, Spec, get
from lab.rank.ops import BATCHES, P2P
from lab.rank.protocol import EVENT_MAX
from lab.rank.quiet import PROGRESS_EVERY, Look, Quiet
from lab.rank.record import Record, to_wire

RING_MAX = 64  # records of the last calls kept
STEPS_MAX = 128  # a DDP program's last forwards and backward passes kept
ASYNC_MAX = 256  # async calls not yet waited kept; the oldest past it are dropped and counted
GROUPS_MAX = 256  # groups whose counts are kept
HANG_AFTER_VAR = "LAB_HANG_AFTER"  # the run's --hang-after, in every rank's environment
TRACE_VAR = "LAB_TRACE"  # "1": send every record as it begins and ends (``trace`` events: the run's --trace)
TORCH_DUMPS_VAR = "LAB_TORCH_DUMPS"  # "1": send torch's own recorder with each dump (the run's --fr-dir)
TRACE_BUDGET = 16 << 20  # bytes of trace events a rank sends; past it, what is left out is counted
FLIGHT_AFTER = 2.0  # seconds a blocking call is in flight before the rank dumps its records
FLIGHT_BUDGET = 8 << 20  # bytes of dumps sent before the last one (the last is always sent)
ERROR_MAX = 500  # characters of a call's error kept
WALK_MAX = 64  # frames looked at to find the user's
LAB_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # the lab package's, as its code names it

MAIN_STILL = 0.005  # seconds of CPU the main thread may use between two looks and still be waiting

_now = time.time
NOT_COLLECTIVE = frozenset({*P2P, *BATCHES})  # calls numbered apart from the collectives


class Group:
    """One process group as this rank counts its calls."""

    __slots__ = ("gid", "label", "collectives", "p2p", "counts")

    def __init__(self, gid: str) -> None:
        self.gid, self.collectives, self.p2p = gid, 0, 0  # (the latter two: the last seq of each kind)
        self.label = gid.encode()  # (as the page of the call in flight takes it: lab.rank.lastcall)
        self.counts: dict[str, int] = {}  # op -> calls completed


# A record as kept: a list (the cheapest thing to make, once per call), its fields at these places
# (CODE and LASTI: the user's frame's; DUMPED: a dump was sent while the call blocked; BY: who issued
# a collective the program did not call itself, "DDP's gradient"; RETURNED: when the call returned,
# its Work if async; WORLD: the world_size init_process_group was given;
# CALLER: for a collective torch issued, the program's frame that led to the user's, in another file).
(SEQ, GROUP, OP, SHAPE, DTYPE, PEER, ROOT, TAG, REDUCE_OP, ASYNC, CODE, LASTI, STATE, ERROR, T0, T1,
 DUMPED, BY, RETURNED, WORLD, CALLER) = range(21)
Call: TypeAlias = "list[Any]"


def to_json(call: list[Any]) -> dict[str, Any]:
    """A record as the events carry it (``lab.rank.record``'s schema)."""
    shape = _shape(call[SHAPE])
    return to_wire(Record(
        call[SEQ], call[GROUP].gid, call[OP], call[STATE], call[T0], call[T1],
        None if shape is None else math.prod(shape), None if shape is None else tuple(shape),
        None if call[DTYPE] is None else str(call[DTYPE]).removeprefix("torch."), _rank(call[PEER]),
        _rank(call[ROOT]), _rank(call[TAG]), _op_name(call[REDUCE_OP]), call[ASYNC], _where(call[CODE], call[LASTI]),
        call[ERROR], call[BY], call[WORLD], call[CALLER]))


def _shape(shape: Any) -> list[int] | None:
    try:
        return None if shape is None else [int(n) for n in shape]
    except (TypeError, ValueError):
        return None


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
    name = "lab/" + path[len(LAB_DIR):] if path.startswith(LAB_DIR) else os.path.basename(path)
    return f"{name}:{line}"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _in_backward(frame: FrameType | None) -> bool:
    """Whether a stack is inside autograd's backward (torch's ``Tensor.backward``, ``autograd.backward``)."""
    for _ in range(WALK_MAX):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name in ("backward", "_engine_run_backward") and f"{os.sep}torch{os.sep}" in code.co_filename:
            return True
        frame = frame.f_back
    return False


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


def _innermost_users(tb: TracebackType | None, internal: tuple[str, ...]) -> tuple[CodeType, int] | None:
    """The code and offset of a traceback's innermost frame outside torch and the lab."""
    found = None
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(internal):
            found = (tb.tb_frame.f_code, tb.tb_lasti)
        tb = tb.tb_next
    return found


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_MAX]


class _Batch(threading.local):
    """A thread's own: the calls of the ``batch_isend_irecv`` it is in."""

    batch: list[Call] | None = None


class Flight:
    """This process's flight recorder (one: :data:`FLIGHT`)."""

    def __init__(self) -> None:
        self.ring: deque[Call] = deque(maxlen=RING_MAX)
        self.world = Group("world")
        self.groups: dict[str, Group] = {"world": self.world}
        self.by_group: dict[int, tuple[weakref.ref[Any], Group]] = {}  # id(ProcessGroup) -> its Group
        self.made: dict[tuple[int, ...], int] = {}  # a new group's ranks -> groups of them made before
        self.waiting: dict[int, tuple[Call, float]] = {}  # thread -> the call whose Work it waits on, since when
        self.pending: dict[int, tuple[Any, list[Call]]] = {}  # id(Work) -> it, its calls (async, not waited)
        self.pending_calls = 0
        self.completed = 0  # by the threads that made the calls (blocking ones)
        self.completed_async = 0  # async calls, seen done by a wait or the progress thread (under lock)
        self.dropped = 0
        self.lock = threading.Lock()
        self.local = _Batch()
        self.internal: tuple[str, ...] = (LAB_DIR, "<frozen ")  # frames that are not the user's
        self.torch_dir = "\0"
        self.user_code: CodeType | None = None  # the code of the last call's caller, if the user's
        self.work_class: Any = type(None)
        self.waits_seen = False  # Work.wait is wrapped
        self.c10d: Any = None
        self.dist_error: Any = ()  # torch.distributed.DistError: the backend's errors
        self.rank = -1
        self.pid = 0
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.quiet = Quiet()  # how long nothing moved, look after look (the run's --hang-after: HANG_AFTER_VAR)
        self.changed_at = -math.inf  # when (time.time) the newest call ended
        self.store_ports: set[int] = set()  # a tcp:// rendezvous' port (MASTER_PORT's is read as it is)
        self.finished: tuple[Call, int] | None = None  # (the newest record, completed) at the last final dump
        self.dump_bytes = 0
        # torch's own recorder (lab.rank.torchfr), as last read: its entries' groups by torch's name, the
        # collectives torch issued itself (the program's own calls take torch's numbers instead), the
        # newest entry read, the groups' sequence numbers then (unchanged with none in flight: no news)
        self.by_name: dict[str, Group] = {}
        self.torch_lock = threading.Lock()
        self.issued: deque[Call] = deque(maxlen=RING_MAX)
        self.issued_by_id: dict[int, Call] = {}  # torch's record_id -> the record, while in flight
        self.read_id = -1
        self.read_mark: tuple[int, ...] | None = None
        self.completed_torch = 0
        self.ddp = False  # the program made a DistributedDataParallel: the C++ collectives are its reducer's
        self.main_cpu: float | None = None  # the main thread's CPU time at the last look (its clock's word)
        self.main_moved_at = -math.inf  # when (time.time) a look last found it had run
        self.main_clock: int | None = None
        self.waited: Call | None = None  # the collective torch issued that the last look found the main thread in
        # --trace: each record's state when a trace event last took it, the calls begun, those begun when
        # the last trace event was sent, the calls left out (the ring let go of them first, or past the budget)
        self.tracing = False
        self.traced: dict[int, tuple[Call, str]] = {}
        self.begun = self.begun_traced = self.trace_dropped = self.trace_bytes = 0
        self.torch_dumps = False
        # the page the call in flight is kept on for the rank's relay (lab.rank.lastcall), what it takes of
        # the user's frames and the dtypes, as bytes
        self.page: lastcall.Page | None = None
        self.where_bytes: dict[tuple[CodeType | None, int], bytes] = {}
        self.dtype_bytes: dict[Any, bytes] = {}
        # the training steps of a program that made a DDP model, as its forwards and backward passes came
        # (number, "forward" or "backward", whether a forward syncs the gradients, the user's code and offset)
        self.steps: deque[tuple[int, str, bool | None, CodeType | None, int]] = deque(maxlen=STEPS_MAX)
        self.steps_made = 0

    def bind(self) -> None:
        """Take what the recording needs from torch (imported by now)."""
        import torch
        import torch.distributed.distributed_c10d as c10d

        self.torch_dir = os.path.dirname(torch.__file__) + os.sep
        self.internal = (self.torch_dir, LAB_DIR, "<frozen ")
        self.work_class, self.c10d = c10d.Work, c10d
        self.dist_error = getattr(torch.distributed, "DistError", ())
        torchfr.default_buffer()
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
        self.steps.append((self.steps_made, kind, sync, *self._user_frame(frame)))

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
            code, lasti = self._user_frame(frame)
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
                None, reduce_op, False, code, lasti, "in_flight", None, _now(), None, False, None, None, None, None]
        if spec.extra:
            self._extra(call, spec, args, kwargs)
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

    def _user_frame(self, frame: FrameType | None) -> tuple[CodeType | None, int]:
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

    def _caller(self, frame: FrameType | None, code: CodeType | None) -> str | None:
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
            call[ERROR], call[T1], call[STATE] = _error(exc), time.time(), "raised"
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

    # -- groups --------------------------------------------------------------------------------

    def group_of(self, pg: Any) -> Group | None:
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
        self._remember(pg, group)
        return group

    def _group(self, gid: str) -> Group:
        group = self.groups.get(gid)
        if group is None:
            group = self.groups[gid] = Group(gid)
            if len(self.groups) > GROUPS_MAX:  # the oldest other than the world's go
                del self.groups[next(g for g in self.groups if g != "world")]
        return group

    def _remember(self, pg: Any, group: Group) -> None:
        with contextlib.suppress(Exception):  # (a group torch names: its entries in torch's recorder)
            self.by_name[str(pg.group_name)] = group
        key = id(pg)
        try:  # (once pg is freed, another group may come at its address)
            ref = weakref.ref(pg, lambda _: self.by_group.pop(key, None))
        except TypeError:  # (not a ProcessGroup: the call will say so)
            return
        self.by_group[key] = (ref, group)

    def wrap_new_group(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``new_group`` recorded on the group it makes, by its members (their group connects them),
        and the group it returns known by its id."""

        @functools.wraps(fn)
        def new_group(*args: Any, **kwargs: Any) -> Any:
            group, call = self._new_group(args, kwargs, sys._getframe(1))
            pg = self._blocking(call, fn, args, kwargs)
            if group is not None and not isinstance(pg, int):
                self._remember(pg, group)
            return pg

        return new_group

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
            call = self.begin(INIT_PROCESS_GROUP, (), {}, sys._getframe(1), self.world)
            if call is not None:  # (one the program gives, not the environment's: it may disagree with the launcher)
                size = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
                call[WORLD] = size if _count(size) and size > 0 else None
            result = self._blocking(call, fn, args, kwargs)
            with contextlib.suppress(Exception):  # (its name in torch's recorder, known before any teardown)
                self._remember(self.c10d._get_default_group(), self.world)
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

    def _new_group(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                   frame: FrameType) -> tuple[Group | None, Call | None]:
        """The group ``new_group(ranks, ...)`` makes (None: not known, the world not formed yet) and,
        on its members, the call making it."""
        try:
            ranks = args[0] if args else kwargs.get("ranks")
            ranks = tuple(sorted(ranks)) if ranks else tuple(range(self.c10d.get_world_size()))
            member = self.c10d.get_rank() in ranks
        except Exception:  # torch says what is wrong
            return None, None
        made = self.made.get(ranks, 0)
        if len(self.made) < GROUPS_MAX * 16 or ranks in self.made:
            self.made[ranks] = made + 1
        group = self._group(f"g{','.join(map(str, ranks))}#{made}")
        if not member:
            return group, None
        return group, self.begin(NEW_GROUP, (), {}, frame, group)

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
                self._settle(calls, _error(exc))
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

    # -- torch's own records --------------------------------------------------------------------

    def read_torch(self, now: float) -> list[Call]:
        """Read torch's recorder (lab.rank.torchfr) where it may say something new. An entry made
        within one of the program's collectives on its group is part of that call (all_gather_object's
        two all_gathers); any other is a collective torch issued itself (DDP's reducer), a record of its
        own (``BY``), done once torch retires it, counted among the group's collectives where it came:
        the program's calls that began after it move one number on, so that the n-th collective of a
        group is the same call on every rank, whoever issued it. Returns those still in flight, oldest
        first."""
        with self.torch_lock:  # (the progress thread reads, and the main thread as the program raises)
            return self._read_torch(now)

    def _read_torch(self, now: float) -> list[Call]:
        mark = self._torch_mark()
        if mark is not None and mark == self.read_mark and not self.issued_by_id:
            return []
        self.read_mark = mark
        entries = torchfr.read().get("entries")
        if not isinstance(entries, list):
            return []
        names = self._names()
        ring = list(self.ring)
        # (an entry older than the oldest record kept may be a call of the program's that left the ring)
        horizon = ring[0][T0] if len(ring) == RING_MAX else -math.inf
        program = [call for call in ring if call[OP] not in NOT_COLLECTIVE]
        newest = self.read_id
        for entry in entries:
            rid, created = entry.get("record_id"), entry.get("time_created_ns")
            if not (_count(rid) and _count(entry.get("collective_seq_id")) and entry["collective_seq_id"] > 0
                    and isinstance(created, int)):
                continue  # (a point-to-point entry, or one torch could not fill)
            newest = max(newest, rid)
            if rid <= self.read_id:
                call = self.issued_by_id.get(rid)
                if call is not None and entry.get("retired") is True:
                    self._retired(call, now)
                continue
            group = names.get(torchfr.group_name(entry) or "")
            created /= 1e9
            if group is None or created < horizon or any(
                    c[GROUP] is group and c[T0] <= created and (c[RETURNED] is None or created <= c[RETURNED])
                    for c in program):
                continue  # (unknown, or a part of the program's call)
            later = [c for c in program if c[GROUP] is group and c[T0] > created]
            seq = min((c[SEQ] for c in later), default=group.collectives + 1)
            for c in later:
                c[SEQ] += 1
            group.collectives += 1
            call = [seq, group, torchfr.op_of(entry), torchfr.shape_of(entry), torchfr.dtype_of(entry),
                    None, None, None, None, True, None, 0, "in_flight", None, created, None, False,
                    "DDP's" if self.ddp else "torch's", None, None, None]
            self.issued.append(call)
            if entry.get("retired") is True:
                self._retired(call, None)
            else:
                self.issued_by_id[rid] = call
        self.read_id = newest
        return sorted(self.issued_by_id.values(), key=lambda call: call[T0])

    def raised(self, exc: BaseException) -> None:
        """The program ends on ``exc``: where it was raised inside torch, the newest collective torch
        issued since the program's last call ended is the one it came from (gloo's "Connection closed
        by peer" inside ``loss.backward()``). torch retires a collective that failed as one that
        completed: the record says it raised."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        if tb is None or not tb.tb_frame.f_code.co_filename.startswith(self.torch_dir) or not (
                isinstance(exc, self.dist_error) or "gloo" in str(exc)[:ERROR_MAX]):
            return  # (not the backend's: DDP's own checks raise inside torch too)
        self.read_torch(time.time())
        ended = max((call[T1] for call in list(self.ring) if call[T1] is not None), default=-math.inf)
        call = max((c for c in self.issued if c[T0] >= ended), key=lambda c: c[T0], default=None)
        if call is None:
            return
        if call[STATE] == "done":
            counts = call[GROUP].counts
            counts[call[OP]] = counts.get(call[OP], 1) - 1
        self._settled(call)
        call[STATE], call[ERROR], call[T1] = "raised", _error(exc), time.time()
        if call[CODE] is None:
            call[CODE], call[LASTI] = _innermost_users(exc.__traceback__, self.internal) or (None, 0)
            call[CALLER] = self._caller(tb.tb_frame, call[CODE])
        if self.ddp and call[BY] == "DDP's" and call[OP] == "all_reduce" and _in_backward(tb.tb_frame):
            call[BY] = "DDP's gradient"

    def _retired(self, call: Call, seen: float | None) -> None:
        """A collective torch issued completed (by ``seen``, when a read saw it in flight before)."""
        call[STATE], call[T1] = "done", seen
        self._settled(call)
        counts = call[GROUP].counts
        counts[call[OP]] = counts.get(call[OP], 0) + 1
        self.completed_torch += 1
        if seen is not None:
            self.changed_at = max(self.changed_at, seen)

    def _settled(self, call: Call) -> None:
        """A collective torch issued is no longer in flight."""
        for rid, other in list(self.issued_by_id.items()):
            if other is call:
                del self.issued_by_id[rid]

    def _names(self) -> dict[str, Group]:
        """The groups by torch's name for them, the world's and any torch made that the program has not
        used yet (a DeviceMesh's) included."""
        with contextlib.suppress(Exception):
            for pg, name in list(self.c10d._world.pg_names.items()):
                if str(name) not in self.by_name:
                    self.group_of(pg)
        return self.by_name

    def _ranks_by_name(self) -> dict[str, list[int]]:
        """Every process group's global ranks, by torch's name for it."""
        found: dict[str, list[int]] = {}
        with contextlib.suppress(Exception):
            for pg, name in list(self.c10d._world.pg_names.items()):
                found[str(name)] = sorted(self.c10d.get_process_group_ranks(pg))
        return found

    def _torch_mark(self) -> tuple[int, ...] | None:
        """The process groups' sequence numbers (each counts the collectives issued on it): while they
        stay the same and nothing was in flight, torch's recorder has nothing new."""
        try:
            return tuple(pg._get_sequence_number_for_group() for pg in list(self.c10d._world.pg_names))
        except Exception:  # (a torch that cannot say: read every time)
            return None

    def _torch_blocking(self, now: float) -> list[tuple[Call, float]]:
        """The collective torch issued that the program's main thread waits in (DDP's gradient
        all_reduce at the end of ``backward()``), since when: the oldest in flight, when the thread's
        CPU clock did not move since the last look (the kernel's word that it did not run: a rank
        that computes while a collective is under way, DDP's overlap, is no wait). Empty otherwise."""
        waited, self.waited = self.waited, None
        if waited is not None and waited[STATE] == "waiting":
            waited[STATE] = "in_flight"
        try:
            if self.main_clock is None:
                self.main_clock = time.pthread_getcpuclockid(threading.main_thread().ident or 0)
            cpu = time.clock_gettime(self.main_clock)
        except (AttributeError, OSError, OverflowError):  # (no thread clocks here: no such wait is seen)
            return []
        ran = self.main_cpu is None or cpu - self.main_cpu > MAIN_STILL
        self.main_cpu = cpu
        if ran:
            self.main_moved_at = now
            return []
        inflight = self.read_torch(now)
        if not inflight:
            return []
        call = self.waited = inflight[0]
        call[STATE] = "waiting"
        if call[CODE] is None:
            frame = sys._current_frames().get(threading.main_thread().ident or 0)
            call[CODE], call[LASTI] = self._user_frame(frame)
            call[CALLER] = self._caller(frame, call[CODE])
            if self.ddp:
                call[BY] = "DDP's gradient" if call[OP] == "all_reduce" and _in_backward(frame) else "DDP's"
        return [(call, max(call[T0], self.main_moved_at))]

    # -- what the rank says (the progress thread, and at the end) -------------------------------

    def watch(self, rank: int) -> None:
        """Send ``progress`` and ``flight`` events as rank ``rank`` from now on (once; only with a
        channel to send them on), and a last dump at exit."""
        if self.thread is not None or protocol.CHANNEL is None:
            return
        self.rank, self.pid = rank, os.getpid()
        with contextlib.suppress(ValueError):
            self.quiet = Quiet(float(os.environ.get(HANG_AFTER_VAR) or 0))
        self.tracing = os.environ.get(TRACE_VAR) == "1"
        self.torch_dumps = os.environ.get(TORCH_DUMPS_VAR) == "1"
        self.thread = threading.Thread(target=self._run, name="lab-flight", daemon=True)
        self.thread.start()
        atexit.register(self.finish)

    def _run(self) -> None:
        try:
            wait = PROGRESS_EVERY
            while not self.stop.wait(wait):
                wait = self._tick(time.time())
        except OSError:  # the channel is gone, and the controller with it: nothing more to say
            pass

    def _tick(self, now: float) -> float:
        """One look; the seconds to the next."""
        self._poll()
        blocking = self.blocking()
        if not blocking:
            blocking = self._torch_blocking(now)
        elif any(now - since >= FLIGHT_AFTER and not call[DUMPED] for call, since in blocking):
            self.read_torch(now)  # (its number, counting the collectives torch issued before it)
        wait = self._progress(blocking)
        slow = [call for call, since in blocking if not call[DUMPED] and now - since >= FLIGHT_AFTER]
        for call in slow:
            call[DUMPED] = True
        if slow:
            self._dump(last=False)
        if self.tracing:
            self._trace()
        return wait

    def _trace(self) -> None:
        """Send the records that began or changed state since the last trace event (--trace)."""
        channel = protocol.CHANNEL
        calls = [*self.ring, *self.issued]
        fresh = [call for call in calls if (seen := self.traced.get(id(call))) is None or seen[0] is not call
                 or seen[1] != call[STATE]]
        kept = {id(call) for call in calls}
        self.traced = {key: seen for key, seen in self.traced.items() if key in kept}
        new = sum(1 for call in self.ring if id(call) not in self.traced)
        self.trace_dropped += max(0, self.begun - self.begun_traced - new)  # (began and left the ring unseen)
        self.begun_traced = self.begun
        if not fresh or channel is None:
            return
        for call in fresh:
            self.traced[id(call)] = (call, call[STATE])
        line = protocol.event_line(channel.token, "trace", rank=self.rank, records=[to_json(c) for c in fresh],
                                   dropped=self.trace_dropped).encode()
        if self.trace_bytes + len(line) > TRACE_BUDGET or len(line) > EVENT_MAX:
            self.trace_dropped += len(fresh)
            return
        self.trace_bytes += len(line)
        channel.write(line)

    def _progress(self, blocking: list[tuple[Call, float]]) -> float:
        """Look at the rank's calls and connections, and send ``progress`` where the rule of quiet
        (``lab.rank.quiet``) says it is news; the seconds to the next look."""
        oldest = min(blocking, key=lambda entry: entry[1], default=None)
        inflight = None if oldest is None else oldest[0]
        completed = self.completed + self.completed_async + self.completed_torch
        moved, mark = tcpinfo.traffic(self._stores())
        verdict = self.quiet.look(Look(completed, None if inflight is None else id(inflight),
                                       "" if inflight is None else inflight[STATE],
                                       None if oldest is None else oldest[1], mark, self.changed_at,
                                       time.monotonic(), time.time()))
        if verdict.say:
            self._send("progress", completed=completed, inflight=None if inflight is None else to_json(inflight),
                       moved=moved if inflight is not None else 0, quiet=round(verdict.quiet, 2), at=time.time())
            if verdict.quiet_enough:  # the records as they are at a hang, for the verdict to read at once
                self._dump(last=False)
        return verdict.next_look

    def _stores(self) -> frozenset[int]:
        """The ports of the rendezvous stores: their traffic is the ranks polling them (init's
        barrier, a store's wait), not the job's data moving."""
        ports = set(self.store_ports)
        with contextlib.suppress(ValueError):
            ports.add(int(os.environ.get("MASTER_PORT") or 0))
        return frozenset(ports - {0})

    def _poll(self) -> None:
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
                    self._settle(calls, None if exc is None else _error(exc))

    def finish(self) -> None:
        """The rank's last word (the worker's "done", and atexit): stop the progress thread, send the
        last progress and a last dump, unless nothing was recorded or nothing changed since."""
        if self.thread is None or os.getpid() != self.pid:  # (a forked child has no thread of ours)
            return
        self.stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=2 * PROGRESS_EVERY)
        self._poll()
        try:
            self._progress(self.blocking())
        except OSError:
            return
        self.read_torch(time.time())
        last, completed = self.ring[-1] if self.ring else None, self.completed + self.completed_async
        completed += self.completed_torch
        if last is None or (self.finished is not None and self.finished[0] is last and self.finished[1] == completed):
            return
        self.finished = (last, completed)
        try:
            if self.tracing:
                self._trace()
            self._dump(last=True)
        except OSError:
            pass

    def snapshot(self) -> dict[str, Any]:
        """The fields of a ``flight`` event: the records (the program's and those torch issued, oldest
        first), the calls in flight, the counts."""
        issued = self.read_torch(time.time())
        with self.lock:
            ring = sorted((*self.ring, *self.issued), key=lambda call: call[T0])[-RING_MAX:]
            waiting = [call for _, calls in self.pending.values() for call in calls]
            dropped = self.dropped
        counts = {group.gid: dict(group.counts) for group in list(self.groups.values()) if group.counts}
        blocking = [call for call, _ in self.blocking()]
        inflight = sorted({id(call): call for call in (*blocking, *waiting, *issued)}.values(),
                          key=lambda call: call[T0])
        steps = [[n, kind, sync, _where(code, lasti)] for n, kind, sync, code, lasti in list(self.steps)]
        return {"rank": self.rank, "records": [to_json(call) for call in ring],
                "inflight": [to_json(call) for call in inflight], "counts": counts, "dropped": dropped,
                **({"steps": steps} if steps else {})}

    def blocking(self) -> list[tuple[Call, float]]:
        """The calls the rank's threads block in, and since when: a call under way (the newest record of
        its thread, in the ring) or a Work's wait."""
        running = [(call, call[T0]) for call in list(self.ring) if call[STATE] == "in_flight" and not call[ASYNC]]
        return running + list(self.waiting.values())

    def _dump(self, last: bool) -> None:
        channel = protocol.CHANNEL
        if channel is None:
            return
        line = fit(channel.token, self.snapshot())
        if not last and self.dump_bytes + len(line) > FLIGHT_BUDGET:
            return
        self.dump_bytes += len(line)
        channel.write(line)
        if self.torch_dumps:
            dump = torchfr.read()
            if dump:
                dump = torchfr.analyzable(dump, self._ranks_by_name())
                line = protocol.event_line(channel.token, "torchdump", rank=self.rank, dump=dump).encode()
                if len(line) <= EVENT_MAX:
                    channel.write(line)

    def _send(self, event: protocol.EventKind, **fields: Any) -> None:
        channel = protocol.CHANNEL
        if channel is not None:
            channel.send(event, rank=self.rank, **fields)


def fit(token: str, fields: dict[str, Any]) -> bytes:
    """The ``flight`` event line of ``fields``, made to fit EVENT_MAX: the oldest records left out
    first, then the oldest calls in flight, then the counts (``dropped`` counts the calls left out)."""
    while True:
        line = protocol.event_line(token, "flight", **fields).encode()
        records, inflight = fields["records"], fields["inflight"]
        if len(line) <= EVENT_MAX or not (records or inflight or fields["counts"]):
            return line
        if not (records or inflight):
            fields["counts"] = {}
            continue
        cut = records if records else inflight
        n = max(1, len(cut) // 4)
        del cut[:n]
        fields["dropped"] += n


FLIGHT = Flight()
