"""What the ranks report is theirs to make up: a student's program can replace the exercise's driver
and report any value, any calls. The grader's parsers and checks take anything, and a result a check
cannot compute with fails the exercise in one line, never the grader (lab.core.judge.checked).
Property-based (hypothesis): no torch, no processes."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lab.core.judge import checked
from lab.core.outcome import ExerciseRun
from lab.rank.events import INT_DIGITS, MalformedEvent, Result, parse_event
from lab.suite.check import World
from lab.suite.registry import EXERCISES

TOKEN = "t0k3n"
BIGGEST = 10 ** INT_DIGITS - 1  # (what an event may hold: any 64-bit integer, and no more digits)

# Any JSON value an event can carry once parsed: whole numbers within the events' bound.
values = st.recursive(
    st.none() | st.booleans() | st.integers(-BIGGEST, BIGGEST) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=24)
# Calls as a rank sends them (lab.rank.calls: op -> {count, bytes, ...}), or anything else.
calls = st.dictionaries(st.sampled_from(["all_reduce", "send", "recv", "isend", "irecv", "broadcast", "x"]),
                        st.dictionaries(st.sampled_from(["count", "bytes", "numel", "peers"]), values, max_size=4),
                        max_size=4) | values


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exercise=st.sampled_from(sorted(EXERCISES)), n=st.integers(1, 4), data=st.data())
def test_any_results_and_calls_are_checked_to_a_verdict_and_never_break_the_grader(exercise: str, n: int,
                                                                                 data: st.DataObject) -> None:
    run = ExerciseRun(exercise, results={r: data.draw(values) for r in range(n)},
                      calls={r: data.draw(calls) for r in range(n) if data.draw(st.booleans())})
    world = World(n, "gloo", tuple(f"h{r % 2}" for r in range(n)), tuple(r // 2 for r in range(n)))
    report = checked(run, world, data.draw(st.sampled_from([None, *(p for p in EXERCISES[exercise].parts)])))
    assert report.status in ("pass", "fail") and "\n" not in report.reason


def test_a_result_a_check_cannot_compute_with_fails_its_exercise_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a value check met a shape of [10**400] (before the events bounded their numbers): the
    check's exception is the exercise's failure, named, and the grader goes on."""
    exercise = EXERCISES["ring-allreduce"]

    def overflows(*_: object) -> None:
        raise OverflowError("int too large to convert to float\n(a second line)")

    monkeypatch.setattr(type(exercise), "judge", overflows)
    report = checked(ExerciseRun("ring-allreduce", results={0: {}, 1: {}}), World(2, "gloo", ("h", "h"), (0, 1)), None)
    assert (report.status, report.reason) == (
        "fail", "its results could not be checked: OverflowError: int too large to convert to float")


@pytest.mark.parametrize("number", ["1" + "0" * 400, "-" + "9" * 20])
def test_a_number_past_any_64_bit_integer_makes_its_event_malformed(number: str) -> None:
    line = f'\x1flab:{TOKEN} {{"event": "result", "rank": 0, "exercise": "x", "value": [{number}], "seconds": 1}}'
    with pytest.raises(MalformedEvent, match=f"a number of {len(number.lstrip('-'))} digits"):
        parse_event(line, TOKEN)
    biggest = line.replace(number, str(-BIGGEST))
    said = parse_event(biggest, TOKEN)
    assert isinstance(said, Result) and said.value == [-BIGGEST]


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30))
def test_any_json_on_the_channel_is_an_event_or_malformed_never_a_crash(value: Any) -> None:
    try:
        parse_event(f"\x1flab:{TOKEN} {json.dumps(value)}", TOKEN)
    except MalformedEvent:
        pass
