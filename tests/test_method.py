"""The method an exercise must use (lab.suite.method, recorded by lab.rank.calls), and load
errors of a solution that name the place: the checker on hand-made call summaries, the
recorder on its own and in a real torch.distributed process, then real runs through the CLI."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lab.rank.calls import Recorder
from lab.suite.check import Verdict, World
from lab.suite.checks.ring import check_ring_traffic
from lab.suite.method import check_method, combine, read_summaries
from lab.suite.registry import EXERCISES

from .conftest import REPO, WRONG, Lab
from .test_checks import all_reduce_ok, p2p_ok, ring_ok, ring_world

SOLUTIONS = REPO / "tests" / "solutions"
RING_RULE = "ring-allreduce must be built from point-to-point calls (send/recv/isend/irecv)"


def summary(counts: dict[str, int], sent: dict[int, int] | None = None, **functions: dict[str, Any]) -> dict:
    data: dict[str, Any] = {"counts": counts}
    if sent is not None:  # (not said: not judged)
        data["sent"] = {str(k): v for k, v in sent.items()}
    if functions:
        data["functions"] = functions
    return data


def function(calls: int, tensor_bytes: int, sent: dict[int, int], **extra: Any) -> dict[str, Any]:
    return {"calls": calls, "tensor_bytes": tensor_bytes, "counts": {"isend": 1, "recv": 1},
            "sent": {str(k): v for k, v in sent.items()}, **extra}


def method_of(name: str, calls: dict[int, Any], n: int) -> Verdict:
    return check_method(name, EXERCISES[name].method, read_summaries(calls), World.local(n))


def ring_traffic(calls: dict[int, Any], world: World) -> Verdict:
    """The ring's traffic check on summaries as they come (JSON data), read as an exercise's judge reads them."""
    return check_ring_traffic(read_summaries(calls), world)


# --- the method checker, on hand-made summaries ---------------------------------------------

def test_a_ring_rank_that_calls_all_reduce_fails_naming_the_call_and_the_rank() -> None:
    calls = {0: summary({"all_reduce": 96}), 1: summary({"isend": 4, "recv": 4}), 2: summary({"isend": 4, "recv": 4})}
    v = method_of("ring-allreduce", calls, 3)
    assert not v.passed
    assert v.reason == f"rank 0 called all_reduce: {RING_RULE}"
    assert v.failed_ranks == (0,)
    assert v.mismatches[0].got == "all_reduce x96"


def test_several_forbidden_calls_on_several_ranks_are_all_named() -> None:
    calls = {r: summary({"all_reduce": 1, "broadcast": 2, "send": 1}) for r in range(3)}
    v = method_of("ring-allreduce", calls, 3)
    assert v.reason == f"ranks 0, 1, 2 called all_reduce, broadcast: {RING_RULE}"
    assert v.failed_ranks == (0, 1, 2)


def test_point_to_point_calls_and_a_barrier_keep_to_the_p2p_method() -> None:
    calls = {0: summary({"send": 2, "recv": 1, "barrier": 1}, {1: 8}),
             1: summary({"batch_isend_irecv": 1, "ProcessGroup.send": 1, "recv_object_list": 1})}
    assert method_of("p2p", calls, 2).passed


def test_p2p_async_needs_a_nonblocking_call_on_every_rank() -> None:
    calls = {0: summary({"isend": 1, "batch_isend_irecv": 1}), 1: summary({"recv": 1, "send": 1})}
    v = method_of("p2p-async", calls, 2)
    assert not v.passed and v.failed_ranks == (1,)
    assert v.reason.startswith("rank 1 made no batch_isend_irecv or irecv or isend call: p2p-async must use "
                               "the non-blocking point-to-point calls")
    assert v.mismatches[0].got == "recv x1, send x1"


def test_a_collective_exercise_needs_its_collective_through_any_door() -> None:
    calls = {0: summary({"all_reduce": 4}), 1: summary({"ProcessGroup.allreduce": 4}), 2: summary({})}
    v = method_of("all-reduce", calls, 3)
    assert not v.passed and v.failed_ranks == (2,)
    assert v.reason == "rank 2 made no all_reduce call: all-reduce practises all_reduce: every rank calls it"
    assert v.mismatches[0].got == "no call at all"
    # Anything else is allowed: the reference programs' workarounds (all_reduce for reduce_scatter).
    assert method_of("reduce-scatter", {0: summary({"reduce_scatter": 1, "all_reduce": 1})}, 1).passed


def test_exercises_without_a_method_accept_any_calls() -> None:
    assert EXERCISES["dsgd"].method is None and EXERCISES["groups"].method is None
    assert method_of("dsgd", {0: summary({"all_reduce": 8, "broadcast": 3})}, 1).passed


def test_unrecorded_or_malformed_summaries_are_not_held_against_a_rank_but_noted() -> None:
    calls: dict[int, Any] = {0: None, 1: {"counts": "all_reduce"}, 2: summary({"all_reduce": True, "recv": -1})}
    v = method_of("ring-allreduce", calls, 3)
    assert v.passed, v.reason
    assert v.notes == ("the calls of ranks 0, 1 were not recorded: their method is not checked",)


def test_combine_keeps_the_values_reason_first_then_the_methods() -> None:
    values = Verdict(False, "rank 1: sum: expected 3, got 4", notes=("a",))
    method = method_of("ring-allreduce", {0: summary({"all_reduce": 1}), 1: summary({})}, 2)
    both = combine(values, method)
    assert not both.passed
    assert both.reason == f"rank 1: sum: expected 3, got 4; also rank 0 called all_reduce: {RING_RULE}"
    assert both.failed_ranks == (0,)  # the values' verdict named its rank in the reason only
    assert combine(Verdict(True), Verdict(True, notes=("n",))) == Verdict(True, notes=("n",))


def test_right_values_with_the_wrong_method_fail_the_exercise() -> None:
    """The registry's judge: ring results that are right, from ranks that called all_reduce."""
    n = 3
    assert EXERCISES["ring-allreduce"].check(ring_ok(n), ring_world(n)).passed
    calls = {r: summary({"all_reduce": 96}) for r in range(n)}
    v = EXERCISES["ring-allreduce"].judge(ring_ok(n), calls, ring_world(n))
    assert not v.passed and v.reason == f"ranks 0, 1, 2 called all_reduce: {RING_RULE}"
    p2p_calls = {r: summary({"send": 2, "recv": 2}) for r in range(4)}
    assert EXERCISES["p2p"].judge(p2p_ok(4), p2p_calls, World.local(4)).passed
    assert not EXERCISES["all-reduce"].judge(all_reduce_ok(4), {r: summary({}) for r in range(4)},
                                             World.local(4)).passed


# --- the ring's bytes ------------------------------------------------------------------------

def ring_calls(n: int, per_tensor: float, to_next: bool = True, size: int = 3000) -> dict[int, Any]:
    """Every rank given tensors of ``size`` bytes in all, sending ``per_tensor`` times that."""
    sent = int(size * per_tensor)
    return {r: summary({"isend": 4, "recv": 4},
                       allreduce=function(2, size, {(r + 1) % n: size * (n - 1)}),
                       ring_allreduce=function(2, size, {(r + 1) % n if to_next else (r + 2) % n: sent}))
            for r in range(n)}


def test_the_chunked_ring_is_noted_bandwidth_optimal_with_its_bytes_per_rank() -> None:
    v = ring_traffic(ring_calls(3, 4 / 3), World.local(3))
    assert v.passed
    tutorial, chunked = v.notes
    assert tutorial.startswith("allreduce(send, recv): each rank sent 2.00x the bytes of its tensor over 2 calls "
                               "(the tutorial's ring: n-1 = 2 whole tensors")
    assert chunked == ("ring_allreduce(tensor): each rank sent 1.33x the bytes of its tensor over 2 calls "
                       "(bandwidth-optimal: 2(n-1)/n = 1.33x), to rank r+1 only "
                       "(rank 0 4,000 B to 1; rank 1 4,000 B to 2; rank 2 4,000 B to 0)")


def test_a_ring_allreduce_passing_whole_tensors_fails_from_three_ranks() -> None:
    v = ring_traffic(ring_calls(3, 2.0), World.local(3))
    assert not v.passed and v.failed_ranks == (0, 1, 2)
    assert v.reason.startswith("ring_allreduce(tensor) is not bandwidth-optimal: ranks 0, 1, 2 sent up to 2.00x "
                               "the tensor, over 1.25x the chunked ring's 2(n-1)/n = 1.33x")
    assert (v.mismatches[0].expected, v.mismatches[0].got) == (1.33, 2.0)
    # With 2 ranks a whole tensor is 2(n-1)/n of it: the same bytes, not wrong.
    assert ring_traffic(ring_calls(2, 1.0), World.local(2)).passed


def test_a_little_over_the_optimal_is_a_note_not_a_failure() -> None:
    v = ring_traffic(ring_calls(4, 1.7), World.local(4))  # 1.7 / 1.5 = 1.13x the optimal
    assert v.passed
    assert "more than the bandwidth-optimal 2(n-1)/n = 1.50x" in v.notes[1]


def test_sending_elsewhere_than_the_right_neighbour_is_said() -> None:
    v = ring_traffic(ring_calls(3, 4 / 3, to_next=False), World.local(3))
    assert v.passed
    assert "not only to rank r+1 (rank 0 4,000 B to 2;" in v.notes[1]


def test_untrusted_function_summaries_are_skipped() -> None:
    junk: dict[int, Any] = {0: {"functions": {"ring_allreduce": {"tensor_bytes": "x", "sent": {}}}},
                            1: {"functions": []}, 2: None}
    assert ring_traffic(junk, World.local(3)) == Verdict(True)


def test_a_function_taken_from_the_reference_or_missing_fails_its_part_and_only_its_part() -> None:
    ring = EXERCISES["ring-allreduce"]
    calls = ring_calls(3, 4 / 3)
    for r in calls:
        calls[r]["functions"]["allreduce"]["reference"] = True
    v = ring.judge(ring_ok(3), calls, ring_world(3))
    assert not v.passed and v.reason == "allreduce(): not written: it uses the reference's allreduce()"
    assert [(p.name, p.passed) for p in v.parts] == [("allreduce", False), ("ring_allreduce", True)]
    assert ring.judge(ring_ok(3), calls, ring_world(3), part="ring_allreduce").passed  # that part alone
    for r in calls:
        calls[r]["functions"]["allreduce"]["missing"] = True
    v = ring.judge(ring_ok(3), calls, ring_world(3), part="allreduce")
    assert not v.passed and v.reason == "allreduce(): not written (the solution does not define it)"


# --- the recorder, with stand-ins for torch's functions ----------------------------------------

class FakeTensor:
    def __init__(self, numel: int, element_size: int = 4) -> None:
        self._numel, self._size = numel, element_size

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return self._size


def test_the_recorder_counts_only_while_recording_and_not_calls_inside_calls() -> None:
    r = Recorder()
    send = r.wrap("send", lambda tensor, dst: None, sends=True)
    inner_send = send
    send_object = r.wrap("send_object_list", lambda dst: inner_send(FakeTensor(3, 1), dst))
    barrier = r.wrap("barrier", lambda: None)
    new_group = r.wrap_group_maker(lambda ranks: tuple(ranks))
    barrier()  # the lab's own, before the exercise
    new_group([0, 1])
    with r.recording():
        send(FakeTensor(10), 1)
        send(tensor=FakeTensor(5, 8), dst=2)
        send_object(1)
        assert new_group([1, 2]) == (1, 2)  # (counted apart: making a group is no call of the method)
    barrier()  # the lab's own, after it
    assert r.summary() == {"counts": {"send": 2, "send_object_list": 1}, "sent": {"1": 43, "2": 40}, "messages": 3,
                           "groups": 1}
    with r.recording():  # each exercise starts from nothing
        barrier()
    assert r.summary() == {"counts": {"barrier": 1}, "sent": {}, "messages": 0}


def test_what_a_students_function_sends_is_recorded_apart_and_the_outer_function_keeps_it() -> None:
    r = Recorder()
    isend = r.wrap("isend", lambda tensor, dst: None, sends=True)

    def allreduce(send: FakeTensor, recv: FakeTensor) -> None:
        isend(send, 1)

    scoped_allreduce = r.scoped("allreduce", allreduce)

    def ring_allreduce(tensor: FakeTensor) -> None:
        scoped_allreduce(tensor, tensor)  # built on the other one: ring_allreduce's bytes
        isend(FakeTensor(1), 2)

    scoped_ring = r.scoped("ring_allreduce", ring_allreduce, reference=True)
    assert r.scoped("ring_allreduce", scoped_ring) is scoped_ring  # never wrapped twice
    with r.recording():
        scoped_allreduce(FakeTensor(10), FakeTensor(10))
        scoped_ring(FakeTensor(100))
        isend(FakeTensor(2), 3)  # outside both
    assert r.summary() == {
        "counts": {"isend": 4}, "sent": {"1": 440, "2": 4, "3": 8}, "messages": 4,
        "functions": {
            "allreduce": {"counts": {"isend": 1}, "sent": {"1": 40}, "calls": 1, "tensor_bytes": 40},
            "ring_allreduce": {"counts": {"isend": 2}, "sent": {"1": 400, "2": 4}, "calls": 1,
                               "tensor_bytes": 400, "reference": True}}}


def test_a_call_that_raises_was_made_and_the_wrapper_passes_the_error_on() -> None:
    r = Recorder()

    def unsupported(*args: Any) -> None:
        raise RuntimeError("does not support reduce_scatter")

    reduce_scatter = r.wrap("reduce_scatter", unsupported)
    with r.recording(), pytest.raises(RuntimeError, match="does not support"):
        reduce_scatter(FakeTensor(1), [FakeTensor(1)])
    assert r.summary()["counts"] == {"reduce_scatter": 1}


RECORDER_IN_TORCH = """
import importlib, json, sys
import torch, torch.distributed as dist
from lab.rank.calls import RECORDER, install

dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/store", rank=0, world_size=1)
install()
sys.path.insert(0, sys.argv[1])
student = importlib.import_module("student")  # imported after install(), as the worker does
with RECORDER.recording():
    student.run()
dist.barrier()  # the lab's own, after the exercise
print(json.dumps(RECORDER.summary()))
dist.destroy_process_group()
"""

STUDENT = """
import torch
import torch.distributed as dist
from torch.distributed import all_reduce
from torch.distributed.distributed_c10d import broadcast


def run():
    t = torch.ones(4)
    all_reduce(t)
    broadcast(t, src=0)
    dist.distributed_c10d.all_reduce(t)
    dist.group.WORLD.allreduce([t]).wait()  # the group's own method
    dist.all_gather_object([None], {"a": 1})  # its inner all_gather is torch's, not the program's
    dist.barrier()
"""


@pytest.mark.local
def test_the_recorder_sees_every_way_to_reach_torch_distributed(tmp_path: Path) -> None:
    (tmp_path / "student.py").write_text(STUDENT)
    done = subprocess.run([sys.executable, "-c", RECORDER_IN_TORCH, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    recorded = json.loads(done.stdout.strip().splitlines()[-1])
    assert recorded == {"counts": {"ProcessGroup.allreduce": 1, "all_gather_object": 1, "all_reduce": 2,
                                   "barrier": 1, "broadcast": 1}, "sent": {}, "messages": 0}


TAMPERER = """
import torch
import torch.distributed as dist
from lab.rank.calls import RECORDER


def run():
    t = torch.ones(4)
    RECORDER.active = False  # its all_reduce unseen...
    dist.all_reduce(t)
    RECORDER.active = True
    dist.broadcast = dist.broadcast.__wrapped__  # (the group's method below it still sees broadcasts)
    dist.broadcast(t, src=0)
"""


@pytest.mark.local
def test_a_recorder_switched_off_or_unwrapped_says_so_and_fails_the_method(tmp_path: Path) -> None:
    """The all_reduce is not recorded, but what the program did to the recorder is, and the method
    check fails the rank with it, before anything its records say."""
    (tmp_path / "student.py").write_text(TAMPERER)
    done = subprocess.run([sys.executable, "-c", RECORDER_IN_TORCH, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    recorded = json.loads(done.stdout.strip().splitlines()[-1])
    assert recorded == {"counts": {"ProcessGroup.broadcast": 1}, "sent": {}, "messages": 0, "tampered": [
        "switched off 1 time(s)", "its wrappers replaced (torch.distributed.broadcast)"]}
    v = check_method("ring-allreduce", EXERCISES["ring-allreduce"].method,
                     read_summaries({0: recorded, 1: {"counts": {}}}), World.local(2))
    assert not v.passed and v.failed_ranks == (0,)
    assert v.reason == ("rank 0's call recorder was tampered with during the exercise (switched off 1 time(s); its "
                        "wrappers replaced (torch.distributed.broadcast)): its records are no evidence of the method")


# --- real runs through the CLI ----------------------------------------------------------------

def run_json(lab: Lab, exercise: str, solution: Path | None, nproc: int = 3) -> tuple[int, dict[str, Any]]:
    args = ["run", exercise, "--nproc", str(nproc), "--json", "--timeout", "60"]
    result = lab(*args, *(["--solution", str(solution)] if solution else []))
    assert result.out.strip(), f"no JSON on stdout; stderr:\n{result.err[-3000:]}"
    report = json.loads(result.out)
    (entry,) = report["exercises"]
    return result.code, entry


@pytest.mark.local
def test_a_ring_that_calls_all_reduce_fails_naming_all_reduce(lab: Lab) -> None:
    code, entry = run_json(lab, "ring-allreduce", WRONG / "ring_calls_all_reduce.py")
    assert (code, entry["status"]) == (1, "fail"), entry
    assert entry["reason"] == f"ranks 0, 1, 2 called all_reduce: {RING_RULE}"
    assert entry["ranks"] == [0, 1, 2]
    # one all_reduce per call of each function: 48 cases each
    assert {m["got"] for m in entry["mismatches"]} == {"all_reduce x96"}
    assert lab.leftovers() == []


@pytest.mark.local
def test_the_reference_ring_passes_and_reports_its_bytes(lab: Lab) -> None:
    result = lab("run", "ring-allreduce", "--nproc", "4")
    assert result.code == 0, result.text
    notes = [line.strip() for line in result.out.splitlines() if line.strip().startswith("note: ")]
    assert len(notes) == 2, result.out
    assert notes[0].startswith("note: allreduce(send, recv): each rank sent 3.00x the bytes of its tensor over "
                               "48 calls (the tutorial's ring: n-1 = 3 whole tensors")
    assert notes[1].startswith("note: ring_allreduce(tensor): each rank sent 1.50x the bytes of its tensor over "
                               "48 calls (bandwidth-optimal: 2(n-1)/n = 1.50x), to rank r+1 only (rank 0 ")
    assert " B to 1; rank 1 " in notes[1] and " B to 0)" in notes[1]


@pytest.mark.local
def test_a_ring_of_batch_isend_irecv_passes_with_its_bytes_counted(lab: Lab) -> None:
    code, entry = run_json(lab, "ring-allreduce", SOLUTIONS / "ring_batch_isend_irecv.py")
    assert (code, entry["status"]) == (0, "pass"), entry
    assert any(n.startswith("ring_allreduce(tensor): each rank sent 1.33x the bytes of its tensor over 48 calls "
                            "(bandwidth-optimal") and "to rank r+1 only" in n for n in entry["notes"]), entry


@pytest.mark.local
@pytest.mark.parametrize("nproc, optimal", [(3, False), (2, True)])
def test_a_ring_allreduce_of_whole_tensors_is_not_the_homework(lab: Lab, nproc: int, optimal: bool) -> None:
    code, entry = run_json(lab, "ring-allreduce", WRONG / "ring_whole_tensors.py", nproc)
    assert code == 1 and entry["status"] == "fail", entry  # (its allreduce is the reference's: that part fails)
    assert entry["parts"][1]["passed"] is optimal, entry  # with 2 ranks both send one tensor
    if not optimal:
        assert entry["reason"].startswith("ring_allreduce(tensor) is not bandwidth-optimal: ranks 0, 1, 2 sent up "
                                          "to 2.00x the tensor")
    assert entry["parts"][0] == {"name": "allreduce", "passed": False,
                                 "reason": "allreduce(): not written: it uses the reference's allreduce()"}


@pytest.mark.local
@pytest.mark.parametrize("exercise, program, reason", [
    ("p2p", "p2p_by_broadcast.py", "ranks 0, 1, 2 called broadcast: p2p must be built from point-to-point calls "
                                   "(send/recv/isend/irecv)"),
    ("p2p-async", "p2p_async_blocking.py", "ranks 0, 1, 2 made no batch_isend_irecv or irecv or isend call: "
                                           "p2p-async must use the non-blocking point-to-point calls"),
    ("all-reduce", "all_reduce_computed_locally.py", "ranks 0, 1, 2 made no all_reduce call: all-reduce "
                                                     "practises all_reduce"),
])
def test_right_values_by_the_wrong_method_fail(lab: Lab, exercise: str, program: str, reason: str) -> None:
    code, entry = run_json(lab, exercise, WRONG / program)
    assert (code, entry["status"]) == (1, "fail"), entry
    assert entry["reason"].startswith(reason), entry
    assert not [m for m in entry["mismatches"] if m["what"] not in ("calls outside the method",
                                                                    "calls of the method")], "the values were right"


@pytest.mark.local
def test_a_syntax_error_names_the_file_and_line(lab: Lab, tmp_path: Path) -> None:
    solution = tmp_path / "mine.py"
    solution.write_text("import torch.distributed as dist\n\n\ndef ring_allreduce(tensor)\n    pass\n")
    code, entry = run_json(lab, "ring-allreduce", solution, nproc=2)
    assert (code, entry["status"]) == (1, "fail"), entry
    assert entry["reason"] == "ranks 0, 1 raised SyntaxError: expected ':' at mine.py:4: def ring_allreduce(tensor)"


@pytest.mark.local
def test_a_solution_missing_a_function_gets_the_other_parts_credit(lab: Lab) -> None:
    code, entry = run_json(lab, "ring-allreduce", SOLUTIONS / "ring_allreduce_only.py", nproc=2)
    assert (code, entry["status"], entry["score"]) == (1, "fail", 0.5), entry
    assert entry["reason"] == "allreduce(): not written (the solution does not define it)", entry
    assert [(p["name"], p["passed"]) for p in entry["parts"]] == [("allreduce", False), ("ring_allreduce", True)]


@pytest.mark.local
def test_a_function_that_wraps_the_reference_is_not_the_students(lab: Lab, tmp_path: Path) -> None:
    solution = tmp_path / "wrapper.py"
    solution.write_text("from lab.suite.exercises.ring_allreduce import allreduce as theirs\n"
                        "from lab.suite.exercises.ring_allreduce import ring_allreduce  # noqa: F401\n\n\n"
                        "def allreduce(send, recv):\n    theirs(send, recv)\n")
    code, entry = run_json(lab, "ring-allreduce", solution, nproc=3)
    assert (code, entry["status"], entry["score"]) == (1, "fail", 0.0), entry
    assert entry["reason"] == ("allreduce(): not written: it uses the reference's allreduce(); "
                               "ring_allreduce(): not written: it uses the reference's ring_allreduce()"), entry


@pytest.mark.local
def test_a_solution_may_define_only_the_functions_the_exercise_asks_for(lab: Lab, tmp_path: Path) -> None:
    """The case driver and what it reports are the lab's: a solution that replaces it is refused, named."""
    solution = tmp_path / "driver.py"
    solution.write_text("from lab.suite.exercises.ring_allreduce import allreduce, ring_allreduce  # noqa: F401\n"
                        "from lab.suite.exercises.ring_cases import starts  # noqa: F401  (the very one: kept)\n\n\n"
                        "def run_cases(rank, size, device, inputs, allreduce, ring_allreduce):\n    return {}\n")
    code, entry = run_json(lab, "ring-allreduce", solution, nproc=2)
    assert (code, entry["status"]) == (1, "fail"), entry
    assert ("driver.py defines run_cases(), which is the exercise's own: it asks for allreduce(), ring_allreduce() "
            "only; rename or remove it") in entry["reason"], entry


@pytest.mark.local
def test_a_solution_with_nothing_of_the_exercise_names_what_it_asks_for(lab: Lab) -> None:
    code, entry = run_json(lab, "ring-allreduce", SOLUTIONS / "nothing_to_grade.py", nproc=2)
    assert (code, entry["status"]) == (1, "fail"), entry
    assert ("nothing_to_grade.py defines neither run() nor any function of ring_allreduce.py to replace "
            "(it asks for allreduce(), ring_allreduce())") in entry["reason"]


def test_where_names_a_syntax_errors_line_and_a_runtime_errors_frame(tmp_path: Path) -> None:
    from lab.rank.worker import _where, error_text

    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent("""\
        x = 1
        def f(:
            pass
    """))
    with pytest.raises(SyntaxError) as caught:
        compile(bad.read_text(), str(bad), "exec")
    assert _where(caught.value, str(bad)) == "bad.py:2: def f(:"
    assert error_text(caught.value) == "SyntaxError: invalid syntax"


def test_a_rank_that_sent_nothing_computed_the_result_without_communicating() -> None:
    calls = {0: summary({"send": 2, "recv": 1}, sent={1: 8}), 1: summary({"recv": 1}, sent={})}
    v = method_of("p2p", calls, 2)
    assert not v.passed and v.reason == "rank 1 sent 0 bytes: it computed the result without communicating"
    ring = {r: summary({"isend": 4, "recv": 4}, sent={(r + 1) % 3: 64},
                       allreduce=function(4, 64, {(r + 1) % 3: 64}),
                       ring_allreduce=function(4, 64, {} if r == 2 else {(r + 1) % 3: 48})) for r in range(3)}
    v = method_of("ring-allreduce", ring, 3)
    assert not v.passed and v.reason.startswith(
        "rank 2 sent 0 bytes in ring_allreduce(): it computed the result without communicating")
    assert method_of("p2p", {0: summary({"barrier": 1}, sent={})}, 1).passed  # alone, there is nobody to send to
