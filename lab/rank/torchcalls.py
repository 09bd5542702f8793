"""The collectives torch issues itself, as a rank's flight recorder keeps them: read from torch's own
flight recorder (``lab.rank.torchfr``) and merged with the records of the program's calls
(``lab.rank.flight``), so that what reaches the backend without the lab's wrappers (DDP's reducer in
C++, the functional collectives) is recorded too, as torch's (``by``: "DDP's gradient", "DDP's",
"torch's").

An entry made within one of the program's collectives on its group is part of that call
(``all_gather_object``'s two all_gathers); any other is a collective torch issued, a record of its
own, counted among its group's collectives where it came: the program's calls on the group that
began after it move one number on, so that the n-th collective of a group is the same call on every
rank, whoever issued it. gloo leaves no completion time: such a call is done when torch retires it
(seen by the read that finds it retired). A read costs about 20 us an entry, so it is made only
when it may say something new: the process groups' sequence numbers changed, or a collective torch
issued is still in flight.

When no call of the program's blocks, a rank whose main thread waits in a collective torch issued
(DDP's gradient all_reduce at the end of ``backward()``) is in a call: the oldest in flight, when the
thread's CPU clock did not move between two looks (:meth:`TorchCalls.blocking`, the watcher's looks;
a rank that computes while a collective is under way, DDP's overlap, moves its clock). A program
that ends on the backend's error raised inside torch has it told as the error of the collective
torch issued that it came from (:meth:`TorchCalls.raised`).

Standard library only until :meth:`TorchCalls.bind` is called (torch is imported by then); what it
reads of torch's recorder is a dump, so the merging is tested on made-up ones.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections import deque
from types import CodeType, FrameType, TracebackType
from typing import Any

from lab.rank import torchfr
from lab.rank.flight import (
    BY,
    CALLER,
    CODE,
    ERROR,
    ERROR_MAX,
    FLIGHT,
    GROUP,
    LASTI,
    OP,
    RETURNED,
    RING_MAX,
    SEQ,
    STATE,
    T0,
    T1,
    WALK_MAX,
    Call,
    Flight,
    call_error,
    is_count,
)
from lab.rank.groups import Groups
from lab.rank.ops import BATCHES, P2P

MAIN_STILL = 0.005  # seconds of CPU the main thread may use between two looks and still be waiting
NOT_COLLECTIVE = frozenset({*P2P, *BATCHES})  # calls numbered apart from the collectives


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


def _innermost_users(tb: TracebackType | None, internal: tuple[str, ...]) -> tuple[CodeType, int] | None:
    """The code and offset of a traceback's innermost frame outside torch and the lab."""
    found = None
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(internal):
            found = (tb.tb_frame.f_code, tb.tb_lasti)
        tb = tb.tb_next
    return found


class TorchCalls:
    """The collectives torch issued on this process's groups, beside ``flight``'s records of the
    program's calls (one: :data:`TORCH_CALLS`)."""

    def __init__(self, flight: Flight, groups: Groups) -> None:
        self.flight, self.groups = flight, groups
        self.lock = threading.Lock()  # (the watcher's thread reads, and the main thread as the program raises)
        # torch's recorder as last read: the collectives torch issued itself (the program's own calls take
        # torch's numbers instead), those in flight by torch's record_id, the newest entry read, the groups'
        # sequence numbers then (unchanged with none in flight: no news)
        self.issued: deque[Call] = deque(maxlen=RING_MAX)
        self.issued_by_id: dict[int, Call] = {}
        self.read_id = -1
        self.read_mark: tuple[int, ...] | None = None
        self.completed = 0  # the collectives torch issued that it retired
        self.changed_at = -math.inf  # when (time.time) a read found the newest of them retired
        self.main_cpu: float | None = None  # the main thread's CPU time at the last look (its clock's word)
        self.main_moved_at = -math.inf  # when (time.time) a look last found it had run
        self.main_clock: int | None = None
        self.waited: Call | None = None  # the collective torch issued that the last look found the main thread in
        self.c10d: Any = None
        self.dist_error: Any = ()  # torch.distributed.DistError: the backend's errors

    def bind(self) -> None:
        """Take what the reading needs from torch (imported by now), and keep torch's recorder short
        (each read costs per entry) unless the environment sizes it."""
        import torch
        import torch.distributed.distributed_c10d as c10d

        self.c10d = c10d
        self.dist_error = getattr(torch.distributed, "DistError", ())
        torchfr.default_buffer()

    def read(self, now: float) -> list[Call]:
        """Read torch's recorder (lab.rank.torchfr) where it may say something new: its entries that are
        collectives torch issued become records here (the module says how), done once torch retires
        them. Returns those still in flight, oldest first."""
        with self.lock:
            return self._read(now)

    def _read(self, now: float) -> list[Call]:
        mark = self._mark()
        if mark is not None and mark == self.read_mark and not self.issued_by_id:
            return []
        self.read_mark = mark
        entries = torchfr.read().get("entries")
        if not isinstance(entries, list):
            return []
        names = self.groups.by_torch_name()
        ring = list(self.flight.ring)
        # (an entry older than the oldest record kept may be a call of the program's that left the ring)
        horizon = ring[0][T0] if len(ring) == RING_MAX else -math.inf
        program = [call for call in ring if call[OP] not in NOT_COLLECTIVE]
        newest = self.read_id
        for entry in entries:
            rid, created = entry.get("record_id"), entry.get("time_created_ns")
            if not (is_count(rid) and is_count(entry.get("collective_seq_id")) and entry["collective_seq_id"] > 0
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
                    "DDP's" if self.flight.ddp else "torch's", None, None, None, None]
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
        if tb is None or not tb.tb_frame.f_code.co_filename.startswith(self.flight.torch_dir) or not (
                isinstance(exc, self.dist_error) or "gloo" in str(exc)[:ERROR_MAX]):
            return  # (not the backend's: DDP's own checks raise inside torch too)
        self.read(time.time())
        ended = max((call[T1] for call in list(self.flight.ring) if call[T1] is not None), default=-math.inf)
        call = max((c for c in self.issued if c[T0] >= ended), key=lambda c: c[T0], default=None)
        if call is None:
            return
        if call[STATE] == "done":
            counts = call[GROUP].counts
            counts[call[OP]] = counts.get(call[OP], 1) - 1
        self._settled(call)
        call[STATE], call[ERROR], call[T1] = "raised", call_error(exc), time.time()
        if call[CODE] is None:
            call[CODE], call[LASTI] = _innermost_users(exc.__traceback__, self.flight.internal) or (None, 0)
            call[CALLER] = self.flight.caller(tb.tb_frame, call[CODE])
        if self.flight.ddp and call[BY] == "DDP's" and call[OP] == "all_reduce" and _in_backward(tb.tb_frame):
            call[BY] = "DDP's gradient"

    def _retired(self, call: Call, seen: float | None) -> None:
        """A collective torch issued completed (by ``seen``, when a read saw it in flight before)."""
        call[STATE], call[T1] = "done", seen
        self._settled(call)
        counts = call[GROUP].counts
        counts[call[OP]] = counts.get(call[OP], 0) + 1
        self.completed += 1
        if seen is not None:
            self.changed_at = max(self.changed_at, seen)

    def _settled(self, call: Call) -> None:
        """A collective torch issued is no longer in flight."""
        for rid, other in list(self.issued_by_id.items()):
            if other is call:
                del self.issued_by_id[rid]

    def _mark(self) -> tuple[int, ...] | None:
        """The process groups' sequence numbers (each counts the collectives issued on it): while they
        stay the same and nothing was in flight, torch's recorder has nothing new."""
        try:
            return tuple(pg._get_sequence_number_for_group() for pg in list(self.c10d._world.pg_names))
        except Exception:  # (a torch that cannot say: read every time)
            return None

    def blocking(self, now: float) -> list[tuple[Call, float]]:
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
        inflight = self.read(now)
        if not inflight:
            return []
        call = self.waited = inflight[0]
        call[STATE] = "waiting"
        if call[CODE] is None:
            frame = sys._current_frames().get(threading.main_thread().ident or 0)
            call[CODE], call[LASTI] = self.flight.user_frame(frame)
            call[CALLER] = self.flight.caller(frame, call[CODE])
            if self.flight.ddp:
                call[BY] = "DDP's gradient" if call[OP] == "all_reduce" and _in_backward(frame) else "DDP's"
        return [(call, max(call[T0], self.main_moved_at))]


TORCH_CALLS = TorchCalls(FLIGHT, FLIGHT.groups)
