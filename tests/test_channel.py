"""The rank-to-controller channel (lab.rank.protocol): a solution cannot speak for the lab by printing,
cannot speak for another rank, cannot keep itself alive with step events, and cannot break the
controller with what it sends; a solution is loaded under a name of its own."""
from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, get_args

import pytest

from lab.core.ledger import Ledger
from lab.core.outcome import OUTPUT_MAX, Output
from lab.core.plan import Options
from lab.core.planner import build_plan
from lab.errors import ExitCode
from lab.inventory.hosts import local_inventory
from lab.rank import events
from lab.rank.events import (
    EVENT_TYPES,
    PROBE_EVENTS,
    Done,
    Event,
    Flight,
    Hello,
    MalformedEvent,
    Ports,
    Probe,
    Progress,
    parse_event,
)
from lab.rank.flightrecords import Calls, StepMark, Steps
from lab.rank.output import tagged
from lab.rank.protocol import EVENT_KINDS, EVENTS_MAX, FLIGHT_RATE, NEUTRAL, EventBudget, event_line
from lab.rank.record import Record, to_wire
from lab.suite import registry

from .conftest import WRONG, Lab

TIMEOUT = "20"


def run_json(lab: Lab, *args: str) -> tuple[int, dict[str, Any], str]:
    result = lab("run", *args, "--json", timeout=120)
    assert result.out.strip(), f"no JSON on stdout; stderr:\n{result.err[-3000:]}"
    return result.code, json.loads(result.out), result.err


@pytest.mark.local
@pytest.mark.parametrize("launcher", ["lab", "torchrun"])
def test_event_lines_a_solution_prints_are_its_output_not_events(lab: Lab, launcher: str) -> None:
    """Forged results and dones, for itself and the other rank, in every way it can print them,
    then os._exit(0): each rank died before reporting, and the forged lines are shown as output."""
    code, report, err = run_json(lab, "groups", "--nproc", "2", "--timeout", TIMEOUT, "--launcher", launcher,
                                 "--solution", str(WRONG / "groups_forges_results.py"))
    entry = report["exercises"][0]
    assert (code, entry["status"]) == (ExitCode.CHECK_FAILED, "fail"), entry
    assert re.match(r"rank \d \(local\) exited with status 0 during groups, before reporting its result",
                    entry["reason"]), entry["reason"]
    assert sorted(entry["ranks"]) == [0, 1]
    assert '\u241flab:' in err and '"event": "result"' in err  # shown as output, the mark neutralized
    assert lab.leftovers() == []


@pytest.mark.local
def test_an_event_in_another_ranks_name_fails_its_sender(lab: Lab) -> None:
    code, report, _ = run_json(lab, "groups", "--nproc", "2", "--timeout", TIMEOUT,
                               "--solution", str(WRONG / "groups_speaks_for_rank_0.py"))
    entry = report["exercises"][0]
    assert (code, entry["status"]) == (ExitCode.CHECK_FAILED, "fail"), entry
    assert entry["reason"] == "rank 1 (local) sent an event as rank 0 (a rank speaks for itself only)", entry
    assert entry["ranks"] == [1]


@pytest.mark.local
def test_malformed_events_fail_their_senders_not_the_controller(lab: Lab) -> None:
    code, report, err = run_json(lab, "groups", "--nproc", "4", "--timeout", "20",
                                 "--solution", str(WRONG / "groups_malformed_events.py"))
    assert "internal error" not in err, err[-2000:]
    entry = report["exercises"][0]
    assert (code, entry["status"]) == (ExitCode.CHECK_FAILED, "fail"), entry
    assert entry["ranks"] == [0, 1, 2, 3]
    causes = [entry["reason"].removesuffix(" (and 3 more)"), *entry["notes"]]
    assert causes == [
        "rank 0 (local) sent a malformed event: not an object but a list",
        "rank 1 (local) sent a malformed event: a 'step' event without its 'rank'",
        "rank 2 (local) sent a malformed event: the 'seconds' of a 'result' event is a string 'soon', "
        "not a finite number",
        "rank 3 (local) sent a malformed event: nested too deeply",
    ], causes


@pytest.mark.local
def test_step_events_do_not_keep_a_rank_alive_past_its_exercise(lab: Lab) -> None:
    started = time.monotonic()
    code, report, _ = run_json(lab, "groups", "--nproc", "2", "--timeout", "10",
                               "--solution", str(WRONG / "groups_loops_steps.py"))
    entry = report["exercises"][0]
    assert (code, entry["status"]) == (ExitCode.TIMEOUT, "timeout"), entry
    assert sorted(entry["ranks"]) == [0, 1] and "stopped after 10s in groups" in entry["reason"], entry
    assert time.monotonic() - started < 40
    assert lab.leftovers() == []


@pytest.mark.local
def test_an_over_long_line_is_cut_and_a_value_too_large_to_report_is_an_error(lab: Lab) -> None:
    code, report, err = run_json(lab, "groups", "--nproc", "2", "--timeout", "20",
                                 "--solution", str(WRONG / "groups_too_large.py"))
    entry = report["exercises"][0]
    assert (code, entry["status"]) == (ExitCode.CHECK_FAILED, "fail"), entry
    assert re.match(r"rank 0 raised ValueError: the value run\(\) returned is too large to report: \d+ bytes "
                    r"as JSON \(at most 1048576\) \(and 1 more\)$", entry["reason"]), entry["reason"]
    assert entry["ranks"] == [0, 1]
    for rank in report["ranks"]:
        assert rank["output"]["bytes"] > 3 << 20, rank
    assert err.count("[cut: ") == 2, err[-3000:]


@pytest.mark.local
def test_a_solution_named_like_a_module_is_the_solution(lab: Lab, tmp_path: Path) -> None:
    solution = tmp_path / "json.py"  # (not in tests/: it would shadow the json module there)
    solution.write_text("from lab.suite.exercises.groups import run as reference\n\n\n"
                        "def run(device):\n"
                        "    print('the student json.py runs')\n"
                        "    return reference(device)\n")
    code, report, err = run_json(lab, "groups", "--nproc", "2", "--timeout", "20", "--solution", str(solution))
    assert (code, report["exercises"][0]["status"]) == (ExitCode.OK, "pass"), report["exercises"][0]
    assert err.count("the student json.py runs") == 2


# The pieces, without processes.

TOKEN = "tok"


def event(payload: str) -> Event | None:
    return parse_event(f"\x1flab:{TOKEN} {payload}", TOKEN)


@pytest.mark.parametrize("payload, says", [
    ("[1]", "not an object but a list"),
    ('{"event": "step"}', "a 'step' event without its 'rank'"),
    ('{"event": "step", "rank": 0}', "a 'step' event without its 'step'"),
    ('{"event": "step", "rank": "0", "step": "x"}', "the 'rank' of a 'step' event is a string '0', not an integer"),
    ('{"event": "step", "rank": true, "step": "x"}', "the 'rank' of a 'step' event is a boolean"),
    ('{"event": "result", "rank": 0, "exercise": "x", "value": 1, "seconds": NaN}', "not a finite number"),
    ('{"event": "done", "rank": 0, "failures": 0, "extra": 1}', "a 'done' event has no field 'extra'"),
    ('{"event": "hack"}', "no known 'event'"),
    ("[" * 100_000, "nested too deeply"),
    ("{", "not JSON"),
    ('{"event": "flight", "rank": 0, "records": [], "inflight": {}, "counts": {}, "dropped": 0}',
     "the 'inflight' of a 'flight' event is an object {}, not a list of flight records"),
    ('{"event": "progress", "rank": 0, "completed": 1, "inflight": {"op": "recv"}, "moved": 0, "quiet": 1}',
     "the 'inflight' of a 'progress' event is an object {'op': 'recv'}, not a flight record or null"),
    ('{"event": "ports", "ports": [29500, 0]}', "the 'ports' of a 'ports' event is a list [29500, 0], not a list of "
     "TCP ports"),
    ('{"event": "ports", "ports": [true]}', "not a list of TCP ports"),
    ('{"event": "flight", "rank": 0, "records": [], "inflight": [], "counts": {}, "dropped": 0, "files": {}}',
     "the 'files' of a 'flight' event is an object {}, not a list or null"),
])
def test_malformed_events_are_named(payload: str, says: str) -> None:
    with pytest.raises(MalformedEvent, match=re.escape(says)):
        event(payload)


def test_valid_events_pass_as_their_kinds_class() -> None:
    assert event('{"event": "done", "rank": 1, "failures": 0}') == Done(rank=1, failures=0)
    hello = event('{"event": "hello", "rank": 0, "pid": 1, "hostname": "h", "local_rank": 0}')
    assert hello == Hello(rank=0, pid=1, hostname="h", local_rank=0, python="", torch="")  # (those two may be left out)
    assert event('{"event": "progress", "rank": 2, "completed": 3, "inflight": null, "moved": 9, "quiet": 1}') == \
        Progress(rank=2, completed=3, inflight=None, moved=9, quiet=1)
    assert event('{"event": "ports", "ports": [29500, 65535]}') == Ports(ports=(29500, 65535))
    assert event('{"event": "facts", "anything": [1]}') == Probe("facts", {"anything": [1]})  # the doctor checks it
    call = Record(3, "world", "all_reduce", "in_flight", 1.5, numel=4, shape=(4,), where="\x1b[2Jtrain.py:9")
    flight = event(json.dumps({"event": "flight", "rank": 1, "records": [None, {"seq": 0}, to_wire(call)],
                               "inflight": [], "counts": {"world": {"all_reduce": 2, "recv": -1}}, "dropped": 0,
                               "steps": [[1, "forward", True, "train.py:8"], "junk"]}))
    assert isinstance(flight, Flight)  # (its payload read as the analysis takes it: malformed parts skipped, counted)
    shown = dataclasses.replace(call, where="\\x1b[2Jtrain.py:9")  # (its texts made printable)
    assert flight.records == Calls((shown,), sent=3, refused=(("not an object", 1), ("seq", 1)))
    assert (flight.counts.by_group, flight.counts.malformed) == ({"world": Counter(all_reduce=2)}, True)
    assert flight.steps == Steps((StepMark(1, "forward", True, "train.py:8"),), malformed=1)
    assert parse_event("plain output", TOKEN) is None


def test_every_kind_of_event_has_its_class_and_every_field_a_check() -> None:
    assert {cls.KIND for cls in EVENT_TYPES.values()} | PROBE_EVENTS == EVENT_KINDS
    assert {"facts", "runtime", "links", "heard", "closed"} == PROBE_EVENTS
    senders: dict[str, set[str]] = {}
    for kind, cls in EVENT_TYPES.items():  # (the zygote passes on a rank's alone; the ledger takes its launcher's too)
        senders.setdefault(cls.SENDER, set()).add(kind)
    assert senders == {"rank": {"hello", "step", "result", "error", "fatal", "done", "progress", "flight", "trace",
                                "torchdump", "died", "end", "alive", "saved", "cell"},
                       "launcher": {"exit", "bad"}, "host": {"wire"}, "holder": {"ports"}, "preflight": {"pulse"}}
    assert Probe.SENDER == "probe" and set(get_args(events.Sender)) == {*senders, "probe"}
    for cls in EVENT_TYPES.values():  # (an annotation the checks do not know would make every such event malformed)
        assert all(str(f.type) in events._READERS and str(f.type) in events._TYPE_WORDS
                   for f in dataclasses.fields(cls)), cls


def test_the_relay_neutralizes_every_mark() -> None:
    assert tagged(b"", b"a\x1flab:tok {}\nb\x1f", b"", False) == (b"a" + NEUTRAL + b"lab:tok {}\n", b"b" + NEUTRAL,
                                                                   False)


def test_a_ranks_output_past_its_limit_is_counted_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lab.core.outcome.OUTPUT_MAX", 10)
    output = Output()
    output.add("12345", 6)
    output.add("67890", 6)
    output.add("later", 6)
    output.add_block(b"x\ny\n")
    assert (output.lines, output.size) == (5, 22)
    assert output.tail() == ["12345", f"[lab: more than {OUTPUT_MAX >> 20} MiB printed: the rest was counted, "
                                      f"not kept]"]


def test_the_flight_recorders_events_have_a_budget_of_their_own_that_grows_with_time() -> None:
    """A job of days sends progress once a second: never failed for it; a flood of them is."""
    progress, result = b'{"event": "progress", "rank": 0}', b'{"event": "result", "rank": 0}'
    chunk = 1 << 20
    days = EventBudget()
    days.started -= 2 * 86400  # two days in: 64 MiB and 4 KiB a second more of them
    assert all(days.take(progress, chunk) for _ in range(EVENTS_MAX // chunk + 100))
    assert days.take(result, chunk)  # the other events have their own 64 MiB
    flood = EventBudget()
    taken = [flood.take(progress, chunk) for _ in range(EVENTS_MAX // chunk + 2)]
    assert taken[:EVENTS_MAX // chunk] == [True] * (EVENTS_MAX // chunk) and taken[-2:] == [False, False]
    assert flood.over == f"sent its flight recorder's events faster than {FLIGHT_RATE} bytes a second " \
                         "(the rest were dropped)"
    assert flood.take(result, 100)  # the flood of one kind does not stop the other


def test_more_than_the_events_budget_is_the_senders_failure_said_once() -> None:
    budget = EventBudget()
    said = [(budget.take(b'{"event": "step"}', EVENTS_MAX // 2), budget.first_over) for _ in range(4)]
    assert said == [(True, False), (True, False), (False, True), (False, False)]
    assert budget.over == "sent more than 64 MiB of events (the rest were dropped)"


def test_a_launchers_word_is_taken_once_and_a_second_fails_the_run_naming_the_rank() -> None:
    """What only a host's launcher says (the measure of its connections, how a rank ended) comes once:
    a second word, whoever wrote it, is no launcher's, and fails the rank the run blames for it."""
    plan = build_plan(local_inventory(2), Options((registry.EXERCISES["ring-allreduce"],), wire="netns"))
    run = Ledger(plan, 0.0)
    launch = run.launches[0]
    wire = event_line(plan.token, "wire", rank=0, carried=1000, lost=0)
    run.apply(launch, wire, 1.0)
    assert launch.carried is not None and launch.carried.carried == 1000 and not run.states[0].violations
    run.apply(launch, event_line(plan.token, "wire", rank=0, carried=0, lost=0), 2.0)
    assert launch.carried.carried == 1000  # the first word stands
    assert run.states[0].violations == ["wrote a second word of local's launcher on what its connections carried "
                                        "(the launcher says it once)"]
    ended = event_line(plan.token, "exit", rank=1, code=0)
    run.apply(launch, ended, 3.0)
    run.apply(launch, ended, 4.0)
    assert run.states[1].violations == ["was said to have ended a second time (only its launcher says how a rank "
                                        "ended, once)"]
