"""A rank's steps (lab.rank.steps): what the worker says, the controller reads back as the same
step, and a word that names no step of the run is none."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lab.rank import steps

EXERCISES = ("p2p", "all-reduce", "ring-allreduce")
made = st.one_of(st.just(steps.STARTUP), st.sampled_from(("env", "tcp", "file")).map(steps.rendezvous),
                 st.sampled_from(EXERCISES).map(steps.exercise), st.sampled_from(EXERCISES).map(steps.barrier))


@given(made)
def test_a_step_said_is_read_back_as_itself(step: steps.RankStep) -> None:
    if step is steps.STARTUP:  # (the lab's start, never said: a rank begins in it)
        assert steps.parse(step.wire(), EXERCISES) is None
    else:
        assert steps.parse(step.wire(), EXERCISES) == step


@given(st.text(max_size=120))
def test_a_word_that_names_no_step_of_the_run_is_none(word: str) -> None:
    step = steps.parse(word, EXERCISES)
    assert step is None or step.wire() == word


def test_steps_as_a_person_reads_them() -> None:
    assert [str(s) for s in (steps.STARTUP, steps.rendezvous("tcp"), steps.exercise("p2p"), steps.barrier("p2p"))] \
        == ["start-up (importing torch)", "the rendezvous (init_method tcp://)", "p2p", "the barrier after p2p"]
    assert steps.parse("wait:bench", EXERCISES) is None and steps.parse("init:" + "x" * 200, EXERCISES) is None
    assert [s.exercise for s in (steps.STARTUP, steps.barrier("p2p"))] == [None, "p2p"]
