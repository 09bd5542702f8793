"""The run's ledger, fed made-up event sequences on a made-up clock: the hang rule, the step
timeouts and exercise deadlines, the events a rank may not send, and what the run is at. No
process, no thread, no clock (lab.core.ledger is pure; the runner's real runs are in test_flight,
test_channel and the tiers)."""
from __future__ import annotations

from typing import Any

import pytest

from lab.core.judge import judge, the_network_may_be_why
from lab.core.ledger import TIMEOUT_SETTLE, Ledger
from lab.core.outcome import Cause, RunOutcome
from lab.core.plan import Options
from lab.core.planner import build_launch_plan, build_plan
from lab.errors import UsageError
from lab.inventory.hosts import local_inventory
from lab.rank.protocol import event_line
from lab.rank.record import Record, to_wire
from lab.suite import registry

HANG_AFTER = 10.0
TIMEOUT = 60.0


def ledger(*exercises: str) -> Ledger:
    """A ledger of a 3-rank run of ``exercises`` on this machine, begun at 0."""
    options = Options(tuple(registry.EXERCISES[e] for e in exercises), timeout=TIMEOUT, hang_after=HANG_AFTER)
    run = Ledger(build_plan(local_inventory(3), options, "t0k3n"), 0.0)
    run.begin(0.0)
    return run


def send(run: Ledger, now: float, kind: str, rank: int, **fields: Any) -> None:
    run.apply(run.launches[0], event_line(run.plan.token, kind, rank=rank, **fields), now)


def blocked(run: Ledger, now: float, rank: int, quiet: float, call: str | None = "all_reduce") -> None:
    """Rank ``rank`` says it blocks in ``call`` (None: in no call) and nothing moved for ``quiet`` s."""
    inflight = to_wire(Record(4, "world", call, "in_flight", now)) if call else None
    send(run, now, "progress", rank, completed=3, inflight=inflight, moved=0, quiet=quiet)


def started(run: Ledger, now: float, step: str) -> None:
    for rank in range(3):
        send(run, now, "hello", rank, pid=100 + rank, hostname="local", local_rank=rank)
        send(run, now, "step", rank, step=step)


def test_ranks_hang_when_every_live_one_blocks_and_nothing_moved_for_hang_after() -> None:
    run = ledger("ring-allreduce")
    started(run, 1.0, "ring-allreduce")
    heard = {"local": 100.0}  # when each host's transport last heard from it

    def heard_since(host: str, since: float) -> bool:
        return heard[host] >= since

    for rank in range(3):
        blocked(run, 20.0, rank, quiet=HANG_AFTER - 1)
    assert run.hung(20.0, heard_since) == []  # not quiet long enough
    for rank in range(2):
        blocked(run, 21.0, rank, quiet=HANG_AFTER)
    blocked(run, 21.0, 2, quiet=0, call=None)  # rank 2 computes: the others wait on a straggler
    assert run.hung(21.0, heard_since) == []
    blocked(run, 22.0, 2, quiet=HANG_AFTER)
    assert run.hung(22.0, heard_since) == [0, 1, 2]
    heard["local"] = 5.0  # the host went silent before the ranks did: its transport's to say, no hang
    assert run.hung(22.0, heard_since) == []
    heard["local"] = 100.0
    send(run, 23.0, "exit", 2, code=1)  # a rank that ended is not waited on; the others still hang
    assert run.hung(23.0, heard_since) == [0, 1]


def test_a_step_has_the_timeout_and_an_exercise_a_deadline_no_later_step_moves() -> None:
    run = ledger("ring-allreduce")
    started(run, 1.0, "ring-allreduce")
    assert run.late(1.0 + TIMEOUT) == []
    send(run, 30.0, "step", 0, step="ring-allreduce")  # the step it is in already: its clock stays
    send(run, 40.0, "step", 1, step="wait:ring-allreduce")  # a new step, but the exercise's deadline stands
    assert run.late(1.0 + TIMEOUT + 1) == [0, 1, 2]
    send(run, 50.0, "result", 1, exercise="ring-allreduce", value=[6.0], seconds=1.0)
    assert run.late(1.0 + TIMEOUT + 1) == [0, 2]  # rank 1 reported and waits at the barrier: its step is 21 s old


def test_a_job_runs_as_long_as_its_timeout_says_and_with_none_for_ever() -> None:
    """`lab launch` has no wall-clock limit unless --timeout gives one: a job may train for days (what
    stops a job that hangs is the hang rule, a lost host its keepalives)."""
    for timeout, late_at in ((30.0, 32.0), (0.0, None)):
        run = Ledger(build_launch_plan(local_inventory(2), "train.py", (), timeout), 0.0)
        run.begin(0.0)
        for rank in range(2):
            send(run, 1.0, "hello", rank, pid=100 + rank, hostname="local", local_rank=rank)
        assert run.late(29.0) == []
        assert run.late(32.0) == ([0, 1] if late_at else [])
        assert run.late(7 * 24 * 3600.0) == ([0, 1] if late_at else [])  # (a week)


def test_the_labs_own_steps_count_only_time_in_which_nothing_of_the_run_moved() -> None:
    """A busy machine slows start-up: its timeout counts from the last news of any rank, and a
    start-up's CPU seconds growing is news; CPU seconds past the timeout are late anyway."""
    run = ledger("p2p")
    send(run, 50.0, "alive", 0, cpu=20.0)
    send(run, 50.0, "alive", 1, cpu=20.0)
    assert run.late(100.0) == []  # nothing moved since 50 for 50 s < 60
    assert run.late(111.0) == [0, 1, 2]
    send(run, 105.0, "alive", 2, cpu=25.0)
    assert run.late(111.0) == []
    send(run, 106.0, "alive", 2, cpu=TIMEOUT + 1)
    assert run.late(107.0) == [2]


def test_an_event_that_breaks_the_protocol_fails_its_sender_in_the_exercise_it_is_in() -> None:
    run = ledger("p2p", "broadcast")
    started(run, 1.0, "p2p")
    send(run, 2.0, "result", 0, exercise="all-gather", value=1, seconds=0.1)
    send(run, 2.0, "result", 1, exercise="p2p", value=1, seconds=0.1)
    send(run, 2.0, "result", 1, exercise="p2p", value=2, seconds=0.1)
    send(run, 2.0, "step", 2, step="rm -rf /")
    send(run, 2.0, "hello", 7, pid=1, hostname="x", local_rank=0)
    run.apply(run.launches[0], "\x1flab:t0k3n {not json", 2.0)
    assert run.runs["p2p"].violations == {
        0: "reported on 'all-gather', which is not an exercise of the run",
        1: "reported on p2p twice",
        2: "began a step the run does not have: 'rm -rf /'"}
    assert run.runs["p2p"].results == {1: 1}  # the first report stands
    assert run.states[0].violations == [  # (a broken event that names no rank of the run: the launch's first)
        "reported on 'all-gather', which is not an exercise of the run",
        "sent an event as rank 7, which the run does not have",
        "sent a malformed event: not JSON: Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1)"]
    assert run.runs["broadcast"].violations == {}


def test_what_the_run_is_at_is_said_from_its_ranks_steps() -> None:
    run = ledger("p2p")
    assert run.phase() == ("starting", "starting 3 rank(s): 0 started")
    for rank in range(3):
        send(run, 1.0, "hello", rank, pid=100 + rank, hostname="local", local_rank=rank)
        send(run, 1.0, "step", rank, step="init:env")
    assert run.phase() == ("rendezvous", "rendezvous: 0 of 3 rank(s) joined")
    for rank in range(3):
        send(run, 2.0, "step", rank, step="p2p")
    assert run.phase() == ("running", "running p2p: 3 rank(s)")
    for rank in range(3):
        send(run, 3.0, "done", rank, failures=0)
    assert run.phase() == ("finishing", "finishing: every rank has ended")


def test_a_script_that_exits_0_is_done_and_one_whose_launch_ended_early_crashed() -> None:
    run = Ledger(build_launch_plan(local_inventory(2), "/x/train.py", [], 30.0, token="t0k3n"), 0.0)
    send(run, 1.0, "exit", 0, code=0)
    assert run.states[0].done and run.states[0].ended_at == 1.0
    launch = run.launches[0]
    launch.exit_code = 1
    assert run.ended(launch, 5.0) == 5.0  # rank 1 had not finished: a crash, at 5
    assert (run.states[1].exit_code, run.states[1].done) == (1, False)


def torchrun_launch(max_restarts: int) -> Ledger:
    """A ledger of ``lab launch --launcher torchrun --max-restarts N`` of 2 ranks on this machine."""
    plan = build_launch_plan(local_inventory(2), "/x/train.py", [], 30.0, launcher="torchrun", token="t0k3n",
                             max_restarts=max_restarts)
    run = Ledger(plan, 0.0)
    run.begin(0.0)
    return run


def hello(run: Ledger, now: float, rank: int, restart: int) -> None:
    send(run, now, "hello", rank, pid=100 + rank + 10 * restart, hostname="local", local_rank=rank, restart=restart)


def test_a_restart_of_torchruns_begins_each_rank_anew_and_says_what_ended_the_attempt_before() -> None:
    run = torchrun_launch(max_restarts=2)
    for rank in (0, 1):
        hello(run, 1.0, rank, restart=0)
        blocked(run, 2.0, rank, quiet=1.0)
    send(run, 2.5, "end", 0, how="raised", code=1, error="RuntimeError: Connection closed by peer [10.0.0.2]:7",
         where="train.py:14", traceback="Traceback ...")  # (its host's stream brought its end first)
    send(run, 3.0, "end", 1, how="raised", code=1, error="ValueError: bad batch", where="train.py:12",
         traceback="Traceback ...")
    hello(run, 9.0, 1, restart=1)  # the first rank of the second attempt
    assert [(r.count, r.ended) for r in run.restarts] == [(1, (
        "rank 1 (local) raised ValueError: bad batch at train.py:12",  # its own failure first, then the echo
        "rank 0 (local) raised RuntimeError: Connection closed by peer [10.0.0.2]:7 at train.py:14"))]
    restarted = run.states[1]
    assert (restarted.info and restarted.info.pid, restarted.end, restarted.progress, restarted.step_started) == (
        111, None, None, 9.0)  # nothing the last attempt said holds for this one
    assert run.states[0].progress is not None  # (rank 0 has not said its new hello yet)
    hello(run, 9.5, 0, restart=1)
    assert run.states[0].progress is None and len(run.restarts) == 1  # one restart, however many ranks say it
    hello(run, 20.0, 0, restart=2)  # the second restart: no rank said how the attempt before ended
    assert run.restarts[-1].line(2) == ("torchrun restarted the ranks (2 of --max-restarts 2) after attempt 2 ran "
                                        "11.0s: no rank said how it ended (a signal, or before the lab's recorder)")
    assert [r.seconds for r in run.restarts] == [9.0, 11.0]  # (the first attempt from the run's start)
    assert not any(s.violations for s in run.states)


def test_a_hello_torchrun_did_not_restart_for_is_the_failure_of_the_rank_that_said_it() -> None:
    run = torchrun_launch(max_restarts=1)
    hello(run, 1.0, 0, restart=0)
    hello(run, 2.0, 0, restart=0)  # the same attempt again
    hello(run, 3.0, 1, restart=2)  # a restart past --max-restarts
    assert run.states[0].violations == ["said hello a second time in one attempt"]
    assert run.states[1].violations == ["said hello as torchrun's restart 2, past --max-restarts 1"]
    assert run.restarts == []


def test_max_restarts_is_refused_for_a_launcher_that_does_not_restart_ranks() -> None:
    with pytest.raises(UsageError, match=r"--max-restarts 1: only torchrun's agent restarts the ranks \(--launcher "
                                         r"torchrun or srun-torchrun\), not --launcher lab"):
        build_launch_plan(local_inventory(2), "/x/train.py", [], 30.0, max_restarts=1)


def test_a_rank_s_clock_is_the_least_gap_seen_and_its_trace_keeps_the_newest_word_on_each_call() -> None:
    run = ledger("p2p")
    send(run, 100.0, "progress", 0, completed=0, inflight=None, moved=0, quiet=0, at=5000.5)
    send(run, 101.0, "progress", 0, completed=1, inflight=None, moved=0, quiet=0, at=5001.6)  # (came sooner)
    send(run, 102.0, "progress", 0, completed=2, inflight=None, moved=0, quiet=0, at=float("nan"))
    send(run, 103.0, "progress", 0, completed=3, inflight=None, moved=0, quiet=0, at=-1.0)
    assert run.states[0].clock == pytest.approx(101.0 - 5001.6)
    record = {"seq": 2, "group": "world", "op": "all_reduce", "state": "in_flight", "t0": 5001.0}
    send(run, 104.0, "trace", 0, records=[record, "not a record"], dropped=3)
    send(run, 105.0, "trace", 0, records=[{**record, "state": "done", "t1": 5001.1}], dropped=2)
    assert list(run.states[0].trace.values()) == [Record(2, "world", "all_reduce", "done", 5001.0, t1=5001.1)]
    assert run.states[0].trace_dropped == 3  # (the rank's count only grows)


@pytest.mark.parametrize("cause, asked", [(None, True), ("rendezvous", True), ("unknown", True),
                                          ("p2p-cycle", False), ("missing-rank", False)])
def test_the_doctor_is_asked_of_a_hang_at_the_rendezvous_unless_the_run_named_its_programs_cause(
        cause: str | None, asked: bool) -> None:
    run = ledger("ring-allreduce")
    for rank in range(3):
        send(run, 1.0, "hello", rank, pid=100 + rank, hostname="local", local_rank=rank)
        send(run, 1.0, "step", rank, step="init:env")
    outcome = RunOutcome(run.plan, run.states, run.runs, "hung", 30.0, hung=[0, 1, 2],
                         cause=Cause(cause, "What the analysis said.") if cause else None)  # type: ignore[arg-type]
    assert the_network_may_be_why(outcome) is asked


TIMED_OUT_ERROR = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                   "4000ms for recv operation to complete")


def ended(run: Ledger, now: float, rank: int, error: str) -> None:
    """Rank ``rank``'s program raised ``error`` and the rank ended (its launcher said so)."""
    send(run, now, "end", rank, how="raised", code=1, error=error, where="train.py:30", traceback="")
    send(run, now, "exit", rank, code=1)


@pytest.mark.parametrize("error, told", [(TIMED_OUT_ERROR, True), ("ValueError: bad batch", False)])
def test_once_the_ranks_that_died_timed_out_and_the_others_in_the_call_had_time_to_nothing_more_is_waited_for(
        error: str, told: bool) -> None:
    """The crash's grace (what the live ranks may still say) ends once the first rank that died timed out
    waiting and none died for TIMEOUT_SETTLE: its peers in the call have timed out by then too, and
    those that waited on it have lost it."""
    run = Ledger(build_launch_plan(local_inventory(4), "/x/train.py", [], 30.0, token="t0k3n"), 0.0)
    run.begin(0.0)
    for rank in range(4):
        send(run, 1.0, "hello", rank, pid=100 + rank, hostname="local", local_rank=rank)
    assert not run.crash_told(9.0)  # (nothing died yet)
    ended(run, 9.0, 1, error)
    assert not run.crash_told(9.5)  # ranks 2 and 3, which waited in that call too, may time out still
    ended(run, 9.6, 2, error)
    assert not run.crash_told(10.5)
    assert run.crash_told(9.6 + TIMEOUT_SETTLE) is told  # (rank 3 is still running: rank 0's stacks say where)
    ended(run, 11.0, 3, "RuntimeError: Connection closed by peer")  # it lost a peer that died: it follows
    assert not run.crash_told(11.5)
    assert run.crash_told(11.0 + TIMEOUT_SETTLE) is told


def test_a_rank_that_died_unheard_in_the_exercise_is_its_cause_and_its_peers_errors_the_echo() -> None:
    """Rank 0 takes its launcher down as it begins the exercise (kill(-1)): the word that it began went
    with it, so it was last heard in the rendezvous; rank 1 lost it in the exercise. Rank 0 is the cause,
    said as it is known; rank 1's error follows it."""
    run = ledger("ring-allreduce")
    for rank in range(3):
        send(run, 1.0, "hello", rank, pid=100 + rank, hostname="local", local_rank=rank)
        send(run, 1.0, "step", rank, step="init:env")
    for rank in (1, 2):
        send(run, 2.0, "step", rank, step="ring-allreduce")
    send(run, 2.5, "exit", 0, code=-9)
    send(run, 2.6, "error", 1, exercise="ring-allreduce", error="RuntimeError: Connection reset by peer",
         where="ring.py:12", traceback="")
    outcome = RunOutcome(run.plan, run.states, run.runs, "completed", 3.0)
    [report] = judge(outcome)
    assert report.status == "fail" and report.ranks == (0, 1), report
    assert report.reason == ("rank 0 (local) was killed by SIGKILL while the others ran ring-allreduce, last heard in "
                             "the rendezvous (init_method env://) (and 1 more)"), report.reason
    # a rank that dies before the exercise, which no rank then ran, is no exercise's failure: it never ran
    run = ledger("ring-allreduce")
    for rank in range(3):
        send(run, 1.0, "hello", rank, pid=100 + rank, hostname="local", local_rank=rank)
        send(run, 1.0, "step", rank, step="init:env")
    send(run, 2.5, "exit", 0, code=-9)
    [report] = judge(RunOutcome(run.plan, run.states, run.runs, "completed", 3.0))
    assert report.status == "not run" and report.reason.startswith("not run: rank 0 (local) was killed by SIGKILL"), \
        report
