"""The flight recorder's watcher: the one thread of a rank's recorder, that looks at the calls in
flight (``lab.rank.flight``'s, and torch's own: ``lab.rank.torchcalls``) and at the rank's TCP
connections, and sends what it finds on the rank's channel (``lab.rank.protocol.CHANNEL``).

``progress`` {rank, completed, inflight, moved, quiet}: the calls completed (or raised) so far, the
blocking call the rank is in (the oldest, if several threads are) and, while one is, the bytes the
process's TCP connections carried (``lab.rank.tcpinfo.traffic``; the rendezvous stores' connections
left out: polling them is no progress) and for how many seconds (on the rank's own clock) none of
that changed. When it is news and when to look next is the rule of quiet's (``lab.rank.quiet``),
which the watcher only feeds and obeys.

``flight`` {rank, records, inflight, counts, dropped, [steps], [made], [destroyed], [timeouts]}: the records (the
program's and those torch issued, oldest first), the calls in flight, the groups' counts
(``lab.rank.groups``), a DDP program's steps, the groups the rank made, where it destroyed the
world and the timeouts its groups were given (``lab.rank.flight``), made to
fit an event line (:func:`fit`: the oldest records go first; ``dropped`` counts the calls left out).
One is sent once per blocking call in flight FLIGHT_AFTER seconds, right after the progress that
says a call has been quiet for --hang-after, and at the end (:meth:`Watcher.finish`: the worker's
"done", atexit). Dumps but the last stop after FLIGHT_BUDGET bytes, so that a program with many
slow calls is not cut off for sending too much. With the run's --fr-dir (TORCH_DUMPS_VAR), each dump
is followed by torch's own recorder as torch's analyzer reads it (``torchdump``).

``trace`` {rank, records, dropped} (the run's --trace, TRACE_VAR): at each look, the records that
began or changed state since the last trace event, up to TRACE_BUDGET bytes in all.

Standard library only: the recorder's parts are given, and it looks only while the rank has a
channel (:meth:`Watcher.watch`).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from typing import Any

from lab.rank import protocol, tcpinfo, torchfr
from lab.rank.callspec import INIT_PROCESS_GROUP, NEW_GROUP
from lab.rank.files import FILES, Files
from lab.rank.flight import DUMPED, FLIGHT, OP, RING_MAX, STATE, T0, Call, Flight, to_json
from lab.rank.groups import Groups
from lab.rank.protocol import EVENT_MAX
from lab.rank.quiet import PROGRESS_EVERY, Look, Quiet
from lab.rank.torchcalls import TORCH_CALLS, TorchCalls

HANG_AFTER_VAR = "LAB_HANG_AFTER"  # the run's --hang-after, in every rank's environment
TRACE_VAR = "LAB_TRACE"  # "1": send every record as it begins and ends (``trace`` events: the run's --trace)
TORCH_DUMPS_VAR = "LAB_TORCH_DUMPS"  # "1": send torch's own recorder with each dump (the run's --fr-dir)
TRACE_BUDGET = 16 << 20  # bytes of trace events a rank sends; past it, what is left out is counted
FLIGHT_AFTER = 2.0  # seconds a blocking call is in flight before the rank dumps its records
FLIGHT_BUDGET = 8 << 20  # bytes of dumps sent before the last one (the last is always sent)
TORCH_SETTLE = 0.5  # seconds a rank's last word waits at most for torch to retire the collectives it issued
GROUP_MAKERS = frozenset({INIT_PROCESS_GROUP.op, NEW_GROUP.op})  # the calls that make a process group


class Watcher:
    """The thread that looks at the calls in flight (``flight``'s and ``torch``'s) and sends what the
    rank says, with ``groups``' counts (one: :data:`WATCHER`)."""

    def __init__(self, flight: Flight, groups: Groups, torch: TorchCalls, files: Files) -> None:
        self.flight, self.groups, self.torch, self.files = flight, groups, torch, files
        self.rank = -1
        self.pid = 0
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.quiet = Quiet()  # how long nothing moved, look after look (the run's --hang-after: HANG_AFTER_VAR)
        self.finished: tuple[Call, int] | None = None  # (the newest record, completed) at the last final dump
        self.dump_bytes = 0
        # --trace: each record's state when a trace event last took it, the calls begun when the last
        # trace event was sent, the calls left out (the ring let go of them first, or past the budget)
        self.tracing = False
        self.traced: dict[int, tuple[Call, str]] = {}
        self.begun_traced = self.trace_dropped = self.trace_bytes = 0
        self.torch_dumps = False

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
        """One look; the seconds to the next. A call of the program's took its number among its group's
        collectives as it began, counting those torch issued that a read had found by then; a look
        that sends one (the call a progress names, a trace's records) reads torch's recorder first,
        so that it goes out with the number it has on every rank (DDP's collectives counted before
        the gather right after training, which a rank may die in before any other look). Not while a
        call that makes a group is in flight: torch's dump reads its table of groups unlocked, as a
        group being made writes it (a call that makes one is a world's or group's first, numbered
        without torch's)."""
        self.flight.poll()
        blocking = self.flight.blocking()
        if (blocking or self.tracing) and not any(call[OP] in GROUP_MAKERS for call, _ in blocking):
            self.torch.read(now)
        if not blocking:
            blocking = self.torch.blocking(now)
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
        channel, flight = protocol.CHANNEL, self.flight
        calls = [*flight.ring, *self.torch.issued]
        fresh = [call for call in calls if (seen := self.traced.get(id(call))) is None or seen[0] is not call
                 or seen[1] != call[STATE]]
        kept = {id(call) for call in calls}
        self.traced = {key: seen for key, seen in self.traced.items() if key in kept}
        new = sum(1 for call in flight.ring if id(call) not in self.traced)
        self.trace_dropped += max(0, flight.begun - self.begun_traced - new)  # (began and left the ring unseen)
        self.begun_traced = flight.begun
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
        completed = self._completed()
        moved, mark = tcpinfo.traffic(self._stores())
        verdict = self.quiet.look(Look(completed, None if inflight is None else id(inflight),
                                       "" if inflight is None else inflight[STATE],
                                       None if oldest is None else oldest[1], mark, self._changed_at(),
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
        ports = set(self.flight.store_ports)
        with contextlib.suppress(ValueError):
            ports.add(int(os.environ.get("MASTER_PORT") or 0))
        return frozenset(ports - {0})

    def _completed(self) -> int:
        """The calls completed (or that raised) so far: the program's, blocking and async, and torch's."""
        return self.flight.completed + self.flight.completed_async + self.torch.completed

    def _changed_at(self) -> float:
        """When (time.time) the newest call ended: the program's or one torch issued."""
        return max(self.flight.changed_at, self.torch.changed_at)

    def finish(self) -> None:
        """The rank's last word (the worker's "done", and atexit): stop the watcher's thread, send the
        last progress and a last dump, unless nothing was recorded or nothing changed since."""
        if self.thread is None or os.getpid() != self.pid:  # (a forked child has no thread of ours)
            return
        self.stop.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=2 * PROGRESS_EVERY)
        self.flight.poll()
        self._torch_settled()
        try:
            self._progress(self.flight.blocking())
        except OSError:
            return
        ring = self.flight.ring
        last, completed = ring[-1] if ring else None, self._completed()
        if last is None or (self.finished is not None and self.finished[0] is last and self.finished[1] == completed):
            return
        self.finished = (last, completed)
        try:
            if self.tracing:
                self._trace()
            self._dump(last=True)
        except OSError:
            pass

    def _torch_settled(self) -> None:
        """Read torch's recorder until none of the collectives it issued is in flight (TORCH_SETTLE seconds
        at most): gloo retires one on its own thread after its Work completed, so a rank that ends right
        after the last wait (DDP's gradient all_reduce in backward(), then destroy_process_group and
        return) would say it made one fewer than it did, as its last word."""
        deadline = time.monotonic() + TORCH_SETTLE
        while self.torch.read(time.time()) and time.monotonic() < deadline:
            time.sleep(0.01)

    def snapshot(self) -> dict[str, Any]:
        """The fields of a ``flight`` event: the records (the program's and those torch issued, oldest
        first), the calls in flight, the counts."""
        flight = self.flight
        issued = self.torch.read(time.time())
        waiting, dropped = flight.not_waited()
        ring = sorted((*flight.ring, *self.torch.issued), key=lambda call: call[T0])[-RING_MAX:]
        counts = self.groups.counts()
        blocking = [call for call, _ in flight.blocking()]
        inflight = sorted({id(call): call for call in (*blocking, *waiting, *issued)}.values(),
                          key=lambda call: call[T0])
        steps, made, destroyed = flight.steps_to_json(), flight.made_to_json(), flight.destroyed_to_json()
        timeouts, files = flight.timeouts_to_json(), self.files.to_json()
        return {"rank": self.rank, "records": [to_json(call) for call in ring],
                "inflight": [to_json(call) for call in inflight], "counts": counts, "dropped": dropped,
                **({"steps": steps} if steps else {}), **({"made": made} if made else {}),
                **({"destroyed": destroyed} if destroyed else {}), **({"timeouts": timeouts} if timeouts else {}),
                **({"files": files} if files else {})}

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
                dump = torchfr.analyzable(dump, self.groups.ranks_by_name())
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


WATCHER = Watcher(FLIGHT, FLIGHT.groups, TORCH_CALLS, FILES)
