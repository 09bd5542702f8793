"""The flight recorder (lab.rank.flight, and its watcher: lab.rank.watcher): what a rank records of
its torch.distributed calls and what it tells the controller, on real gloo ranks started as ``lab
launch`` starts them (``python -m lab.rank.script``) or as the lab's worker, and through the
controller (lab.core.runner) for a real hang; the events' formats and bounds on synthetic data."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from lab.core.planner import build_launch_plan
from lab.core.runner import run_plan
from lab.inventory.hosts import local_inventory
from lab.rank.callspec import P2P
from lab.rank.events import Flight, MalformedEvent, Progress, parse_event
from lab.rank.flight import RING_MAX
from lab.rank.protocol import EVENT_MAX, event_line
from lab.rank.watcher import fit

from .conftest import REPO, lines_of, run_ranks_as_the_lab_does

TOKEN = "flighttoken"

# --- the events, on synthetic data -------------------------------------------------------------


def record(seq: int, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "group": "world", "op": "all_reduce", "numel": 1, "shape": [1], "dtype": "float32",
            "peer": None, "root": None, "tag": None, "reduce_op": "SUM", "async": False, "where": "a.py:1",
            "state": "done", "error": None, "t0": 1.0, "t1": 2.0, **fields}


def test_progress_and_flight_events_are_rank_events_with_their_fields_checked() -> None:
    progress = event_line(TOKEN, "progress", rank=1, completed=3, inflight=record(4, state="in_flight"),
                          moved=4096, quiet=1.5)
    said = parse_event(progress.rstrip("\n"), TOKEN)
    assert isinstance(said, Progress) and said.inflight is not None and said.inflight.seq == 4
    flight = event_line(TOKEN, "flight", rank=1, records=[record(1)], inflight=[], counts={"world": {"x": 1}},
                        dropped=0)
    dump = parse_event(flight.rstrip("\n"), TOKEN)
    assert isinstance(dump, Flight) and dump.counts.by_group == {"world": {"x": 1}}
    for bad, says in ((event_line(TOKEN, "progress", rank=1, completed="3", inflight=None, moved=0,
                                  quiet=0), "'completed'"),
                      (event_line(TOKEN, "flight", rank=1, records={}, inflight=[], counts={}, dropped=0),
                       "'records'"),
                      (event_line(TOKEN, "flight", rank=1, records=[], inflight=[], counts=None, dropped=0),
                       "'counts'")):
        with pytest.raises(MalformedEvent, match=says):
            parse_event(bad.rstrip("\n"), TOKEN)


def test_a_dump_too_large_for_an_event_line_leaves_out_its_oldest_records_and_counts_them() -> None:
    big = "x" * 20_000  # (errors are cut to 500 characters; a group's name is not)
    fields = {"rank": 0, "records": [record(n, group=f"g{big}#{n}") for n in range(1, 65)],
              "inflight": [record(65, state="in_flight")], "counts": {"world": {"all_reduce": 64}}, "dropped": 2}
    line = fit(TOKEN, fields)
    assert len(line) <= EVENT_MAX
    event = parse_event(line.decode().rstrip("\n"), TOKEN)
    assert isinstance(event, Flight)
    kept = [r.seq for r in event.records.records]
    assert kept == list(range(65 - len(kept), 65)) and 0 < len(kept) < 64  # the newest kept, in order
    assert event.dropped == 2 + 64 - len(kept)
    assert event.inflight.records[0].seq == 65 and event.counts.by_group == {"world": {"all_reduce": 64}}
    small = {"rank": 0, "records": [record(1)], "inflight": [], "counts": {}, "dropped": 0}
    assert json.loads(fit(TOKEN, dict(small)).decode().split(" ", 1)[1])["records"] == [record(1)]


# --- real ranks ----------------------------------------------------------------------------------

def run_ranks(tmp_path: Path, program: str, n: int) -> dict[int, list[dict[str, Any]]]:
    """Run ``program`` (prog.py) on ``n`` local gloo ranks as ``lab launch`` starts each one; every
    rank's events, in order. The program forms its group from STORE (a file:// rendezvous)."""
    (tmp_path / "prog.py").write_text(program)
    ended = run_ranks_as_the_lab_does(tmp_path, n, ["-m", "lab.rank.script", "prog.py"], TOKEN)
    for rank, rank_ended in enumerate(ended):
        assert rank_ended.code == 0, f"rank {rank}: {rank_ended.stderr[-3000:]}"
        assert rank_ended.events[0]["event"] == "hello"
    return {rank: rank_ended.events for rank, rank_ended in enumerate(ended)}


def last_dump(events: list[dict[str, Any]]) -> dict[str, Any]:
    dumps = [e for e in events if e["event"] == "flight"]
    assert dumps, [e["event"] for e in events]
    return dumps[-1]


def calls(dump: dict[str, Any], group: str | None = None) -> list[tuple[int, str]]:
    return [(r["seq"], r["op"]) for r in dump["records"] if group is None or r["group"] == group]


CALLS = """\
import datetime
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=os.environ["STORE"], timeout=datetime.timedelta(seconds=90))  # @init
rank = dist.get_rank()
t = torch.ones(8)
dist.all_reduce(t)  # @world1
if rank == 0:
    dist.send(torch.ones(3, dtype=torch.float64), dst=1, tag=7)  # @send
elif rank == 1:
    dist.recv(torch.zeros(3, dtype=torch.float64), src=0, tag=7)  # @recv
dist.all_reduce(t, op=dist.ReduceOp.MAX)
g = dist.new_group([1, 2])  # @newgroup
again = dist.new_group([1, 2], datetime.timedelta(minutes=2))
if rank in (1, 2):
    dist.all_reduce(t, group=g)
    if rank == 1:
        dist.send(t, group=g, group_dst=1)  # @subsend
    else:
        dist.recv(t, group=g, group_src=0)
    dist.broadcast(t, src=2, group=g)
    dist.barrier(group=again)
dist.all_reduce(t, group=g)  # rank 0 is not in g: the call does nothing there, unrecorded
reqs = []
if rank == 0:
    reqs = [dist.isend(t, dst=2, tag=3)]
elif rank == 2:
    reqs = [dist.irecv(t, src=0, tag=3)]
for req in reqs:
    req.wait()
if rank < 2:
    ops = [dist.P2POp(dist.isend, t, 1 - rank), dist.P2POp(dist.irecv, torch.zeros(8), 1 - rank)]
    for req in dist.batch_isend_irecv(ops):  # @batch
        req.wait()
dist.all_gather_object([None] * 3, {"rank": rank})  # @object
sends, expects = [1 + 2 * rank + j for j in range(3)], [1 + 2 * i + rank for i in range(3)]
dist.all_to_all_single(torch.zeros(sum(expects)), torch.ones(sum(sends)), expects, sends)  # @a2a
dist.group.WORLD.allreduce([t]).wait()
dist.monitored_barrier()
try:
    dist.send(t, dst=rank)  # @raised
except ValueError:
    pass
dist.destroy_process_group()  # @destroy
"""


@pytest.mark.local
def test_every_call_is_recorded_per_group_with_global_peers_and_the_users_line(tmp_path: Path) -> None:
    events = run_ranks(tmp_path, CALLS, 3)
    at, dumps = lines_of(CALLS), {rank: last_dump(e) for rank, e in events.items()}
    world = [(1, "init_process_group"), (2, "all_reduce"), (3, "all_reduce"), (4, "all_gather_object"),
             (5, "all_to_all_single"), (6, "ProcessGroup.allreduce"), (7, "monitored_barrier")]
    for rank, dump in dumps.items():  # the n-th collective is the same call on every rank, p2p or not
        assert [(seq, op) for seq, op in calls(dump, "world") if op not in P2P] == world, (rank, calls(dump))
        assert dump["inflight"] == [] and dump["dropped"] == 0
        init = dump["records"][0]  # the rendezvous: a collective of the world, with no tensor
        assert (init["where"], init["state"], init["shape"], init["numel"], init["error"]) == \
            (f"prog.py:{at['init']}", "done", None, None, None)
    assert calls(dumps[0], "world") == [(1, "init_process_group"), (2, "all_reduce"), (1, "send"), (3, "all_reduce"),
                                        (2, "isend"), (3, "isend"), (4, "irecv"), *world[3:], (5, "send")]
    assert {r["group"] for r in dumps[0]["records"]} == {"world"}  # not in g: nothing recorded on it
    made = [[1, [1, 2], f"prog.py:{at['newgroup']}"], [2, [1, 2], f"prog.py:{at['newgroup'] + 1}"]]
    assert all(dump["made"] == made for dump in dumps.values())  # every rank made g and again, a member or not
    assert all(dump["destroyed"] == f"prog.py:{at['destroy']}" for dump in dumps.values())  # (its own, not the lab's)
    world_timeout = ["world", 90.0, f"prog.py:{at['init']}"]  # (a group's on its members alone)
    assert dumps[0]["timeouts"] == [world_timeout], dumps[0]
    assert all(dumps[r]["timeouts"] == [world_timeout, ["g1,2#1", 120.0, f"prog.py:{at['newgroup'] + 1}"]]
               for r in (1, 2))
    for rank in (1, 2):
        p2p = "send" if rank == 1 else "recv"
        assert calls(dumps[rank], "g1,2#0") == [(1, "new_group"), (2, "all_reduce"), (1, p2p), (3, "broadcast"),
                                                (4, "all_reduce")]
        assert calls(dumps[rank], "g1,2#1") == [(1, "new_group"), (2, "barrier")]
    by_where = {(rank, r["where"]): r for rank, dump in dumps.items() for r in dump["records"]}
    send, recv = by_where[(0, f"prog.py:{at['send']}")], by_where[(1, f"prog.py:{at['recv']}")]
    assert (send["op"], send["peer"], send["tag"], send["dtype"], send["shape"], send["numel"]) == \
        ("send", 1, 7, "float64", [3], 3)
    assert (recv["op"], recv["peer"], recv["tag"], recv["state"], recv["async"]) == ("recv", 0, 7, "done", False)
    subsend = by_where[(1, f"prog.py:{at['subsend']}")]
    assert (subsend["group"], subsend["peer"]) == ("g1,2#0", 2)  # group rank 1 of [1, 2]: global rank 2
    subrecv = next(r for r in dumps[2]["records"] if r["op"] == "recv")
    assert subrecv["peer"] == 1
    broadcast = next(r for r in dumps[2]["records"] if r["op"] == "broadcast")
    assert broadcast["root"] == 2 and broadcast["peer"] is None
    assert [r["reduce_op"] for r in dumps[2]["records"] if r["op"] == "all_reduce"][:2] == ["SUM", "MAX"]
    batch = [r for r in dumps[1]["records"] if r["where"] == f"prog.py:{at['batch']}"]
    assert [(r["op"], r["peer"], r["async"], r["state"]) for r in batch] == \
        [("isend", 0, True, "done"), ("irecv", 0, True, "done")]
    assert by_where[(2, f"prog.py:{at['object']}")]["op"] == "all_gather_object"  # once: not its inner calls
    a2a = by_where[(1, f"prog.py:{at['a2a']}")]  # (splits given by position: the output's first)
    assert (a2a["in_splits"], a2a["out_splits"], a2a["numel"]) == ([3, 4, 5], [2, 4, 6], 12)
    assert all("in_splits" not in r for dump in dumps.values() for r in dump["records"]
               if r["op"] != "all_to_all_single")
    raised = by_where[(2, f"prog.py:{at['raised']}")]
    assert raised["state"] == "raised" and raised["error"].startswith("ValueError: ") and raised["t1"] is not None
    assert dumps[1]["counts"]["world"]["all_reduce"] == 2 and "send" not in dumps[2]["counts"]["world"]
    assert dumps[1]["counts"]["g1,2#0"] == {"new_group": 1, "all_reduce": 2, "send": 1, "broadcast": 1}


BLOCKED = """\
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=os.environ["STORE"])
t = torch.ones(4)
if dist.get_rank() == 0:
    time.sleep(4.5)  # computing: rank 1 waits in its recv
    dist.send(t, dst=1)
    time.sleep(4.5)
    dist.isend(t, dst=1).wait()
else:
    dist.recv(t, src=0)  # @recv
    request = dist.irecv(t, src=0)  # @irecv
    request.wait()
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.local
def test_a_call_blocked_for_two_seconds_is_dumped_while_it_blocks_and_progress_names_it(tmp_path: Path) -> None:
    events = run_ranks(tmp_path, BLOCKED, 2)
    at = lines_of(BLOCKED)
    dumps = [e for e in events[1] if e["event"] == "flight" and not in_rendezvous(e)]  # (a rank may start late)
    blocked = [(d["inflight"][0]["op"], d["inflight"][0]["state"], d["inflight"][0]["where"]) for d in dumps[:-1]]
    assert blocked == [("recv", "in_flight", f"prog.py:{at['recv']}"), ("irecv", "waiting", f"prog.py:{at['irecv']}")]
    recv = dumps[0]["inflight"][0]
    assert (recv["peer"], recv["async"], recv["t1"]) == (0, False, None)
    assert dumps[0]["records"][-1] == recv  # the ring has it too, in flight
    said = [(p["inflight"] or {}).get("op") for p in events[1] if p["event"] == "progress"]
    assert "recv" in said and "irecv" in said
    waiting = next(p["inflight"] for p in events[1] if p["event"] == "progress" and (p["inflight"] or {}).get(
        "op") == "irecv")
    assert (waiting["state"], waiting["async"], waiting["peer"]) == ("waiting", True, 0)
    completed = [p["completed"] for p in events[1] if p["event"] == "progress"]
    assert completed == sorted(completed) and completed[-1] >= 2  # the rendezvous and the recv at least
    # rank 0 computed while rank 1 waited: no call of its in flight, nothing dumped before its end
    assert [e["inflight"] for e in events[0] if e["event"] == "flight" and not in_rendezvous(e)] == [[]]
    final = dumps[-1]
    assert [(r["op"], r["state"]) for r in final["records"]] == [("init_process_group", "done"), ("recv", "done"),
                                                                  ("irecv", "done"), ("barrier", "done")]


def in_rendezvous(dump: dict[str, Any]) -> bool:
    """Whether a dump was sent while its rank waited in init_process_group (for a rank started later)."""
    return [r["op"] for r in dump["inflight"]] == ["init_process_group"]


RENDEZVOUS = """\
import os, time
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank == 0:
    open("rank-0-meets", "w").close()
else:  # loading its data once rank 0 meets (however late it started): rank 0 waits in the rendezvous
    deadline = time.monotonic() + 60
    while not os.path.exists("rank-0-meets") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(4.5)
dist.init_process_group("gloo", init_method=os.environ["STORE"])  # @init
t = torch.ones(2)
dist.all_reduce(t)  # @first
dist.destroy_process_group()
dist.init_process_group("gloo", init_method=os.environ["STORE"].replace("/store?", "/again?"))  # @again
dist.all_reduce(t)  # @second
pair = dist.new_group([0, 1])
dist.barrier(group=pair)
dist.destroy_process_group()
try:
    dist.init_process_group("gloo", init_method="nowhere://at-all", rank=rank, world_size=2)  # @raised
except (RuntimeError, ValueError):
    pass
"""


@pytest.mark.local
def test_init_process_group_is_the_worlds_first_collective_in_flight_while_a_rank_waits_for_the_others(
        tmp_path: Path) -> None:
    """A rank waiting in the rendezvous is in a call (progress and a dump say so); a new world after
    destroy_process_group goes on counting, the same on every rank; an init that raised is recorded."""
    events = run_ranks(tmp_path, RENDEZVOUS, 2)
    at = lines_of(RENDEZVOUS)
    waiting = next(e for e in events[0] if e["event"] == "flight")  # rank 0, while rank 1 loads its data
    assert [(r["seq"], r["group"], r["op"], r["state"], r["where"], r["t1"]) for r in waiting["inflight"]] == \
        [(1, "world", "init_process_group", "in_flight", f"prog.py:{at['init']}", None)]
    said = [p["inflight"] for p in events[0] if p["event"] == "progress" and p["inflight"] is not None]
    assert said and said[0]["op"] == "init_process_group" and said[0]["where"] == f"prog.py:{at['init']}"
    for rank in (0, 1):
        dump = last_dump(events[rank])
        assert [(r["seq"], r["op"], r["state"], r["where"].removeprefix("prog.py:")) for r in dump["records"]
                if r["group"] == "world"] == [
            (1, "init_process_group", "done", str(at["init"])), (2, "all_reduce", "done", str(at["first"])),
            (3, "init_process_group", "done", str(at["again"])), (4, "all_reduce", "done", str(at["second"])),
            (5, "init_process_group", "raised", str(at["raised"]))]
        assert calls(dump, "g0,1#0") == [(1, "new_group"), (2, "barrier")]
        assert "nowhere" in dump["records"][-1]["error"] and dump["records"][-1]["t1"] is not None
        assert dump["counts"]["world"] == {"init_process_group": 2, "all_reduce": 2}  # (the raised one is not done)


@pytest.mark.local
def test_the_workers_rendezvous_is_recorded_at_its_own_line_stage_after_stage(tmp_path: Path) -> None:
    """The lab's worker forms a world per stage and destroys it: each init_process_group is recorded
    at the worker's line, and the world's count goes on from one stage to the next on every rank."""
    (tmp_path / "ex.py").write_text("def run(rank):\n    return {'rank': rank}\n")
    stages = [{"init": "file", "path": str(tmp_path / f"rv{n}"), "init_method": f"file://{tmp_path}/rv{n}",
               "rendezvous": "shared", "exercises": [{"name": f"ex{n}", "program": str(tmp_path / "ex.py")}]}
              for n in (1, 2)]
    plan = {"token": TOKEN, "backend": "gloo", "timeout": 60, "stages": stages}
    ended = run_ranks_as_the_lab_does(tmp_path, 2, ["-m", "lab.rank.worker"], TOKEN,
                                      env={"LAB_RANK_PLAN": json.dumps(plan)})
    worker = (REPO / "lab" / "rank" / "worker.py").read_text().splitlines()
    init, barrier = (f"lab/rank/worker.py:{next(n for n, line in enumerate(worker, 1) if call in line)}"
                     for call in ("dist.init_process_group(", "dist.barrier()"))
    for rank in (0, 1):
        assert ended[rank].code == 0, ended[rank].stderr[-3000:]
        assert [(r["seq"], r["group"], r["op"], r["where"], r["state"]) for r in last_dump(ended[rank].events)[
            "records"]] == [(1, "world", "init_process_group", init, "done"), (2, "world", "barrier", barrier, "done"),
                            (3, "world", "init_process_group", init, "done"), (4, "world", "barrier", barrier, "done")]


BOUNDED = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method=os.environ["STORE"])
rank = dist.get_rank()
t = torch.ones(256)
for _ in range(10_000):
    dist.all_reduce(t)
buffers = [torch.zeros(1) for _ in range(300)]
if rank == 1:  # 300 receives posted, none can complete before the barrier
    requests = [dist.irecv(b, src=0, tag=i) for i, b in enumerate(buffers)]
dist.barrier()
if rank == 0:
    requests = [dist.isend(b, dst=1, tag=i) for i, b in enumerate(buffers)]
for request in requests:
    request.wait()
dist.destroy_process_group()
"""


@pytest.mark.local
def test_memory_stays_bounded_the_ring_and_the_async_calls_in_flight(tmp_path: Path) -> None:
    events = run_ranks(tmp_path, BOUNDED, 2)
    for rank in (0, 1):
        dump = last_dump(events[rank])
        assert len(dump["records"]) == RING_MAX
        assert dump["records"][-1]["op"] == ("isend" if rank == 0 else "barrier")
        assert dump["counts"]["world"]["all_reduce"] == 10_000
        assert dump["inflight"] == []
    dump = last_dump(events[1])
    assert dump["dropped"] == 300 - 256  # the oldest receives were let go of, and counted
    assert dump["counts"]["world"]["irecv"] == 256
    assert dump["records"][0]["seq"] == 300 - (RING_MAX - 2) and dump["records"][-2]["op"] == "irecv"


HANG = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(2)
dist.all_reduce(t)
if dist.get_rank() == 0:
    dist.barrier()  # @barrier
else:
    dist.recv(t, src=0)  # @recv
"""


@pytest.mark.local
def test_the_controller_keeps_each_ranks_progress_and_last_dump_of_a_hang(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    at = lines_of(HANG)
    started = time.monotonic()
    outcome = run_plan(build_launch_plan(local_inventory(2), str(script), [], timeout=60, hang_after=3))
    assert outcome.status == "hung" and outcome.hung == [0, 1]  # found by the hang finder, long before the timeout
    assert time.monotonic() - started < 30
    assert outcome.cause is not None and outcome.cause.kind == "missing-rank", outcome.cause
    assert outcome.cause.headline == ("Rank 0 waits in barrier #3 for rank 1, which is in recv from 0, tag 0, "
                                      f"2 floats at hang.py:{at['recv']}.")
    for state, (op, line) in zip(outcome.ranks, (("barrier", at["barrier"]), ("recv", at["recv"]))):
        assert state.violations == []
        assert state.progress is not None and state.flight is not None
        inflight = state.progress.inflight
        assert inflight is not None
        assert (inflight.op, inflight.state, inflight.where) == (op, "in_flight", f"hang.py:{line}")
        assert state.progress.completed == 2  # the rendezvous and the all_reduce
        assert [(r.op, r.where) for r in state.flight.inflight.records] == [(op, f"hang.py:{line}")]
        assert state.flight.counts.by_group == {"world": {"init_process_group": 1, "all_reduce": 1}}
    assert outcome.ranks[1].progress.inflight.peer == 0  # type: ignore[union-attr]


@pytest.mark.local
def test_a_hang_after_of_0_leaves_the_hang_to_the_timeout(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    outcome = run_plan(build_launch_plan(local_inventory(2), str(script), [], timeout=8, hang_after=0))
    assert outcome.status == "timeout" and outcome.hung == [0, 1]
    assert outcome.seconds >= 8
    assert outcome.cause is not None and outcome.cause.kind == "missing-rank"  # named all the same
