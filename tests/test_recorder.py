"""The parts of a rank's flight recorder, each on its own and without processes, threads or torch: the
groups named from made-up process groups (lab.rank.groups), the program's calls as the recorder keeps
them (lab.rank.flight), torch's own recorder merged from made-up dumps (lab.rank.torchcalls), the watcher's ``flight``
fields made from the three (lab.rank.watcher), and the files saved and missed (lab.rank.files)."""
from __future__ import annotations

import gc
import inspect
import io
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lab.rank import protocol, torchfr
from lab.rank.callspec import INIT_PROCESS_GROUP, Spec, spec_for
from lab.rank.files import FILES_KEPT, Files
from lab.rank.flight import ASYNC_MAX, RETURNED, RING_MAX, SEQ, STATE, T0, T1, Call, Flight, to_json
from lab.rank.groups import GROUPS_MAX, Group, Groups
from lab.rank.torchcalls import TorchCalls
from lab.rank.watcher import Watcher

NON_GROUP_MEMBER = -100  # (torch's GroupMember.NON_GROUP_MEMBER: an int, not a group)


class ProcessGroup:
    """A made-up process group: its global ranks, torch's name for it, its sequence number."""

    def __init__(self, ranks: list[int], name: str) -> None:
        self.ranks, self.group_name, self.seq = ranks, name, 0

    def _get_sequence_number_for_group(self) -> int:
        return self.seq


def c10d(world: ProcessGroup, *others: ProcessGroup, rank: int = 0) -> SimpleNamespace:
    """A made-up ``distributed_c10d`` for rank ``rank`` of ``world``, which knows ``others`` too."""
    names = {pg: pg.group_name for pg in (world, *others)}
    return SimpleNamespace(GroupMember=SimpleNamespace(WORLD=world), _world=SimpleNamespace(pg_names=names),
                           get_process_group_ranks=lambda pg: pg.ranks, get_world_size=lambda: len(world.ranks),
                           get_rank=lambda: rank, _get_default_group=lambda: world)


def bound_groups(world: ProcessGroup, *others: ProcessGroup, rank: int = 0) -> Groups:
    groups = Groups()
    groups.bind(c10d(world, *others, rank=rank))
    return groups


# the functions whose signatures say where a call's arguments are, as torch.distributed's do
def all_reduce(tensor: Any, op: Any = None, group: Any = None, async_op: bool = False) -> None: ...
def send(tensor: Any, dst: Any = None, group: Any = None, tag: int = 0, group_dst: Any = None) -> None: ...


ALL_REDUCE: Spec = spec_for("all_reduce", all_reduce)
SEND: Spec = spec_for("send", send)
TENSOR = SimpleNamespace(shape=(2, 3), dtype="torch.float32")


def call(flight: Flight, spec: Spec = ALL_REDUCE, *args: Any, **kwargs: Any) -> Call:
    """A call the program makes here (this test's line is the user's)."""
    made = flight.begin(spec, args or (TENSOR,), kwargs, sys._getframe(1))
    assert made is not None
    return made


# --- the groups ------------------------------------------------------------------------------------


def test_a_new_group_is_named_by_its_ranks_and_the_groups_of_them_made_before() -> None:
    groups = bound_groups(ProcessGroup([0, 1, 2, 3], "0"), rank=2)
    made = [groups.new_group(([2, 0],), {}), groups.new_group((), {"ranks": [0, 2]}), groups.new_group(([1, 3],), {}),
            groups.new_group((), {})]
    assert [(group.gid, members, member) for group, members, member in filter(None, made)] == [
        ("g0,2#0", (0, 2), True), ("g0,2#1", (0, 2), True),
        ("g1,3#0", (1, 3), False),  # (rank 2 is not in it)
        ("g0,1,2,3#0", (0, 1, 2, 3), True)]  # (no ranks: the world's)
    assert made[0] is not None and made[1] is not None and made[0][0] is not made[1][0]


def test_a_new_group_before_the_world_formed_is_not_known() -> None:
    def not_formed() -> int:
        raise ValueError("Default process group has not been initialized")

    groups = Groups()
    groups.bind(SimpleNamespace(get_world_size=not_formed))
    assert groups.new_group((), {}) is None


def test_a_process_group_is_known_by_its_id_while_it_lives() -> None:
    world = ProcessGroup([0, 1, 2, 3], "0")
    groups = bound_groups(world)
    new = groups.new_group(([0, 1],), {})
    assert new is not None
    made = new[0]
    pg = ProcessGroup([0, 1], "1")
    groups.remember(pg, made)
    assert groups.of(pg) is made and groups.by_name["1"] is made
    assert groups.of(None) is groups.world and groups.of(world) is groups.world
    assert groups.of(NON_GROUP_MEMBER) is None  # (a call on a group this rank is not in)
    key = id(pg)
    assert key in groups.by_group
    del pg
    gc.collect()
    assert key not in groups.by_group  # (another group may come at its address)


def test_a_group_made_otherwise_is_named_by_its_ranks_and_torchs_name() -> None:
    split = ProcessGroup([3, 1], "7")
    groups = bound_groups(ProcessGroup([0, 1, 2, 3], "0"), split)
    group = groups.of(split)
    assert group is not None and group.gid == "g1,3@7"
    assert groups.of(split) is group
    unknown = groups.of(object())  # (no group torch knows: the call will say so)
    assert unknown is not None and unknown.gid == "g?"


def test_torchs_names_cover_the_groups_the_program_has_not_used_yet() -> None:
    world, mesh = ProcessGroup([0, 1, 2, 3], "0"), ProcessGroup([1, 3], "2")
    groups = bound_groups(world, mesh)
    groups.remember_world()
    named = groups.by_torch_name()
    assert named["0"] is groups.world and named["2"].gid == "g1,3@2"
    assert groups.ranks_by_name() == {"0": [0, 1, 2, 3], "2": [1, 3]}


def test_at_most_GROUPS_MAX_groups_are_kept_the_oldest_going_first_never_the_world() -> None:
    groups = bound_groups(ProcessGroup(list(range(GROUPS_MAX + 10)), "0"))
    made = [new[0] for n in range(GROUPS_MAX + 5) if (new := groups.new_group(([n, n + 1],), {}))]
    assert len(groups.by_gid) == GROUPS_MAX and "world" in groups.by_gid
    assert made[0] is not None and made[0].gid not in groups.by_gid
    assert made[-1] is not None and groups.by_gid[made[-1].gid] is made[-1]


def test_the_counts_are_of_the_groups_that_completed_a_call() -> None:
    groups = Groups()
    groups.world.counts["all_reduce"] = 2
    groups.by_gid["g0,1#0"] = Group("g0,1#0")
    assert groups.counts() == {"world": {"all_reduce": 2}}


# --- the program's calls ---------------------------------------------------------------------------


def test_a_blocking_call_is_in_flight_until_it_returns_then_done_and_counted() -> None:
    flight = Flight(Groups())
    line = sys._getframe().f_lineno + 1
    made = call(flight)
    assert flight.blocking() == [(made, made[T0])]
    said = to_json(made)
    assert (said["seq"], said["group"], said["op"], said["state"], said["shape"], said["numel"], said["dtype"]) == \
        (1, "world", "all_reduce", "in_flight", [2, 3], 6, "float32")
    assert said["where"] == f"test_recorder.py:{line}"
    flight.ended(made, None)
    assert to_json(made)["state"] == "done" and made[T1] == flight.changed_at
    assert flight.blocking() == [] and flight.completed == 1 and flight.groups.counts() == {"world": {"all_reduce": 1}}


def test_a_call_that_raises_says_its_error_and_is_not_counted_done() -> None:
    flight = Flight(Groups())
    made = call(flight)
    flight.failed(made, RuntimeError("Connection closed by peer"))
    said = to_json(made)
    assert (said["state"], said["error"]) == ("raised", "RuntimeError: Connection closed by peer")
    assert flight.completed == 1 and flight.groups.counts() == {}


def test_collectives_and_point_to_point_calls_are_numbered_apart_per_group() -> None:
    world = ProcessGroup([0, 1, 2, 3], "0")
    flight = Flight(bound_groups(world))
    new = flight.groups.new_group(([0, 1],), {})
    assert new is not None
    pair = new[0]
    pg = ProcessGroup([0, 1], "1")
    flight.groups.remember(pg, pair)
    calls = [call(flight, SEND, TENSOR, 1), call(flight), call(flight, SEND, TENSOR, 3),
             call(flight, ALL_REDUCE, TENSOR, group=pg)]
    assert [(c["op"], c["group"], c["seq"], c["peer"]) for c in map(to_json, calls)] == [
        ("send", "world", 1, 1), ("all_reduce", "world", 1, None), ("send", "world", 2, 3),
        ("all_reduce", "g0,1#0", 1, None)]
    assert flight.begin(ALL_REDUCE, (TENSOR,), {"group": NON_GROUP_MEMBER}, sys._getframe()) is None


def test_the_ring_keeps_the_last_RING_MAX_records() -> None:
    flight = Flight(Groups())
    for _ in range(RING_MAX + 5):
        flight.ended(call(flight), None)
    assert len(flight.ring) == RING_MAX and flight.begun == RING_MAX + 5
    assert flight.ring[0][SEQ] == 6 and flight.ring[-1][SEQ] == RING_MAX + 5


class Work:
    """A made-up Work: completed or not, its exception, and what the recorder said while it waited."""

    def __init__(self, flight: Flight, completed: bool = False, exception: BaseException | None = None) -> None:
        self.flight, self.completed, self.error = flight, completed, exception
        self.seen_waiting: list[tuple[Call, str]] = []

    def is_completed(self) -> bool:
        return self.completed

    def exception(self) -> BaseException | None:
        return self.error

    def wait(self) -> bool:
        self.seen_waiting = [(call, call[STATE]) for call, _ in self.flight.blocking()]
        return True


def async_flight() -> Flight:
    flight = Flight(Groups())
    flight.work_class = type("WorkClass", (Work,), {})  # (a class of its own: the recorder wraps its wait)
    return flight


def test_an_async_call_is_in_flight_until_waited_and_waiting_while_it_is() -> None:
    flight = async_flight()
    made = call(flight)
    work = flight.work_class(flight)
    flight.ended(made, work)
    assert to_json(made)["async"] is True and to_json(made)["state"] == "in_flight"
    assert flight.blocking() == [] and flight.not_waited() == ([made], 0)
    work.wait()
    assert work.seen_waiting == [(made, "waiting")]
    assert to_json(made)["state"] == "done" and flight.not_waited() == ([], 0)
    assert flight.completed_async == 1 and flight.groups.counts() == {"world": {"all_reduce": 1}}


def test_an_async_call_whose_work_completed_unwaited_is_done_when_polled() -> None:
    flight = async_flight()
    done, failed, running = call(flight), call(flight), call(flight)
    flight.ended(done, flight.work_class(flight, completed=True))
    flight.ended(failed, flight.work_class(flight, completed=True, exception=RuntimeError("gloo: timed out")))
    flight.ended(running, flight.work_class(flight))
    flight.poll()
    assert [to_json(c)["state"] for c in (done, failed, running)] == ["done", "raised", "in_flight"]
    assert to_json(failed)["error"] == "RuntimeError: gloo: timed out"
    assert flight.not_waited() == ([running], 0) and flight.completed_async == 2


def test_at_most_ASYNC_MAX_unwaited_calls_are_kept_the_oldest_let_go_of_and_counted() -> None:
    flight = async_flight()
    calls = [call(flight) for _ in range(ASYNC_MAX + 3)]
    for made in calls:
        flight.ended(made, flight.work_class(flight))
    kept, dropped = flight.not_waited()
    assert dropped == 3 and kept == calls[3:]


def test_a_batchs_calls_are_each_their_works_or_all_one_works() -> None:
    flight = async_flight()
    flight.begin_batch()
    one, two = call(flight, SEND, TENSOR, 1), call(flight, SEND, TENSOR, 2)
    works = [flight.work_class(flight), flight.work_class(flight)]
    flight.ended(one, works[0])
    flight.ended(two, works[1])
    assert flight.not_waited() == ([], 0)  # (paired with their Works when the batch returns)
    flight.end_batch(works)
    assert sorted(map(id, flight.not_waited()[0])) == sorted([id(one), id(two)])
    works[0].wait()
    assert flight.not_waited()[0] == [two]
    flight.begin_batch()
    three, four = call(flight, SEND, TENSOR, 1), call(flight, SEND, TENSOR, 2)
    coalesced = flight.work_class(flight)
    flight.ended(three, coalesced)
    flight.ended(four, coalesced)
    flight.end_batch([coalesced])  # (a backend that coalesces: one Work for the batch)
    coalesced.wait()
    assert [to_json(c)["state"] for c in (three, four)] == ["done", "done"]


# --- torch's own recorder, merged -----------------------------------------------------------------


def entry(record_id: int, at: float, seq: int = 1, retired: bool = False, group: str = "0",
          op: str = "gloo:all_reduce") -> dict[str, Any]:
    """An entry of torch's recorder, as its JSON dump gives it."""
    return {"record_id": record_id, "collective_seq_id": seq, "time_created_ns": int(at * 1e9),
            "process_group": [group, "default_pg"], "profiling_name": op, "input_sizes": [[256]],
            "input_dtypes": ["Float"], "retired": retired}


@pytest.fixture
def dump(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """torch's recorder as the next read finds it (set its entries); the reads are counted."""
    found: dict[str, Any] = {"entries": [], "reads": 0}

    def read() -> dict[str, Any]:
        found["reads"] += 1
        return {"entries": list(found["entries"])}

    monkeypatch.setattr(torchfr, "read", read)
    return found


def at(made: Call, t0: float, returned: float | None = None, t1: float | None = None) -> Call:
    """The record as if the call began at ``t0``, returned at ``returned`` (None: not yet) and ended at
    ``t1`` (None: it has not, or it is async and not waited)."""
    made[T0], made[RETURNED], made[T1] = t0, returned, t1
    return made


def torch_flight(world: ProcessGroup) -> tuple[Flight, TorchCalls]:
    groups = bound_groups(world)
    groups.remember_world()
    flight = Flight(groups)
    return flight, TorchCalls(flight, groups)


def test_a_collective_torch_issued_is_numbered_among_its_groups_where_it_came(dump: dict[str, Any]) -> None:
    flight, torch = torch_flight(ProcessGroup([0, 1], "0"))
    first = call(flight)
    flight.ended(first, None)
    at(first, 100.0, 100.5, 100.5)
    later = at(call(flight), 102.0)  # (begun after torch issued its own: it moves one number on)
    dump["entries"] = [entry(0, 100.2), entry(1, 101.0, seq=2)]  # (the first, made inside the program's call)
    inflight = torch.read(103.0)
    assert [(c["seq"], c["op"], c["by"], c["state"], c["shape"], c["dtype"], c["t0"]) for c in map(to_json, inflight)] \
        == [(2, "all_reduce", "torch's", "in_flight", [256], "float32", 101.0)]
    assert list(torch.issued) == inflight and to_json(later)["seq"] == 3 and flight.groups.world.collectives == 3
    dump["entries"] = [entry(0, 100.2, retired=True), entry(1, 101.0, seq=2, retired=True)]
    assert torch.read(104.0) == []
    assert (to_json(inflight[0])["state"], to_json(inflight[0])["t1"]) == ("done", 104.0)
    assert torch.completed == 1 and torch.changed_at == 104.0
    assert flight.groups.counts() == {"world": {"all_reduce": 2}}  # (the program's first and torch's)


def test_entries_of_no_known_group_or_no_collective_are_left_out(dump: dict[str, Any]) -> None:
    flight, torch = torch_flight(ProcessGroup([0, 1], "0"))
    dump["entries"] = [entry(0, 100.0, seq=0), entry(1, 100.0, group="9"), {"record_id": "x"},
                       entry(2, 100.0, retired=True, op="gloo:broadcast")]
    assert torch.read(101.0) == []
    assert [(c["seq"], c["op"], c["state"], c["t1"]) for c in map(to_json, torch.issued)] == \
        [(1, "broadcast", "done", None)]  # (retired before any read saw it: when, gloo does not say)
    assert torch.changed_at == float("-inf")


def test_a_ddp_programs_collectives_from_torch_are_ddps(dump: dict[str, Any]) -> None:
    flight, torch = torch_flight(ProcessGroup([0, 1], "0"))
    flight.ddp = True  # (as the wrapped DistributedDataParallel.__init__ says)
    dump["entries"] = [entry(0, 100.0)]
    assert [to_json(c)["by"] for c in torch.read(101.0)] == ["DDP's"]


def test_torchs_recorder_is_read_again_only_when_it_may_say_something_new(dump: dict[str, Any]) -> None:
    world = ProcessGroup([0, 1], "0")
    flight, torch = torch_flight(world)
    torch.c10d = flight.groups.c10d  # (its groups' sequence numbers: the mark)
    dump["entries"] = [entry(0, 100.0, retired=True)]
    torch.read(101.0)
    torch.read(102.0)
    assert dump["reads"] == 1  # (the groups' numbers stood still and nothing was in flight)
    world.seq += 1
    dump["entries"].append(entry(1, 102.5, seq=2))
    assert len(torch.read(103.0)) == 1 and torch.read(104.0) != [] and dump["reads"] == 3  # (one in flight)
    assert len(torch.issued) == 2  # (each entry once, however often it is read)


# --- the watcher's dump, from the three --------------------------------------------------------------


def test_a_dump_holds_the_programs_records_and_torchs_oldest_first_and_every_call_in_flight(
        dump: dict[str, Any]) -> None:
    flight, torch = torch_flight(ProcessGroup([0, 1], "0"))
    flight.work_class = type("WorkClass", (Work,), {})
    done, unwaited, blocked = call(flight), call(flight), call(flight)
    flight.ended(done, None)
    flight.ended(unwaited, flight.work_class(flight))
    at(done, 100.0, 100.5, 100.5)
    at(unwaited, 101.0, 101.1)
    at(blocked, 103.0)
    dump["entries"] = [entry(0, 102.0, seq=3)]
    fields = Watcher(flight, flight.groups, torch, Files(flight)).snapshot()
    issued = list(torch.issued)
    assert fields["records"] == [to_json(c) for c in (done, unwaited, issued[0], blocked)]
    assert fields["inflight"] == [to_json(c) for c in (unwaited, issued[0], blocked)]
    assert (fields["counts"], fields["dropped"], "steps" in fields, "files" in fields) == \
        ({"world": {"all_reduce": 1}}, 0, False, False)


def test_a_call_a_look_sends_has_the_number_torchs_collectives_before_it_give_it(
        dump: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A gather right after DDP's training took its number as it began, before any read found DDP's
    collectives: the look that names it in a progress (the last word of a rank that dies in it) reads
    torch's recorder first, so the number it says is the one the other ranks have for it."""
    flight, torch = torch_flight(ProcessGroup([0, 1], "0"))
    init = call(flight)
    flight.ended(init, None)
    at(init, 100.0, 100.5, 100.5)
    gather = at(call(flight), 102.0)
    assert to_json(gather)["seq"] == 2  # (as it began: DDP's were not read yet)
    dump["entries"] = [entry(0, 101.0, seq=2, retired=True), entry(1, 101.5, seq=3, retired=True)]
    sent: list[tuple[str, dict[str, Any]]] = []
    channel = SimpleNamespace(token="t", send=lambda event, **fields: sent.append((event, fields)),
                              write=lambda line: sent.append(("line", {})))
    monkeypatch.setattr(protocol, "CHANNEL", channel)
    Watcher(flight, flight.groups, torch, Files(flight))._tick(102.2)
    assert [fields["inflight"]["seq"] for event, fields in sent if event == "progress"] == [4]


def test_a_ranks_last_word_counts_the_collective_torch_retires_just_after_its_last_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """gloo retires a collective on its own thread after its Work completed: a rank that ends right after
    its last wait (DDP's gradient all_reduce, then destroy_process_group and return) finds it still in
    flight as it says its last word. It reads torch's recorder again until torch has retired it, and says
    it made every one it did (the others' report names how many: "rank 2 finished after 4")."""
    flight, torch = torch_flight(ProcessGroup([0, 1], "0"))
    init = call(flight)
    flight.ended(init, None)
    at(init, 100.0, 100.5, 100.5)
    reads = 0

    def retired_on_the_third_read() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"entries": [entry(0, 101.0, seq=2, retired=reads >= 3)]}

    monkeypatch.setattr(torchfr, "read", retired_on_the_third_read)
    written: list[str] = []
    monkeypatch.setattr(protocol, "CHANNEL", SimpleNamespace(
        token="t", send=lambda event, **fields: None, write=lambda line: written.append(line.decode())))
    watcher = Watcher(flight, flight.groups, torch, Files(flight))
    watcher.thread, watcher.pid = threading.current_thread(), os.getpid()  # (as watch() would have them)
    watcher.finish()
    [last] = [json.loads(line.split(" ", 1)[1]) for line in written]
    assert last["event"] == "flight" and reads >= 3, (last, reads)
    assert last["counts"] == {"world": {"all_reduce": 2}} and last["inflight"] == [], last


def test_no_look_reads_torchs_recorder_while_a_group_is_being_made(
        dump: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's dump reads its table of groups unlocked, which a group being made writes: a look while
    init_process_group (or new_group) is in flight leaves torch's recorder alone."""
    flight, torch = torch_flight(ProcessGroup([0, 1], "0"))
    call(flight, INIT_PROCESS_GROUP)
    monkeypatch.setattr(protocol, "CHANNEL", SimpleNamespace(token="t", send=lambda event, **fields: None,
                                                             write=lambda line: None))
    Watcher(flight, flight.groups, torch, Files(flight))._tick(102.2)
    assert dump["reads"] == 0


def all_to_all_single(output: Any, input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None,
                      group: Any = None, async_op: bool = False) -> None: ...


class Unreadable:
    def __len__(self) -> int:
        raise RuntimeError("a program's own object")


def test_an_all_to_all_keeps_its_splits_as_given_then_and_none_it_cannot_read() -> None:
    flight, _ = torch_flight(ProcessGroup([0, 1], "0"))
    spec = spec_for("all_to_all_single", all_to_all_single)
    sends, expects = [3, 1], [2, 2]
    made = call(flight, spec, TENSOR, TENSOR, expects, sends)
    sends[0] = 99  # (changed once the call returned: the record is of the call)
    assert (to_json(made)["in_splits"], to_json(made)["out_splits"]) == ([3, 1], [2, 2])
    for odd in (Unreadable(), [1, "x"], [-1, 2], []):
        assert "in_splits" not in to_json(call(flight, spec, TENSOR, TENSOR, input_split_sizes=odd))
    assert "in_splits" not in to_json(call(flight, ALL_REDUCE))



def all_gather(tensor_list: Any, tensor: Any, group: Any = None, async_op: bool = False) -> None: ...


def gather(tensor: Any, gather_list: Any = None, dst: Any = None, group: Any = None, async_op: bool = False,
           group_dst: Any = None) -> None: ...


def sized(n: int) -> SimpleNamespace:
    return SimpleNamespace(shape=(n,), dtype="torch.float32", numel=lambda: n)


def test_a_gather_keeps_the_tensor_it_sends_and_the_size_of_each_it_takes() -> None:
    flight, _ = torch_flight(ProcessGroup([0, 1, 2], "0"))
    spec = spec_for("all_gather", all_gather)
    room = [sized(30), sized(31), sized(30)]
    made = to_json(call(flight, spec, room, sized(31)))
    room.append(sized(5))  # (changed once the call returned: the record is of the call)
    assert (made["numel"], made["out_splits"], "in_splits" in made) == (31, [30, 31, 30], False)
    off_root = to_json(call(flight, spec_for("gather", gather), sized(4), None, 0))  # (a gather_list is its root's)
    assert off_root["numel"] == 4 and "out_splits" not in off_root
    assert "out_splits" not in to_json(call(flight, spec, Unreadable(), sized(3)))

# --- the files a program saves and misses (lab.rank.files) --------------------------------------------------


def test_the_files_saved_and_looked_for_in_vain_are_kept_with_the_programs_line(tmp_path: Path) -> None:
    files = Files(Flight(Groups()))
    stored: dict[str, bytes] = {}

    def save(obj: object, f: Any) -> None:
        if isinstance(f, (str, os.PathLike)):
            stored[os.fspath(f)] = b"saved"

    def load(f: Any) -> bytes:
        if os.fspath(f) not in stored:
            raise FileNotFoundError(2, "No such file or directory", os.fspath(f))
        return stored[os.fspath(f)]

    saving, loading = files._wrap(save, "saved"), files._wrap(load, "missing")
    with pytest.raises(FileNotFoundError):
        loading(tmp_path / "ckpt.pt")  # (each is kept with the line of its call)
    saving({}, str(tmp_path / "ckpt.pt"))
    saving({}, io.BytesIO())  # (no path: not kept)
    assert loading(f=tmp_path / "ckpt.pt") == b"saved"  # (found: not kept)
    line = inspect.currentframe().f_lineno  # type: ignore[union-attr]
    kept = files.to_json()
    assert [k[:3] for k in kept] == [["saved", str(tmp_path / "ckpt.pt"), f"test_recorder.py:{line - 3}"],
                                     ["missing", str(tmp_path / "ckpt.pt"), f"test_recorder.py:{line - 4}"]]
    assert all(abs(k[3] - time.time()) < 60 for k in kept)
    for n in range(FILES_KEPT + 3):
        saving({}, f"/run/ckpt-{n}.pt")
    saving({}, "/run/ckpt-5.pt")  # (saved again: the newest)
    saved = [path for kind, path, _, _ in files.to_json() if kind == "saved"]
    assert len(saved) == FILES_KEPT and saved[-1] == "/run/ckpt-5.pt" and "/run/ckpt-2.pt" not in saved
