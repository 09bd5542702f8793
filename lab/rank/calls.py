"""Which ``torch.distributed`` calls an exercise made on this rank: the evidence of its *method*.

Runs on every host: the standard library, and torch once :func:`install` is called.

:func:`install` replaces, once per process, the public communication functions of
``torch.distributed`` (send, recv, isend, irecv, batch_isend_irecv, the collectives, barrier,
the ``*_object`` variants: :data:`FUNCTIONS`) and the same names in
``torch.distributed.distributed_c10d`` (which the former re-exports, and whose own functions
call each other through) with wrappers, and wraps the communication methods of
``ProcessGroup`` (:data:`GROUP_METHODS`, so ``dist.group.WORLD.allreduce(...)`` is seen too).
It also wraps the ops of ``torch.ops`` that reach the backends beside those functions (the
namespaces of :data:`OP_NAMESPACES`: ``torch.ops.c10d.allreduce_``, and the functional
collectives' ``torch.ops._c10d_functional.all_reduce``), recorded as ``torch.ops.<ns>.<op>``
when a program calls them itself (torch's own functions call some inside ours: not counted).
The worker installs it before it imports any exercise program, so a solution's
``from torch.distributed import all_reduce`` binds the wrapper. ``P2POp`` and
``batch_isend_irecv`` keep working: P2POp checks its ``op`` against the same (wrapped) names.

The same wrappers give every call the program makes, always, to the flight recorder
(``lab.rank.flight``; ``new_group`` and ``init_process_group`` are wrapped for it alone, and so is
``Work.wait``, by the recorder itself once the program makes an async call). For the method check they record only
inside :meth:`Recorder.recording`, which the worker holds around one exercise (loading its
program and its ``run()``): the lab's own calls (the rendezvous, the barrier between exercises,
destroy) are never the student's. What is recorded:

* ``counts``: name -> how many times the program called it (``ProcessGroup.allreduce`` for a
  method of a group). A call that torch makes inside another (the sends inside
  ``send_object_list``, the isends inside ``batch_isend_irecv``) is not counted again; a call
  that raised was made, and counts.
* ``sent``: destination rank -> bytes this rank sent point to point (``numel() *
  element_size()`` of every tensor given to send or isend, the ones inside
  ``batch_isend_irecv`` and ``send_object_list`` included); ``messages``: how many tensors that was;
  ``groups``: the process groups it made (``new_group``), where it made any.
* ``functions``: for each function a student writes (``Exercise.writes``) that the worker
  wrapped with :meth:`Recorder.scoped`: ``calls`` (times it was called), ``tensor_bytes``
  (the bytes of its first tensor argument, summed over the calls), its own ``counts`` and
  ``sent`` (what the rank did while inside it), and ``reference: true`` when the function is
  the reference program's own (a solution that imported it).

:meth:`Recorder.summary` is that as JSON data: counts and byte totals, never a list of calls; and
``tampered``, when the program switched the recorder off while it recorded or put something else
where its wrappers were (:meth:`Recorder.tampering`): the method check then fails the rank.
It is evidence of what an honest program did, not a sandbox: code in the rank's process can undo
the wrappers, call an op's overload (``torch.ops.c10d.allreduce_.default``) or the C++ bindings
directly (docs/classroom.md says what that leaves to the values check).
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lab.rank.callspec import Spec, method_spec, spec_for
from lab.rank.flight import FLIGHT
from lab.rank.ops import FUNCTIONS, GROUP_METHODS, TENSOR_SENDS
from lab.rank.torchcalls import TORCH_CALLS

WRAPPED = "__lab_calls__"  # set on every wrapper: never wrapped twice
# modules that took torch's new_group as their own name at import (a DeviceMesh makes its groups with it)
MESH_MODULES = ("torch.distributed.device_mesh",)
# The namespaces of torch.ops whose ops communicate: c10d's (what ProcessGroup's methods dispatch to) and
# the functional collectives'; their ops that move no data are not recorded.
OP_NAMESPACES: tuple[str, ...] = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
NOT_COMMUNICATION: frozenset[str] = frozenset({"wait_tensor", "check_for_nan"})


@dataclass
class Tally:
    """Calls and bytes sent, in all or inside one of the student's functions."""

    counts: Counter[str] = field(default_factory=Counter)
    sent: Counter[int] = field(default_factory=Counter)
    messages: int = 0  # tensors sent point to point (each costs its connection a few headers: lab.suite.method)
    calls: int = 0  # times the function was called (functions only)
    tensor_bytes: int = 0  # bytes of its first tensor argument, summed over the calls
    reference: bool = False  # the reference program's own function, not the student's
    missing: bool = False  # ... because the solution does not define it

    def to_json(self, function: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {"counts": dict(sorted(self.counts.items())),
                                "sent": {str(dst): n for dst, n in sorted(self.sent.items())}}
        if not function:
            data["messages"] = self.messages
            return data
        data.update(calls=self.calls, tensor_bytes=self.tensor_bytes)
        if self.reference:
            data["reference"] = True
        if self.missing:
            data["missing"] = True
        return data


class _Local(threading.local):
    """A thread's own: calls of ours under way (a call inside one is torch's), the function inside."""

    depth = 0
    scope: str | None = None


class Recorder:
    """Records the calls made while :meth:`recording` (one per process: :data:`RECORDER`)."""

    def __init__(self) -> None:
        self._active = False  # recording now (the wrappers read it: no property on their path)
        self._recording = False  # inside :meth:`recording`
        self.switched_off = 0  # times a program switched :attr:`active` off while recording
        self.groups = 0  # process groups the program made while recording (each connects its members anew)
        self.installed: list[tuple[Any, str, Any, str]] = []  # (owner, attribute, our stand-in, label): install()
        self.total = Tally()
        self.functions: dict[str, Tally] = {}
        self.reference_file: str | None = None  # the reference program's: its code inside a student's function
        self._lock = threading.Lock()
        self._local = _Local()

    @property
    def active(self) -> bool:
        """Whether calls are recorded now. The lab switches it through :meth:`recording` alone; a program
        that switches it off while an exercise runs is counted (:meth:`tampering`)."""
        return self._active

    @active.setter
    def active(self, value: bool) -> None:
        if self._recording and self._active and not value:
            self.switched_off += 1
        self._active = bool(value)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Record from a clean slate until the block ends; :meth:`summary` then says what it saw."""
        self.total, self.functions, self.switched_off, self.groups = Tally(), {}, 0, 0
        self._recording = self._active = True
        try:
            yield
        finally:
            self._recording = self._active = False

    def tampering(self) -> list[str]:
        """What a program did to the recorder while recording: switched it off, or put something else where
        its wrappers were (what is still there when this is asked: after the exercise)."""
        found = [f"switched off {self.switched_off} time(s)"] if self.switched_off else []
        replaced = sorted({label for owner, name, ours, label in self.installed
                           if getattr(owner, name, None) is not ours})
        if replaced:
            more = f" and {len(replaced) - 3} more" if len(replaced) > 3 else ""
            found.append(f"its wrappers replaced ({', '.join(replaced[:3])}{more})")
        return found

    def summary(self) -> dict[str, Any]:
        tampered = self.tampering()
        with self._lock:
            data = self.total.to_json()
            if self.groups:
                data["groups"] = self.groups
            if tampered:
                data["tampered"] = tampered
            if self.functions:
                data["functions"] = {name: tally.to_json(function=True)
                                     for name, tally in sorted(self.functions.items())}
            return data

    def wrap(self, name: str, fn: Callable[..., Any], sends: bool = False,
             spec: Spec | None = None) -> Callable[..., Any]:
        """``fn`` recorded as ``name``; with ``sends``, its tensor (first argument, or
        ``tensor=``) counts as bytes sent to its ``dst`` (second argument, or ``dst=``/``group_dst=``).
        With ``spec`` (torch's functions: :func:`install`), each call the program makes also goes to
        the flight recorder, recording or not."""
        local, flight, batch = self._local, FLIGHT, spec is not None and spec.batch
        begin, ended, frame = flight.begin, flight.ended, sys._getframe  # (looked up once: every call counts)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth = local.depth
            if self._active:
                if depth == 0:
                    self._count(name)
                if sends:
                    self._sent_by_function(args, kwargs)
            if spec is None or (depth and (depth > 1 or flight.local.batch is None)):
                return _inside(local, depth, fn, args, kwargs)  # torch's own call, inside one of ours
            if batch:
                return _batch(local, depth, fn, args, kwargs)
            call = begin(spec, args, kwargs, frame(1))
            local.depth = depth + 1
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                flight.failed(call, exc)
                raise
            finally:
                local.depth = depth
            if call is not None:
                ended(call, result)
            return result

        setattr(wrapper, WRAPPED, name)
        return wrapper

    def wrap_group_maker(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``new_group``, each call counted while recording (not as a call of the method: making a group
        moves no data of the program's, but its members connect anew: lab.suite.method.check_carried)."""

        @functools.wraps(fn)
        def new_group(*args: Any, **kwargs: Any) -> Any:
            if self._active:
                with self._lock:
                    self.groups += 1
            return fn(*args, **kwargs)

        return new_group

    def wrap_method(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        """A ProcessGroup method recorded as ``ProcessGroup.<name>`` when the program calls it
        itself (torch's own functions call these too: inside ours, they are not counted again),
        in the method check and the flight recorder."""
        label, spec, local, flight = f"ProcessGroup.{name}", method_spec(name), self._local, FLIGHT

        @functools.wraps(method)
        def wrapper(group: Any, *args: Any, **kwargs: Any) -> Any:
            if local.depth:
                return method(group, *args, **kwargs)
            if self._active:
                self._count(label)
                if name == "send":  # send(tensors, dst_rank, tag): dst_rank is the group's rank
                    self._sent_by_group(group, args, kwargs)
            call = flight.begin(spec, (group, *args), kwargs, sys._getframe(1))
            local.depth = 1
            try:
                result = method(group, *args, **kwargs)
            except BaseException as exc:
                flight.failed(call, exc)
                raise
            finally:
                local.depth = 0
            if call is not None:
                flight.ended(call, result)
            return result

        setattr(wrapper, WRAPPED, label)
        return wrapper

    def scoped(self, name: str, fn: Callable[..., Any], reference: bool = False,
               missing: bool = False) -> Callable[..., Any]:
        """``fn`` (a function the student writes) with what the rank does inside it recorded
        apart, under ``name``, as well as in the totals. Inside another scoped function, the
        outer one keeps it (a ring_allreduce built on allreduce is ring_allreduce's)."""
        if getattr(fn, WRAPPED, None) is not None:
            return fn

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self._active or self._local.scope is not None:
                return fn(*args, **kwargs)
            with self._lock:
                tally = self.functions.setdefault(name, Tally(reference=reference, missing=missing))
                tally.calls += 1
                tally.tensor_bytes += next((_nbytes(a) for a in (*args, *kwargs.values()) if _is_tensor(a)), 0)
            self._local.scope = name
            try:
                return fn(*args, **kwargs)
            finally:
                self._local.scope = None

        setattr(wrapper, WRAPPED, f"scope:{name}")
        return wrapper

    def _tallies(self) -> list[Tally]:
        scope = self._local.scope
        if scope is None:
            return [self.total]
        return [self.total, self.functions.setdefault(scope, Tally())]

    def _count(self, name: str) -> None:
        """One call of ``name`` (from a wrapper of ours: its caller is the program's code). Made by the
        reference program's own code inside a student's function, it makes that function the
        reference's (a wrapper around the reference's function is not the student's work)."""
        scope = self._local.scope
        with self._lock:
            for tally in self._tallies():
                tally.counts[name] += 1
            if scope is not None and sys._getframe(2).f_code.co_filename == self.reference_file:
                self.functions[scope].reference = True

    def _add_sent(self, dst: Any, nbytes: int) -> None:
        if not isinstance(dst, int) or isinstance(dst, bool):
            return
        with self._lock:
            for tally in self._tallies():
                tally.sent[dst] += nbytes
                tally.messages += 1

    def _sent_by_function(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """send/isend(tensor, dst=None, group=None, tag=0, group_dst=None)."""
        try:
            tensor = args[0] if args else kwargs.get("tensor")
            dst = args[1] if len(args) > 1 else kwargs.get("dst")
            if dst is None:
                group_dst = args[4] if len(args) > 4 else kwargs.get("group_dst")
                group = args[2] if len(args) > 2 else kwargs.get("group")
                dst = _global_rank(group, group_dst) if group_dst is not None else None
            if _is_tensor(tensor):
                self._add_sent(dst, _nbytes(tensor))
        except Exception:  # recording never breaks the program's call: torch says what is wrong
            pass

    def _sent_by_group(self, group: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """ProcessGroup.send(tensors, dst_rank, tag)."""
        try:
            tensors = args[0] if args else kwargs.get("tensors", [])
            dst = args[1] if len(args) > 1 else kwargs.get("dstRank", kwargs.get("dst_rank"))
            dst = _global_rank(group, dst) if isinstance(dst, int) else None
            self._add_sent(dst, sum(_nbytes(t) for t in tensors if _is_tensor(t)))
        except Exception:
            pass


def _inside(local: _Local, depth: int, fn: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> Any:
    """``fn`` called one level deeper into our wrappers: the calls it makes are its own, not the program's."""
    local.depth = depth + 1
    try:
        return fn(*args, **kwargs)
    finally:
        local.depth = depth


def _batch(local: _Local, depth: int, fn: Callable[..., Any], args: tuple[Any, ...],
           kwargs: dict[str, Any]) -> Any:
    """``batch_isend_irecv``: its isends and irecvs go to the flight recorder as the program's."""
    FLIGHT.begin_batch()
    works = None
    try:
        works = _inside(local, depth, fn, args, kwargs)
    finally:
        FLIGHT.end_batch(works)
    return works


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "numel") and hasattr(value, "element_size")


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel()) * int(tensor.element_size())


def _global_rank(group: Any, group_rank: int) -> int:
    import torch.distributed as dist

    if group is None or group is dist.GroupMember.WORLD:
        return group_rank
    return int(dist.get_global_rank(group, group_rank))


RECORDER = Recorder()
_installed = False


def install(recorder: Recorder = RECORDER) -> None:
    """Wrap torch.distributed's communication functions and ProcessGroup's methods (once), for the
    method check and the flight recorder, and for the latter ``new_group``, ``init_process_group`` and
    ``destroy_process_group``
    (and ``Work.wait``, once the program makes an async call: ``lab.rank.flight``); and bind the
    recorder, its reading of torch's own recorder with it (``lab.rank.torchcalls``)."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    FLIGHT.bind()
    TORCH_CALLS.bind()
    modules = (dist, c10d)
    meshes = [sys.modules[name] for name in MESH_MODULES if name in sys.modules]  # (their own new_group, imported)
    # (the flight recorder's wrapper outermost: it takes the program's frame as its caller's)
    flight_only = {"new_group": lambda fn: FLIGHT.wrap_new_group(recorder.wrap_group_maker(fn)),
                   "init_process_group": FLIGHT.wrap_init, "destroy_process_group": FLIGHT.wrap_destroy}
    for name in (*FUNCTIONS, *flight_only):
        fn = getattr(c10d, name, None) or getattr(dist, name, None)
        if not callable(fn) or getattr(fn, WRAPPED, None) is not None:
            continue
        wrapper = flight_only[name](fn) if name in flight_only else \
            recorder.wrap(name, fn, sends=name in TENSOR_SENDS, spec=spec_for(name, fn))
        setattr(wrapper, WRAPPED, name)
        for module in (*modules, *meshes) if name == "new_group" else modules:
            if getattr(module, name, None) is fn:
                setattr(module, name, wrapper)
                if name not in flight_only:
                    recorder.installed.append((module, name, wrapper, f"{module.__name__}.{name}"))
    _wrap_ops(recorder)
    group_class = c10d.ProcessGroup
    for name in GROUP_METHODS:
        method = getattr(group_class, name, None)
        if not callable(method) or getattr(method, WRAPPED, None) is not None:
            continue
        try:
            setattr(group_class, name, wrapper := recorder.wrap_method(name, method))
        except (AttributeError, TypeError):  # a torch whose ProcessGroup takes no new attributes
            continue
        recorder.installed.append((group_class, name, wrapper, f"ProcessGroup.{name}"))
    _installed = True


class _RecordedOp:
    """An op of ``torch.ops``, recorded when called; everything else of it (its overloads, its schema)
    is the op's own."""

    def __init__(self, op: Any, call: Callable[..., Any]) -> None:
        self._op, self._call = op, call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._op, name)


def _wrap_ops(recorder: Recorder) -> None:
    """Put a recorded stand-in for every communicating op of :data:`OP_NAMESPACES` where ``torch.ops``
    finds it (the namespace's attribute, which torch caches there itself)."""
    import torch

    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, op = qualified.partition("::")
        if namespace not in OP_NAMESPACES or op in NOT_COMMUNICATION or "." in op:
            continue
        space = getattr(torch.ops, namespace)
        try:
            packet = getattr(space, op)
        except (AttributeError, RuntimeError):
            continue
        if not isinstance(packet, _RecordedOp):
            label = f"torch.ops.{namespace}.{op}"
            setattr(space, op, stand_in := _RecordedOp(packet, recorder.wrap(label, packet)))
            recorder.installed.append((space, op, stand_in, label))
