"""The rule of quiet (lab.rank.quiet), on made-up counters and a made-up clock: how long nothing
moved, when a progress event is news, when a blocking call is quiet for --hang-after, and when the
rank looks next."""
from __future__ import annotations

from collections.abc import Hashable

import pytest

from lab.rank.quiet import LOOK_LATE, PROGRESS_EVERY, Look, Quiet, Verdict, quiet_enough

T0 = 1_700_000_000.0  # the wall clock at monotonic 0


class Rank:
    """Looks at a rank whose two clocks move together; what it does is set between looks."""

    def __init__(self, hang_after: float) -> None:
        self.rule = Quiet(hang_after)
        self.completed, self.call, self.since, self.mark = 0, None, None, (0, 0)
        self.changed_at = -float("inf")

    def look(self, at: float, mark: Hashable | None = None, wall_late: float = 0.0) -> Verdict:
        if mark is not None:
            self.mark = mark
        return self.rule.look(Look(self.completed, self.call, "in_flight" if self.call else "", self.since,
                                   self.mark, self.changed_at, at, T0 + at + wall_late))

    def blocks(self, at: float, call: int = 1) -> None:
        self.call, self.since = call, T0 + at

    def completes(self, at: float) -> None:
        self.completed += 1
        self.call, self.since, self.changed_at = None, None, T0 + at


def test_a_call_blocked_with_nothing_moving_is_quiet_from_its_start_and_said_once_at_hang_after() -> None:
    rank = Rank(hang_after=5)
    assert rank.look(0.0).say  # (the first look: news)
    rank.blocks(0.4)  # (it began between two looks: its quiet counts from then)
    first = rank.look(1.0)
    assert first.say and first.quiet == pytest.approx(0.6) and not first.quiet_enough
    assert first.next_look == PROGRESS_EVERY
    at, verdicts = 1.0, []
    while at < 8:
        verdict = rank.look(at)
        verdicts.append((at, verdict))
        at += verdict.next_look
    told = [(at, v) for at, v in verdicts if v.quiet_enough]
    assert len(told) == 1 and told[0][0] == pytest.approx(5.4 + LOOK_LATE)  # at hang-after, not the next second
    assert all(not v.say for at, v in verdicts if at > told[0][0])  # then silence: nothing changed


def test_bytes_that_move_keep_a_slow_call_from_being_quiet() -> None:
    rank = Rank(hang_after=3)
    rank.blocks(0.0)
    for second in range(1, 20):
        verdict = rank.look(float(second), mark=(second * 1000, 0))  # (a slow collective: its bytes flow)
        assert verdict.quiet < 1.0 and not verdict.quiet_enough
    stopped = [rank.look(float(second)) for second in range(20, 26)]  # (then nothing moves after 19 s)
    assert [v.quiet_enough for v in stopped] == [False, False, True, False, False, False]


def test_a_completed_call_is_news_and_starts_the_quiet_anew() -> None:
    rank = Rank(hang_after=3)
    rank.look(0.0)
    rank.blocks(0.0)
    assert rank.look(3.5).quiet_enough
    rank.completes(3.6)
    rank.blocks(3.7, call=2)
    again = rank.look(4.0)
    assert again.say and again.quiet == pytest.approx(0.3) and not again.quiet_enough


def test_a_busy_machine_that_delays_the_looks_cannot_make_moving_bytes_quiet() -> None:
    """A look late by seconds finds counters that moved: the quiet is from that look, whatever the wait."""
    rank = Rank(hang_after=3)
    rank.look(0.0)
    rank.blocks(0.0)
    assert not rank.look(1.0, mark=(10, 0)).quiet_enough
    late = rank.look(9.0, mark=(20, 0))  # (8 s later, as a stalled thread wakes: the bytes moved meanwhile)
    assert late.quiet == 0.0 and not late.quiet_enough


def test_without_hang_after_a_blocked_call_is_never_quiet_enough_and_the_looks_keep_their_pace() -> None:
    rank = Rank(hang_after=0)
    rank.blocks(0.0)
    verdicts = [rank.look(float(s)) for s in range(1, 30)]
    assert not any(v.quiet_enough for v in verdicts) and {v.next_look for v in verdicts} == {PROGRESS_EVERY}
    assert [v.say for v in verdicts] == [True] + [False] * 28  # (nothing new after the first)


def test_quiet_enough_is_the_one_threshold() -> None:
    assert quiet_enough(5.0, 5.0) and not quiet_enough(4.99, 5.0) and not quiet_enough(100.0, 0.0)
