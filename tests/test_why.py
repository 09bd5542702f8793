"""The cause across ranks (lab.core.why), from synthetic flight records: each kind of cause the
issue names, the healthy cases that are none, and records no honest rank sends (never a crash)."""
from __future__ import annotations

import json
import random
from typing import Any

import pytest

from lab.core.rankview import gist, ordinal, ranks_named
from lab.core.why import Cause, RankFacts, explain
from lab.rank.flightrecords import (
    RECORDS_MAX,
    read_calls,
    read_counts,
    read_files,
    read_made,
    read_record,
    read_steps,
    read_timeouts,
)

LOST = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:41234"
LOST_SHOWN = "RuntimeError: Connection closed by peer [10.0.0.2]:41234"  # as a headline shows it: no C++ place
SIZE_CHECK = ("RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
              "op.preamble.length <= op.nbytes. 32 vs 16")


def rec(seq: int, op: str, state: str = "done", **fields: Any) -> dict[str, Any]:
    """One record in the design's format (4 floats on the world group at train.py:10, unless told)."""
    record: dict[str, Any] = {
        "seq": seq, "group": "world", "op": op, "numel": 4, "shape": [4], "dtype": "float32", "peer": None,
        "root": None, "tag": None, "reduce_op": "SUM" if op in ("all_reduce", "reduce") else None, "async": False,
        "where": "train.py:10", "state": state, "error": None, "t0": 1000.0 + seq, "t1": None}
    if state in ("done", "raised"):
        record["t1"] = record["t0"] + 0.5
    record.update(fields)
    return record


def loop(n: int, op: str = "all_reduce", **fields: Any) -> list[dict[str, Any]]:
    """``n`` done calls of ``op``, numbered 1..n."""
    return [rec(seq, op, **fields) for seq in range(1, n + 1)]


def rank(r: int, records: Any = (), inflight: Any = (), counts: Any = None, **facts: Any) -> RankFacts:
    """A rank on host node<r+1>, its flight dump's fields as it sent them (records and inflight as lists,
    None: no dump came; steps, died_in), read as the events read them."""
    return read(r, f"node{r + 1}", records=records, inflight=inflight, counts=counts, **facts)


def read(r: int, host: str, records: Any = None, inflight: Any = None, counts: Any = None, steps: Any = None,
         died_in: Any = None, made: Any = None, timeouts: Any = None, files: Any = None, **facts: Any) -> RankFacts:
    """The facts of a rank that sent these fields (raw), read by the events' readers (lab.rank.flightrecords)."""
    died = None if died_in is None else read_record(died_in)
    assert not isinstance(died, str), died
    return RankFacts(r, host, records=None if records is None else read_calls(list(records)),
                     inflight=None if inflight is None else read_calls(list(inflight)),
                     counts=None if counts is None else read_counts(counts),
                     steps=None if steps is None else read_steps(steps), died_in=died,
                     made=None if made is None else read_made(made),
                     timeouts=None if timeouts is None else read_timeouts(timeouts),
                     files=None if files is None else read_files(files), **facts)


def lines(cause: Cause) -> list[str]:
    return [e.line() for e in cause.evidence]


def made(*groups: tuple[list[int], int]) -> list[list[Any]]:
    """A rank's groups made as it sends them: (members, line of train.py) each, in order."""
    return [[n, members, f"train.py:{line}"] for n, (members, line) in enumerate(groups, 1)]


# Groups made (new_group: every rank makes every group, members or not, in the same order)

HUNG = {"inflight": [rec(5, "all_reduce", "in_flight", where="train.py:40")]}


def test_ranks_that_have_not_made_a_group_the_others_made_first_are_named_with_both_lines() -> None:
    ranks = [rank(r, made=made(([0, 1], 20), ([0, 2], 21)) if r < 2 else made(([0, 2], 21)), **HUNG)
             for r in range(4)]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == ("collective-mismatch", (
        "Ranks 2, 3 have not made new_group([0, 1]) at train.py:20, the 1st group ranks 0, 1 made: their 1st is "
        "new_group([0, 2]) at train.py:21, their 2nd, so from there on the ranks' groups are crossed."))
    assert cause.fix is not None and "members or not" in cause.fix and "use_local_synchronization" in cause.fix


def test_ranks_that_have_not_made_several_groups_are_told_them_all() -> None:
    skipped = [([0, 1], 24), ([2, 3], 24), ([4, 5], 24)]
    ranks = [rank(r, made=made(*skipped, ([0, 2], 25)) if r < 2 else made(([0, 2], 25)), **HUNG) for r in range(6)]
    headline = explain(ranks).headline
    assert headline.startswith("Ranks 2-5 have not made new_group([0, 1]) at train.py:24 and new_group([2, 3]) at "
                               "train.py:24 and 1 more, the 1st-3rd groups ranks 0, 1 made: their 1st is "
                               "new_group([0, 2]) at train.py:25, their 4th"), headline


def test_the_same_groups_made_in_different_orders_are_told_as_the_order() -> None:
    ranks = [rank(r, made=made(([0, 1], 9), ([2, 3], 9)) if r < 2 else made(([2, 3], 9), ([0, 1], 9)), **HUNG)
             for r in range(4)]
    cause = explain(ranks)
    assert cause.headline == ("The ranks make their groups in different orders: ranks 0, 1 make new_group([0, 1]) "
                              "at train.py:9 as their 1st group, ranks 2, 3 make new_group([2, 3]) at train.py:9.")
    assert cause.fix is not None and "same order" in cause.fix and "not starting from the rank's own" in cause.fix


def test_different_groups_at_one_place_are_told_side_by_side() -> None:
    ranks = [rank(r, made=made(([0, 1] if r < 2 else [2, 3], 12 if r < 2 else 14)), **HUNG) for r in range(4)]
    assert explain(ranks).headline == (
        "The ranks make different groups as their 1st: ranks 0, 1 make new_group([0, 1]) at train.py:12; ranks 2, 3 "
        "make new_group([2, 3]) at train.py:14.")


def test_ranks_that_made_fewer_groups_so_far_or_the_same_are_no_finding() -> None:
    """A rank that has not made its groups yet (made lazily, later) agrees as far as it went."""
    same = made(([0, 1], 5), ([2, 3], 6))
    for sent in ([same, same, same[:1], []], [same] * 4):
        cause = explain([rank(r, made=m, **HUNG) for r, m in enumerate(sent)])
        assert "new_group" not in cause.headline, cause.headline


def test_malformed_groups_made_are_skipped_and_said() -> None:
    ranks = [rank(0, made=[[1, [0, 1], "train.py:5"], [2, "0,1", "x"], "junk", [3, [-1], "y"]], **HUNG),
             rank(1, made=made(([0, 1], 5)), **HUNG)]
    cause = explain(ranks)
    assert "rank 0: 3 malformed groups made skipped" in cause.notes and "new_group" not in cause.headline


# A rank outside any call past the group's timeout


def test_ranks_that_timed_out_waiting_for_a_rank_outside_any_call_name_it_and_where_it_was() -> None:
    gone = "RuntimeError: Timed out waiting 4000ms for recv operation to complete"
    waited = [rank(r, records=[*loop(8), rec(9, "all_reduce", "raised", error=gone, t1=1013.0)], ended="raised",
                   error=gone, exit_code=1) for r in (1, 2, 3)]
    copying = rank(0, records=loop(8), stopped_at="train.py:16 in <module>: time.sleep(9)")
    cause = explain([copying, *waited])
    assert (cause.kind, cause.headline) == ("missing-rank", (
        "Ranks 1-3 timed out after 4 s waiting in all_reduce #9 at train.py:10 for rank 0, which is not in a "
        "torch.distributed call at train.py:16 in <module>: time.sleep(9) (its last call there, all_reduce #8, "
        "ended 4.5 s before they gave up)."))
    assert cause.fix is not None and "timeout" in cause.fix and "checkpoint" in cause.fix
    assert lines(cause)[1].startswith("rank 1 (node2): all_reduce #9, SUM, 4 floats: timed out: RuntimeError: Timed")


def test_the_line_that_gave_the_group_its_timeout_is_told_with_it() -> None:
    gone = "RuntimeError: Timed out waiting 4000ms for recv operation to complete"
    given = [["world", 4.0, "train.py:3"], ["g0,1#0", 9.0, "train.py:5"]]
    waited = [rank(r, records=[*loop(8), rec(9, "all_reduce", "raised", error=gone, t1=1013.0)], ended="raised",
                   error=gone, exit_code=1, timeouts=given) for r in (1, 2, 3)]
    copying = rank(0, records=loop(8), stopped_at="train.py:16 in <module>: time.sleep(9)", timeouts=given)
    assert explain([copying, *waited]).headline.startswith(
        "Ranks 1-3 timed out after 4 s (the timeout init_process_group was given at train.py:3) waiting in "
        "all_reduce #9 at train.py:10 for rank 0, ")
    unsaid = [rank(r, records=[*loop(8), rec(9, "all_reduce", "raised", error="RuntimeError: timed out", t1=1013.0)],
                   ended="raised", error="RuntimeError: timed out", exit_code=1, timeouts=[["world", 4.5, "t.py:2"]])
              for r in (1, 2, 3)]  # (the error says no time: the one the program gave is told)
    assert explain([copying, *unsaid]).headline.startswith(
        "Ranks 1-3 timed out after 4.5 s (the timeout init_process_group was given at t.py:2) waiting in ")
    apart = [rank(r, records=[*loop(8), rec(9, "all_reduce", "raised", error=gone, t1=1013.0)], ended="raised",
                  error=gone, exit_code=1, timeouts=[["world", 4.0, f"train.py:{r}"]]) for r in (1, 2, 3)]
    assert explain([copying, *apart]).headline.startswith("Ranks 1-3 timed out after 4 s waiting in ")  # (which line?)


def test_malformed_group_timeouts_are_skipped_and_said() -> None:
    read = read_timeouts([["world", 4, "a.py:1"], ["world", -1, "b"], ["world", True, "c"], "junk", [1, 2, "d"],
                          ["g", float("inf"), "e"], ["g\nx", 2.5, "f.py:2\nmore"]])
    assert (read.malformed, [(t.group, t.seconds, t.where) for t in read.timeouts]) == (
        5, [("world", 4.0, "a.py:1"), ("g", 2.5, "f.py:2")])
    cause = explain([rank(0, timeouts=[["world", "4", "x"]], **HUNG), rank(1, **HUNG)])
    assert "rank 0: 1 malformed group timeouts skipped" in cause.notes


def test_a_rank_that_came_after_the_others_timed_out_is_told_late() -> None:
    gone = "RuntimeError: Timed out waiting 4000ms for send operation to complete"
    waited = [rank(r, records=[rec(1, "all_reduce", "raised", error=gone, t1=1005.0)], ended="raised", error=gone,
                   exit_code=1) for r in (0, 1)]
    closed = "RuntimeError: Connection closed by peer [127.0.0.1]:9918"
    late = rank(2, records=[rec(1, "all_reduce", "raised", error=closed, t0=1009.5, t1=1009.6)], ended="raised",
                error=closed, exit_code=1)
    headline = explain([*waited, late]).headline
    assert headline.startswith("Ranks 0, 1 timed out after 4 s waiting in all_reduce #1 at train.py:10 for rank 2, "), \
        headline
    assert "it began all_reduce #1 only 4.5 s after they gave up" in headline


def test_a_timeout_where_every_rank_of_the_group_was_in_the_call_is_not_told_as_a_late_rank() -> None:
    gone = "RuntimeError: Timed out waiting 4000ms for recv operation to complete"
    ranks = [rank(r, records=[rec(1, "all_reduce", "raised", error=gone, t1=1005.0)], ended="raised", error=gone,
                  exit_code=1) for r in (0, 1)]
    assert "timed out after" not in explain(ranks).headline


def test_a_rank_that_destroyed_the_group_and_returned_early_is_told_so_with_a_fix_for_either_reason() -> None:
    gone = rank(2, records=loop(4), counts={"world": {"all_reduce": 4}}, ended="exited", exit_code=0,
                destroyed="train.py:31")
    waiting = [rank(r, records=loop(4), counts={"world": {"all_reduce": 4}},
                    inflight=[rec(5, "all_reduce", "in_flight", where="train.py:21")]) for r in (0, 1)]
    cause = explain([*waiting, gone])
    assert cause.kind == "uneven-counts"
    assert cause.headline.endswith("rank 2 finished after 4; rank 2 destroyed the process group at train.py:31 and "
                                   "returned."), cause.headline
    assert cause.fix is not None and "all_reduce the stop flag" in cause.fix and "drop_last=True" in cause.fix


# What an error says past its first line


def test_a_dataloader_workers_exception_is_shown_beneath_its_own_message() -> None:
    said = ('ValueError: Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call '
            'last):\n  File "/usr/lib/python3/dist-packages/torch/utils/data/_utils/worker.py", line 349, in '
            '_worker_loop\n    data = fetcher.fetch(index)\n  File "/work/proj/data.py", line 12, in __getitem__\n'
            '    raise ValueError(f"bad sample {i}")\nValueError: bad sample 17\n')
    assert gist(said) == ("ValueError: Caught ValueError in DataLoader worker process 0. (from there: ValueError: bad "
                          "sample 17 at data.py:12)")


@pytest.mark.parametrize("named", ["Parameter at index 3 with name module.fc.weight has been marked as ready twice",
                                   "Parameter at index 3 has been marked as ready twice",
                                   "Parameter indices which did not receive grad for rank 1: 4 5",
                                   "Parameters which did not receive grad for rank 0: aux.bias, aux.weight"])
def test_what_a_long_message_of_ddps_names_past_the_cut_is_kept(named: str) -> None:
    said = f"RuntimeError: Expected to mark a variable ready only once. {'This error is caused by ... ' * 20}\n{named}."
    shown = gist(said)
    assert shown.startswith("RuntimeError: Expected to mark a variable ready only once.") and shown.endswith(
        f"... ({named})"), shown
    assert gist("RuntimeError: a short one") == "RuntimeError: a short one"


# Point to point


def test_a_ring_where_every_rank_receives_first_is_named_as_its_cycle() -> None:
    ranks = [rank(r, inflight=[rec(1, "recv", "in_flight", peer=(r - 1) % 4, tag=0, where="ring.py:12")])
             for r in range(4)]
    cause = explain(ranks)
    assert cause.kind == "p2p-cycle"
    assert cause.headline == "0 waits for 3, 3 for 2, 2 for 1, 1 for 0: every rank receives first."
    assert lines(cause)[1] == "rank 1 (node2): recv from 0, tag 0, 4 floats at ring.py:12"
    assert cause.fix is not None and "send first" in cause.fix


def test_two_ranks_that_both_send_a_large_message_first_wait_for_each_other() -> None:
    big = {"numel": 1 << 24, "shape": [1 << 24]}
    ranks = [rank(0, inflight=[rec(1, "send", "in_flight", peer=1, tag=0, **big)]),
             rank(1, inflight=[rec(1, "send", "in_flight", peer=0, tag=0, **big)])]
    cause = explain(ranks)
    assert cause.kind == "p2p-cycle"
    assert cause.headline.startswith("0 waits for 1, 1 for 0: both send first")
    assert "16777216 floats" in lines(cause)[0]


def test_a_cycle_among_some_ranks_is_named_while_the_others_wait_in_a_collective() -> None:
    ranks = [rank(0, inflight=[rec(1, "recv", "in_flight", peer=1, tag=0)]),
             rank(1, inflight=[rec(1, "recv", "in_flight", peer=0, tag=0)]),
             *(rank(r, inflight=[rec(1, "barrier", "in_flight", numel=None, dtype=None)]) for r in (2, 3))]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == ("p2p-cycle", "0 waits for 1, 1 for 0: both receive first.")


def test_a_wait_on_irecv_waits_like_a_blocking_recv() -> None:
    ranks = [rank(r, inflight=[rec(1, "irecv", "waiting", peer=1 - r, tag=0, **{"async": True})]) for r in (0, 1)]
    cause = explain(ranks)
    assert cause.kind == "p2p-cycle"
    assert lines(cause)[0] == "rank 0 (node1): irecv from 1, tag 0, 4 floats, in wait() at train.py:10"


def test_a_receive_whose_send_is_posted_is_under_way_not_a_cycle() -> None:
    """Rank 1 posted its isend to 0 (not waited yet) and waits in recv from 0; rank 0 waits in recv
    from 1: that recv meets the isend, so rank 0 waits for nobody, and nothing is a deadlock."""
    ranks = [rank(0, inflight=[rec(1, "recv", "in_flight", peer=1, tag=0)]),
             rank(1, inflight=[rec(1, "isend", "in_flight", peer=0, tag=0, **{"async": True}),
                               rec(2, "recv", "in_flight", peer=0, tag=0)])]
    cause = explain(ranks)
    assert cause.kind == "unknown"
    assert "rank 0 is in recv from 1" in cause.headline and "rank 1 is in recv from 0" in cause.headline


def test_a_receive_from_any_source_waits_for_every_rank() -> None:
    ranks = [rank(0, inflight=[rec(1, "recv", "in_flight", peer=None, tag=0)]),
             rank(1, inflight=[rec(1, "recv", "in_flight", peer=0, tag=0)])]
    assert explain(ranks).headline == "0 waits for 1, 1 for 0: both receive first."
    # While a rank computes outside torch.distributed, it may still send: no deadlock, a wait.
    ranks.append(rank(2, records=loop(1)))
    cause = explain(ranks)
    assert cause.kind == "straggler"
    assert cause.headline.startswith("Ranks 0, 1 are waiting on rank 2, which is not in a torch.distributed call")


def wrong_peer(third: RankFacts) -> list[RankFacts]:
    """Pairs 0 -> 1 and 2 -> 3 meant, but rank 0 isends to 3 and waits; rank 1 waits to receive from 0."""
    return [rank(0, inflight=[rec(1, "isend", "waiting", peer=3, where="pairs.py:17", **{"async": True})],
                 stopped_at="pairs.py:20 in <module>: request.wait()"),
            rank(1, inflight=[rec(1, "irecv", "waiting", peer=0, where="pairs.py:19", **{"async": True})]),
            rank(2, records=[rec(1, "isend", peer=3, where="pairs.py:17", **{"async": True})],
                 inflight=[rec(1, "barrier", "in_flight", numel=None, dtype=None, where="pairs.py:21")]),
            third]


def test_a_wait_on_a_peer_that_sends_to_a_third_rank_is_named() -> None:
    ranks = wrong_peer(rank(3, records=[rec(1, "irecv", peer=2, **{"async": True})],
                            inflight=[rec(1, "barrier", "in_flight", numel=None, dtype=None, where="pairs.py:21")]))
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "p2p-unmatched", "Rank 1 receives from rank 0 at pairs.py:19, but rank 0 sends to rank 3 at pairs.py:17, "
                         "which is in barrier #1 at pairs.py:21.")
    # where it waits is the wait()'s line, from its stack; the call's own line is where it was posted
    assert lines(cause)[:2] == [
        "rank 0 (node1): isend to 3, 4 floats, in wait() (posted at pairs.py:17) at pairs.py:20",
        "rank 1 (node2): irecv from 0, 4 floats, in wait() at pairs.py:19"]


def test_a_third_rank_that_computes_may_still_receive() -> None:
    cause = explain(wrong_peer(rank(3, records=loop(0))))
    assert cause.kind == "missing-rank"  # (rank 2 waits in the barrier for them all), not a wrong peer
    assert "rank 3, which is not in a torch.distributed call" in cause.headline


def test_tags_that_do_not_match_are_named_when_both_ranks_are_blocked() -> None:
    ranks = [rank(0, inflight=[rec(1, "send", "in_flight", peer=1, tag=0, where="p2p.py:8")]),
             rank(1, inflight=[rec(1, "recv", "in_flight", peer=0, tag=1, where="p2p.py:11")])]
    cause = explain(ranks)
    assert cause.kind == "p2p-unmatched"
    assert cause.headline == "Rank 1 receives from rank 0 with tag 1, but rank 0 sends to it with tag 0 at p2p.py:8."
    assert cause.fix is not None and "same tag" in cause.fix


def test_a_sent_message_the_receiver_waits_for_with_another_tag_is_named() -> None:
    """Gloo buffers a small send: rank 0's send returned, and it went on to the final barrier,
    where the others wait too; rank 1 still waits for a tag that never comes."""
    sent = rec(1, "send", peer=1, tag=0, where="p2p.py:8")
    ranks = [rank(0, records=[sent], inflight=[rec(2, "barrier", "in_flight", numel=None, dtype=None)]),
             rank(1, inflight=[rec(1, "recv", "in_flight", peer=0, tag=1, where="p2p.py:11")]),
             *(rank(r, inflight=[rec(1, "barrier", "in_flight", numel=None, dtype=None)]) for r in (2, 3))]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "p2p-unmatched", "Rank 1 receives from rank 0 with tag 1, but rank 0 sends to it with tag 0 at p2p.py:8.")
    assert lines(cause)[0] == "rank 0 (node1): send to 1, tag 0, 4 floats at p2p.py:8"


def test_a_message_already_received_is_not_taken_for_the_missing_one() -> None:
    """Rank 0 sent tag 0 once and rank 1 received it; rank 1 now waits for tag 1, which rank 0 never
    sent: not a tag mismatch (its one send was matched), a rank missing from the barrier."""
    ranks = [rank(0, records=[rec(1, "send", peer=1, tag=0)],
                  inflight=[rec(2, "barrier", "in_flight", numel=None, dtype=None)]),
             rank(1, records=[rec(1, "recv", peer=0, tag=0)],
                  inflight=[rec(2, "recv", "in_flight", peer=0, tag=1, where="p2p.py:11")])]
    cause = explain(ranks)
    assert cause.kind == "missing-rank"
    assert cause.headline == ("Rank 0 waits in barrier #2 for rank 1, which is in recv from 0, tag 1, "
                              "4 floats at p2p.py:11.")


def test_sizes_that_do_not_match_are_named_also_when_gloo_turned_them_into_a_crash() -> None:
    ranks = [rank(0, records=[rec(1, "send", peer=1, tag=0, numel=8, shape=[8])], ended="exited", exit_code=0),
             rank(1, records=[rec(1, "recv", "raised", peer=0, tag=0, error=SIZE_CHECK)], ended="raised",
                  error=SIZE_CHECK, exit_code=1)]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "p2p-unmatched", "Rank 1 receives 4 floats from rank 0, but rank 0 sends 8 floats at train.py:10.")


def test_a_wait_that_ends_at_a_rank_that_exited() -> None:
    ranks = [rank(0, records=loop(2), ended="exited", exit_code=0),
             rank(1, inflight=[rec(1, "recv", "in_flight", peer=0, tag=0)]),
             rank(2, inflight=[rec(1, "recv", "in_flight", peer=1, tag=0)])]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "p2p-unmatched",
        "Rank 1 waits in recv from 0, tag 0, 4 floats at train.py:10, but rank 0 exited with status 0.")
    assert cause.fix is not None and "before either rank ends" in cause.fix


def test_a_chain_of_waits_is_named_rank_by_rank() -> None:
    ranks = [rank(0, records=loop(1), ended="raised", error=LOST),
             rank(1, inflight=[rec(1, "send", "in_flight", peer=2, tag=0, numel=1 << 24)]),
             rank(2, inflight=[rec(1, "recv", "in_flight", peer=0, tag=0)])]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "p2p-unmatched", f"Rank 1 waits for 2, 2 for 0, but rank 0 lost its connection: {LOST_SHOWN}.")
    assert set(lines(cause)[1:]) == {"rank 1 (node2): send to 2, tag 0, 16777216 floats at train.py:10",
                                     "rank 2 (node3): recv from 0, tag 0, 4 floats at train.py:10"}


def test_a_receive_from_a_rank_the_job_does_not_have() -> None:
    ranks = [rank(0, inflight=[rec(1, "recv", "in_flight", peer=7, tag=0)]), rank(1, records=loop(1))]
    cause = explain(ranks)
    assert cause.kind == "p2p-unmatched"
    assert cause.headline.endswith("but there is no rank 7: the job has ranks 0, 1.")


def test_a_receive_from_any_source_after_every_other_rank_ended() -> None:
    ranks = [rank(0, inflight=[rec(1, "recv", "in_flight", peer=None, tag=0)]),
             *(rank(r, records=loop(1), ended="exited", exit_code=0) for r in (1, 2))]
    cause = explain(ranks)
    assert cause.kind == "p2p-unmatched"
    assert cause.headline.endswith("but every other rank has ended.")


# Collectives


def test_a_broadcast_on_one_rank_against_all_reduce_on_the_others() -> None:
    ranks = [rank(r, records=loop(4), inflight=[rec(5, "broadcast" if r == 1 else "all_reduce", "in_flight",
                                                    root=0 if r == 1 else None, where="train.py:20")])
             for r in range(4)]
    cause = explain(ranks)
    assert cause.kind == "collective-mismatch"
    assert cause.headline == ("The ranks are in different collectives at the same call (#5): "
                              "ranks 0, 2, 3 in all_reduce, rank 1 in broadcast.")
    assert lines(cause)[1] == "rank 1 (node2): broadcast #5 from 0, 4 floats at train.py:20"
    assert cause.fix is not None and "same collectives in the same order" in cause.fix


@pytest.mark.parametrize(("field", "odd", "said"), [
    ("numel", 8, "The ranks pass different sizes to all_reduce #3: ranks 0, 1, 3 pass 4 floats, "
                 "rank 2 passes 8 floats."),
    ("dtype", "float64", "The ranks pass different dtypes to all_reduce #3: ranks 0, 1, 3 pass float32, "
                         "rank 2 passes float64."),
    ("reduce_op", "MAX", "The ranks pass different reduce ops to all_reduce #3: ranks 0, 1, 3 pass SUM, "
                         "rank 2 passes MAX."),
])
def test_the_same_collective_with_different_arguments(field: str, odd: object, said: str) -> None:
    ranks = [rank(r, records=loop(2), inflight=[rec(3, "all_reduce", "in_flight", **({field: odd} if r == 2 else {}))])
             for r in range(4)]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == ("collective-mismatch", said)


def test_a_mismatch_before_a_rank_s_own_failure_is_its_cause() -> None:
    """Rank 2 reduced with MAX where the others summed: gloo made a wrong sum on every rank, and
    rank 0's own check of it raised after. A failure that began after the mismatch follows from it;
    one that came first is the cause."""
    def ranks(failed_at: float) -> list[RankFacts]:
        return [rank(r, records=[*loop(2), rec(3, "all_reduce", reduce_op="MAX" if r == 2 else "SUM")],
                     **({"ended": "raised", "error": "AssertionError: 140 samples, expected 160", "exit_code": 1,
                         "failed_at": failed_at} if r == 0 else {})) for r in range(4)]
    after = explain(ranks(failed_at=1010.0))
    assert (after.kind, after.headline) == ("collective-mismatch", "The ranks pass different reduce ops to "
                                            "all_reduce #3: ranks 0, 1, 3 pass SUM, rank 2 passes MAX.")
    before = explain(ranks(failed_at=1002.0))  # (call #3 began at 1003)
    assert before.kind == "crash" and before.headline.startswith("Rank 0 (node1) failed first: it raised")


def test_ranks_that_disagree_on_a_broadcasts_source() -> None:
    ranks = [rank(r, inflight=[rec(1, "broadcast", "in_flight", root=1 if r == 1 else 0)]) for r in range(4)]
    cause = explain(ranks)
    assert cause.headline == ("The ranks disagree on the source of broadcast #1: ranks 0, 2, 3 say rank 0, "
                              "rank 1 says rank 1.")


def test_a_mismatch_gloo_turned_into_a_crash_is_still_the_cause() -> None:
    """Different dtypes: gloo's size check fails on one rank, the other loses its connection;
    neither failed for a reason of its own."""
    ranks = [rank(0, records=[rec(1, "all_reduce", "raised", dtype="float64", error=SIZE_CHECK)], ended="raised",
                  error=SIZE_CHECK, exit_code=1),
             rank(1, records=[rec(1, "all_reduce", "raised", error=LOST)], ended="raised", error=LOST, exit_code=1)]
    cause = explain(ranks)
    assert cause.kind == "collective-mismatch"
    assert "rank 0 passes float64" in cause.headline or "rank 0 pass float64" in cause.headline


def test_the_first_mismatch_of_a_group_is_named_not_its_consequences() -> None:
    ranks = [rank(0, records=[rec(1, "broadcast", root=0), rec(2, "all_reduce", t0=1010.0)]),
             rank(1, records=[rec(1, "all_reduce"), rec(2, "broadcast", root=0, t0=1010.0)])]
    assert "#1" in explain(ranks).headline


def test_a_group_methods_name_meets_the_functions_name() -> None:
    ranks = [rank(0, inflight=[rec(1, "ProcessGroup.allreduce", "in_flight")]),
             rank(1, inflight=[rec(1, "all_reduce", "in_flight")])]
    cause = explain(ranks)
    assert cause.kind == "unknown"
    assert "every rank of its group is in it, and their calls agree" in cause.headline


def test_sizes_may_differ_where_the_collective_allows_it() -> None:
    ranks = [rank(r, records=[rec(1, "all_to_all_single", numel=4 + r)], ended="exited", exit_code=0)
             for r in range(2)]
    assert explain(ranks).kind == "none"


def test_a_rank_missing_from_a_collective_in_another_call() -> None:
    ranks = [rank(r, records=loop(4), inflight=[rec(5, "all_reduce", "in_flight")]) for r in (0, 2, 3)]
    ranks.insert(1, rank(1, records=loop(4), inflight=[rec(5, "recv", "in_flight", peer=0, tag=0, where="ring.py:12")]))
    cause = explain(ranks)
    assert cause.kind == "missing-rank"
    assert cause.headline == ("Ranks 0, 2, 3 wait in all_reduce #5 for rank 1, which is in recv from 0, tag 0, "
                              "4 floats at ring.py:12.")
    assert lines(cause)[1] == "rank 1 (node2): recv from 0, tag 0, 4 floats at ring.py:12"


def test_a_rank_missing_from_a_collective_on_another_group() -> None:
    ranks = [rank(0, inflight=[rec(1, "all_reduce", "in_flight")]),
             rank(1, inflight=[rec(1, "all_reduce", "in_flight", group="g1,2#0")])]
    cause = explain(ranks)
    assert cause.kind == "missing-rank"
    assert cause.headline == ("Rank 0 waits in all_reduce #1 for rank 1, which is in all_reduce #1 on group [1, 2], "
                              "SUM, 4 floats at train.py:10.")


def test_a_subgroups_collective_waits_only_for_its_members() -> None:
    """Ranks 2 and 3 are no members of group [0, 1]: they compute and are not waited for; rank 1 is."""
    ranks = [rank(0, inflight=[rec(1, "all_reduce", "in_flight", group="g0,1#0")]),
             rank(1, records=loop(3), inflight=[rec(4, "barrier", "in_flight", numel=None, dtype=None)]),
             rank(2, records=loop(3)), rank(3, records=loop(3))]
    cause = explain(ranks)
    assert cause.kind == "missing-rank"
    assert cause.headline.startswith("Rank 0 waits in all_reduce #1 on group [0, 1] for rank 1, which is in barrier #4")


def test_a_barrier_one_rank_skips_and_then_exits() -> None:
    ranks = [rank(r, records=loop(3), inflight=[rec(4, "barrier", "in_flight", numel=None, dtype=None)],
                  counts={"world": {"all_reduce": 3}}) for r in (0, 1, 3)]
    ranks.insert(2, rank(2, records=loop(3), counts={"world": {"all_reduce": 3}}, ended="exited", exit_code=0))
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "uneven-counts", "Ranks 0, 1, 3 wait in their 1st barrier; rank 2 finished without calling barrier.")


def test_a_rank_with_an_extra_batch_waits_in_its_eleventh_all_reduce() -> None:
    done = {"world": {"all_reduce": 10}}
    ranks = [rank(r, records=loop(10), counts=done, ended="exited", exit_code=0) for r in range(3)]
    ranks.append(rank(3, records=loop(10), inflight=[rec(11, "all_reduce", "in_flight")], counts=done))
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == ("uneven-counts", "Rank 3 waits in its 11th all_reduce; ranks 0-2 finished "
                                                             "after 10.")
    assert cause.fix is not None and "join()" in cause.fix and "drop_last=True" in cause.fix


def test_the_extra_call_gloo_ended_in_a_lost_connection_is_still_uneven_counts() -> None:
    done = {"world": {"all_reduce": 10}}
    ranks = [rank(r, records=loop(10), counts=done, ended="exited", exit_code=0) for r in range(3)]
    ranks.append(rank(3, records=[*loop(10), rec(11, "all_reduce", "raised", error=LOST)], counts=done,
                      ended="raised", error=LOST, exit_code=1))
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == ("uneven-counts", "Rank 3 failed waiting in its 11th all_reduce; ranks 0-2 "
                                                             "finished after 10.")


def steps(*kinds: str, where: str = "train.py") -> list[list[Any]]:
    """A DDP program's steps as a rank records them: F (a forward), N (one under no_sync()), B (a backward)."""
    lines = {"F": 18, "N": 18, "B": 25}
    return [[n, "backward" if k == "B" else "forward", None if k == "B" else k == "F", f"{where}:{lines[k]}"]
            for n, k in enumerate(kinds, 1)]


def test_a_rank_that_skipped_a_backward_on_its_own_is_named_where_it_did() -> None:
    done, fewer = {"world": {"all_reduce": 6}}, {"world": {"all_reduce": 5}}
    ranks = [rank(r, records=loop(6), inflight=[rec(7, "all_reduce", "in_flight")], counts=done,
                  steps=steps(*"FBFBFBFBFBFBFB")) for r in (0, 2, 3)]
    ranks.insert(1, rank(1, records=loop(6), counts=fewer, ended="exited", exit_code=0, steps=steps(*"FBFBFBFFBFBFB")))
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == ("uneven-counts", (
        "Ranks 0, 2, 3 wait in their 7th all_reduce; rank 1 finished after 5; where their steps parted: rank 1 ran "
        "its 5th forward at train.py:18, ranks 0, 2, 3 ran a backward pass after their 4th forward at train.py:25."))
    assert cause.fix is not None and "all_reduce the flag" in cause.fix and "model.module" not in cause.fix


def test_a_forward_only_some_ranks_ran_elsewhere_is_named_and_its_fix_is_the_wrapped_module() -> None:
    """Rank 0's 5th forward was an evaluation (eval.py:14, no backward pass after it); where a rank skipped the
    backward pass of the forward every rank made (the test above), it is the decision of its own instead."""
    done = {"world": {"all_reduce": 6}}
    evaluated = steps(*"FBFBFBFBFFB")
    evaluated[8][3] = "eval.py:14"
    ranks = [rank(0, records=loop(6), inflight=[rec(7, "all_reduce", "in_flight")], counts=done, steps=evaluated)]
    ranks += [rank(r, records=loop(6), counts=done, ended="exited", exit_code=0, steps=steps(*"FBFBFBFBFBFB"))
              for r in (1, 2, 3)]
    cause = explain(ranks)
    assert cause.headline.endswith(
        "where their steps parted: rank 0 ran its 6th forward at train.py:18, ranks 1-3 ran a backward pass after "
        "their 5th forward at train.py:25; the 5th forward of rank 0 at eval.py:14 had no backward pass after it "
        "(the others' at train.py:18 had)."), cause.headline
    assert cause.fix is not None and "model.module(x)" in cause.fix and "buffers" in cause.fix


def test_ranks_that_sync_their_gradients_on_schedules_of_their_own_are_named_where_they_part() -> None:
    ranks = [rank(0, records=loop(1), counts={"world": {"all_reduce": 1}}, ended="exited", exit_code=0,
                  steps=steps(*"NBNBNBNBNBFB")),
             rank(1, records=loop(1), inflight=[rec(2, "all_reduce", "in_flight")], counts={"world": {"all_reduce": 1}},
                  steps=steps(*"NBNBNBFBNBNBNBFB"))]
    assert explain(ranks).headline.endswith(
        "where their steps parted: rank 0 ran its 4th forward under no_sync() at train.py:18, rank 1 ran its 4th "
        "forward (syncing the gradients) at train.py:18.")


@pytest.mark.parametrize("one, other", [
    (steps(*"FBFB"), steps(*"FBFBFB")),  # (one only made fewer steps: no decision of its own shows)
    (steps(*"FBFB"), None),  # (a rank that sent no steps: nothing is compared)
    (steps(*"FBFB")[2:], steps(*"FBFBFB")[3:]),  # (what both kept is alike)
    ([[1, "forward", True, "a.py:1"], "junk", [2, "sideways", None, "a.py:2"]], steps(*"FB")),
])
def test_ranks_whose_steps_do_not_part_get_no_such_clause(one: Any, other: Any) -> None:
    done = {"world": {"all_reduce": 2}}
    ranks = [rank(0, records=loop(2), counts=done, ended="exited", exit_code=0, steps=one),
             rank(1, records=loop(2), inflight=[rec(3, "all_reduce", "in_flight")], counts=done, steps=other)]
    cause = explain(ranks)
    assert cause.kind == "uneven-counts" and "parted" not in cause.headline and "join()" in (cause.fix or "")


def test_a_rank_killed_in_a_call_is_named_with_the_call_its_relay_told() -> None:
    died = rec(5, "recv", "in_flight", peer=0, where="ring.py:21")
    ranks = [rank(0, records=loop(4), inflight=[rec(5, "barrier", "raised", error=LOST)], ended="raised",
                  error=LOST, exit_code=1),
             rank(1, records=loop(4), ended="exited", exit_code=-9, died_in=died,
                  oom="Out of memory: Killed process 4242 (python3) total-vm:1000kB, anon-rss:900kB, file-rss:0kB")]
    cause = explain(ranks)
    assert cause.headline.startswith(
        'Rank 1 (node2) failed first: it was killed by SIGKILL in recv from 0 of 4 floats at ring.py:21 (the kernel: '
        '"Out of memory: Killed process 4242 (python3) total-vm:1000kB, anon-rss:900kB")'), cause.headline
    assert "OOM killer" in (cause.fix or "")


def test_a_rank_that_exits_early_without_counts_is_named_by_sequence_number() -> None:
    ranks = [rank(r, records=loop(3), inflight=[rec(4, "all_reduce", "in_flight")]) for r in (0, 1, 3)]
    ranks.insert(2, rank(2, records=loop(3), ended="exited", exit_code=0))
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "uneven-counts", "Ranks 0, 1, 3 wait in all_reduce #4; rank 2 exited with status 0 before calling it.")


def test_a_straggler_computing_outside_any_call_is_no_hang() -> None:
    ranks = [rank(r, records=loop(4), inflight=[rec(5, "all_reduce", "in_flight")]) for r in range(3)]
    ranks.append(rank(3, records=loop(4), stopped_at="train.py:40 in step: time.sleep(20)"))
    cause = explain(ranks)
    assert cause.kind == "straggler"
    assert cause.headline == ("Ranks 0-2 are waiting on rank 3, which is not in a torch.distributed call at "
                              "train.py:40 in step: time.sleep(20); not a hang while it computes.")
    assert lines(cause)[3] == ("rank 3 (node4): not in a torch.distributed call at train.py:40 in step: "
                               "time.sleep(20)")


def test_a_rank_the_recorder_never_saw_is_unseen_not_guessed() -> None:
    ranks = [rank(r, records=loop(4), inflight=[rec(5, "all_reduce", "in_flight")]) for r in range(3)]
    ranks.append(rank(3, records=None, inflight=None))
    cause = explain(ranks)
    assert cause.kind == "missing-rank"
    assert cause.headline == "Ranks 0-2 wait in all_reduce #5 for rank 3, which has sent no flight records."
    assert lines(cause)[3] == "rank 3 (node4): sent no flight records"


def test_a_barrier_one_rank_skips_on_its_way_to_the_next_collective() -> None:
    before = [rec(1, "all_reduce"), rec(2, "barrier", where="train.py:14")]
    ranks = [rank(r, records=before, inflight=[rec(3, "all_reduce", "in_flight") if r == 2 else
                                               rec(3, "barrier", "in_flight", where="train.py:14")])
             for r in range(4)]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "missing-rank", "Rank 2 skipped barrier #3 at train.py:14, where ranks 0, 1, 3 wait for it: it went on to "
                        "the next all_reduce at train.py:10.")
    assert cause.fix is not None and "a branch on something only this rank knows" in cause.fix


def test_a_rank_gloo_aborts_for_its_size_is_named_by_the_others_sizes_and_its_abort() -> None:
    abort = ("gloo::EnforceNotMet: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
             "op.preamble.length <= op.nbytes. 512 vs 500. Received data size doesn't match expected size.")
    ranks = [rank(r, records=[rec(1, "all_reduce"), rec(2, "all_reduce", "raised", numel=1024, error=LOST)],
                  ended="raised", error=LOST, exit_code=1, failed_at=2000.0) for r in range(3)]
    ranks.append(rank(3, records=None, ended="exited", exit_code=-6, error=abort, failed_at=1999.0))
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "collective-mismatch", "The ranks pass different sizes to all_reduce #2: ranks 0-2 pass 1024 floats; gloo "
        "aborted rank 3 (node4), whose size differs: Received data size doesn't match expected size (512 vs 500 "
        "bytes).")
    assert lines(cause)[0] == "rank 0 (node1): all_reduce #2, SUM, 1024 floats at train.py:10"


def test_a_collective_the_others_never_made_there_is_a_mismatch_not_a_skip() -> None:
    ranks = [rank(r, records=loop(2), inflight=[rec(3, "broadcast" if r == 2 else "barrier", "in_flight",
                                                    where="train.py:12" if r == 2 else "train.py:14", root=0)])
             for r in range(4)]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "collective-mismatch",
        "The ranks are in different collectives at the same call (#3): ranks 0, 1, 3 in barrier, rank 2 in broadcast.")


def test_many_missing_ranks_are_counted_in_the_headline_and_each_in_the_evidence() -> None:
    ranks = [rank(0, inflight=[rec(1, "all_reduce", "in_flight")]),
             *(rank(r, inflight=[rec(1, "recv", "in_flight", peer=0, tag=r)]) for r in range(1, 6))]
    cause = explain(ranks)
    assert cause.kind == "missing-rank" and len(cause.evidence) == 6
    assert cause.headline.startswith("Rank 0 waits in all_reduce #1 for rank 1, which is in recv from 0, tag 1")
    assert cause.headline.endswith(", and 2 more (below).")
    assert lines(cause)[5] == "rank 5 (node6): recv from 0, tag 5, 4 floats at train.py:10"


def test_a_rank_missing_from_a_collective_after_losing_its_connection() -> None:
    ranks = [rank(0, inflight=[rec(2, "all_reduce", "in_flight")], records=loop(1)),
             rank(1, records=[*loop(1), rec(2, "recv", "raised", peer=2, error=LOST)], ended="raised", error=LOST)]
    cause = explain(ranks)
    assert cause.kind == "missing-rank"
    assert cause.headline == f"Rank 0 waits in all_reduce #2 for rank 1, which lost its connection: {LOST_SHOWN} at " \
                             "train.py:10."


def test_a_receive_from_a_rank_that_computes_is_a_wait() -> None:
    ranks = [rank(0, records=loop(1), stopped_at="train.py:7 in step"),
             rank(1, inflight=[rec(1, "recv", "in_flight", peer=0, tag=0)]),
             rank(2, inflight=[rec(1, "recv", "in_flight", peer=1, tag=0)])]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "straggler", "Ranks 1, 2 are waiting on rank 0, which is not in a torch.distributed call at train.py:7 in "
                     "step; not a hang while it computes.")


def test_a_wait_on_isend_against_a_blocking_send_is_a_cycle_of_sends() -> None:
    ranks = [rank(0, inflight=[rec(1, "isend", "waiting", peer=1, tag=0, **{"async": True})]),
             rank(1, inflight=[rec(1, "send", "in_flight", peer=0, tag=0)])]
    cause = explain(ranks)
    assert cause.kind == "p2p-cycle" and cause.headline.startswith("0 waits for 1, 1 for 0: both send first")


def test_a_cycle_of_many_ranks_is_named_by_its_ends() -> None:
    n = 512
    ranks = [rank(r, inflight=[rec(1, "recv", "in_flight", peer=(r - 1) % n, tag=0)]) for r in range(n)]
    cause = explain(ranks)
    assert cause.headline == ("0 waits for 511, 511 for 510, 510 for 509, ... (507 more), 2 for 1, 1 for 0: "
                              "every rank receives first.")
    assert len(cause.evidence) == n


def test_ranks_doing_the_same_are_said_once() -> None:
    ranks = [rank(r, inflight=[rec(1, "all_reduce", "in_flight")]) for r in range(3)]
    cause = explain(ranks)
    assert cause.headline == ("No cause found in the records: ranks 0-2 are in all_reduce #1, SUM, 4 floats at "
                              "train.py:10 (every rank of its group is in it, and their calls agree).")


# Crashes


def traceback(*frames: tuple[str, int]) -> str:
    body = "".join(f'  File "{path}", line {n}, in f\n    x\n' for path, n in frames)
    return f"Traceback (most recent call last):\n{body}ValueError: loss is nan at step 5\n"


def test_the_rank_that_failed_first_for_its_own_reason_is_the_cause() -> None:
    own = traceback(("/tmp/run/lab/rank/script.py", 30), ("<frozen runpy>", 88), ("/work/train.py", 30),
                    ("/usr/lib/python3.11/json/decoder.py", 337))
    ranks = [rank(r, records=[*loop(5), rec(6, "all_reduce", "raised", error=LOST)], ended="raised", error=LOST,
                  exit_code=1) for r in (0, 2, 3)]
    ranks.insert(1, rank(1, records=loop(5), ended="raised", error="ValueError: loss is nan at step 5",
                         traceback=own, exit_code=1, failed_at=1006.0))
    cause = explain(ranks)
    assert cause.kind == "crash"
    assert cause.headline == ("Rank 1 (node2) failed first: it raised ValueError: loss is nan at step 5 at "
                              "train.py:30; ranks 0, 2, 3 lost their connection to rank 1 in all_reduce #6.")
    assert lines(cause)[1] == "rank 1 (node2): raised ValueError: loss is nan at step 5 at train.py:30"
    assert lines(cause)[0] == f"rank 0 (node1): all_reduce #6, SUM, 4 floats: lost its connection: {LOST_SHOWN} at " \
                              "train.py:10"


def test_a_crash_names_the_ranks_still_waiting_and_other_failures() -> None:
    ranks = [rank(0, inflight=[rec(1, "all_reduce", "in_flight")]),
             rank(1, ended="raised", error="KeyError: 'w'", failed_at=20.0),
             rank(2, ended="raised", error="ValueError: late", failed_at=30.0)]
    cause = explain(ranks)
    assert cause.headline == ("Rank 1 (node2) failed first: it raised KeyError: 'w'; rank 0 still waits in "
                              "all_reduce; rank 2 also failed.")


# An all_to_all_single's splits (input_split_sizes against the peers' output_split_sizes)


def exchanging(splits: dict[int, tuple[list[int], list[int]]], group: str = "world") -> list[RankFacts]:
    """Ranks in all_to_all_single #2 on ``group`` at moe.py:25 with these (input, output) splits each."""
    return [rank(r, records=[rec(1, "init_process_group")], inflight=[rec(
        2, "all_to_all_single", "in_flight", group=group, where="moe.py:25", in_splits=ins, out_splits=outs)])
        for r, (ins, outs) in splits.items()]


def test_splits_that_do_not_meet_are_said_pair_by_pair_with_each_ranks_splits() -> None:
    cause = explain(exchanging({0: ([2, 3], [2, 2]), 1: ([2, 2], [2, 2])}))
    assert (cause.kind, cause.headline) == ("collective-mismatch", (
        "The ranks' splits of all_to_all_single #2 at moe.py:25 do not meet: rank 0 sends rank 1 3 rows "
        "(input_split_sizes[1]), which expects 2 from it (output_split_sizes[0])."))
    assert lines(cause) == [
        "rank 0 (node1): all_to_all_single #2, 4 floats, input_split_sizes [2, 3], output_split_sizes [2, 2] "
        "at moe.py:25",
        "rank 1 (node2): all_to_all_single #2, 4 floats, input_split_sizes [2, 2], output_split_sizes [2, 2] "
        "at moe.py:25"]
    assert cause.fix is not None and "exchange the counts first" in cause.fix
    unrecorded = rank(2, records=[rec(1, "init_process_group")], inflight=[rec(2, "all_to_all_single", "in_flight")])
    some = explain(exchanging({0: ([2, 3, 1], [2, 2, 1]), 1: ([1, 2, 1], [2, 2, 1])}) + [unrecorded])
    assert "do not meet (2 of the 4 pairs whose splits were recorded): " in some.headline


def test_uneven_splits_that_meet_are_no_mismatch_and_a_groups_places_are_its_ranks() -> None:
    met = explain(exchanging({0: ([1, 5], [1, 2]), 1: ([2, 0], [5, 0])}))
    assert met.kind != "collective-mismatch" and "do not meet" not in met.headline
    idle = [rank(r, records=[rec(1, "init_process_group")]) for r in (0, 2)]
    crossed = explain(idle + exchanging({1: ([1, 4], [1, 2]), 3: ([3, 0], [4, 0])}, group="g1,3#0"))
    assert crossed.headline == (
        "The ranks' splits of all_to_all_single #2 on group [1, 3] at moe.py:25 do not meet: rank 3 sends rank 1 "
        "3 rows (input_split_sizes[0]), which expects 2 from it (output_split_sizes[1])."), crossed.headline


# The lists of a tensor a peer (all_gather's tensor_list, gather's gather_list, scatter's scatter_list)


def gathering(op: str, sizes: dict[int, tuple[int, list[int] | None, list[int] | None]],
              root: int | None = None) -> list[RankFacts]:
    """Ranks in ``op`` #2 at eval.py:25, each with (its tensor's elements, its list to the peers, its list
    from them)."""
    return [rank(r, records=[rec(1, "init_process_group")], inflight=[rec(
        2, op, "in_flight", where="eval.py:25", numel=n, shape=[n], root=root, in_splits=ins, out_splits=outs)])
        for r, (n, ins, outs) in sizes.items()]


def test_an_all_gather_whose_lists_are_made_like_the_ranks_own_tensor_is_said_pair_by_pair() -> None:
    cause = explain(gathering("all_gather", {r: (30 + r % 2, None, [30 + r % 2] * 4) for r in range(4)}))
    assert (cause.kind, cause.headline) == ("collective-mismatch", (
        "The ranks' sizes of all_gather #2 at eval.py:25 do not meet (8 of the 16 pairs): rank 0 sends rank 1 30 "
        "floats (tensor), which expects 31 floats from it (tensor_list[0]); rank 0 sends rank 3 30 floats (tensor), "
        "which expects 31 floats from it (tensor_list[0]); rank 1 sends rank 0 31 floats (tensor), which expects 30 "
        "floats from it (tensor_list[1]); and 5 more."))
    assert lines(cause)[1] == ("rank 1 (node2): all_gather #2, 31 floats, tensor_list sizes [31, 31, 31, 31] at "
                               "eval.py:25")
    assert cause.fix is not None and "all_gather the counts first" in cause.fix


def test_uneven_gathers_that_meet_are_no_mismatch_and_the_others_crash_is_the_cause() -> None:
    met = gathering("all_gather", {r: (30 + r % 2, None, [30, 31, 30, 31]) for r in range(3)})
    crashed = [*met, rank(3, records=[rec(1, "init_process_group"), rec(2, "all_gather", where="eval.py:25",
                                                                            numel=31, out_splits=[30, 31, 30, 31])],
                              ended="raised", error="KeyError: 'w'", exit_code=1, failed_at=2000.0)]
    cause = explain(crashed)
    assert cause.headline == "Rank 3 (node4) failed first: it raised KeyError: 'w'; ranks 0-2 still wait in all_gather."


def test_an_uneven_gather_that_meets_but_gloo_refuses_says_gloo_gathers_equal_sizes_only() -> None:
    refused = "RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 1 (expected (30), got (31))"

    def ranks(lists: list[int] | None) -> list[RankFacts]:
        return [rank(r, records=[rec(1, "init_process_group"), rec(2, "all_gather", "raised", where="eval.py:25",
                                                                    numel=30 + r % 2, out_splits=lists, error=refused)],
                     ended="raised", error=refused, exit_code=1, failed_at=2000.0) for r in range(4)]

    cause = explain(ranks([30, 31, 30, 31]))
    assert cause.headline == (
        "The ranks' sizes of all_gather #2 at eval.py:25 differ (30 floats to 31 floats) and meet, each rank's "
        "tensor_list sized as its peers pass, but gloo gathers equal sizes only: it refused the call on ranks 0-3 "
        "(ProcessGroupGloo::allgather: invalid tensor size).")
    assert cause.fix is not None and "pad every rank's tensor to the largest" in cause.fix
    assert "and meet" not in explain(ranks(None)).headline  # (no lists recorded: whether they meet is not known)


def test_a_gather_and_a_scatter_are_held_to_their_roots_lists() -> None:
    gather = explain(gathering("gather", {0: (4, None, [4, 4, 4]), 1: (4, None, None), 2: (5, None, None)}, root=0))
    assert gather.headline.startswith(
        "The ranks' sizes of gather #2 to 0 at eval.py:25 do not meet: rank 2 sends rank 0 5 floats (tensor), which "
        "expects 4 floats from it (gather_list[2])")
    scatter = explain(gathering("scatter", {0: (4, [4, 6, 4], None), 1: (4, None, None), 2: (4, None, None)}, root=0))
    assert scatter.headline.startswith(
        "The ranks' sizes of scatter #2 from 0 at eval.py:25 do not meet: rank 0 sends rank 1 6 floats "
        "(scatter_list[1]), which expects 4 floats from it (tensor)")


def test_a_rank_gloo_aborted_in_a_gather_is_held_to_the_lists_of_the_ranks_that_lost_it() -> None:
    abort = ("gloo::EnforceNotMet: [enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:456] "
             "op.preamble.length <= op.nbytes. 62 vs 60. Received data size doesn't match expected size.")
    lost = [rank(r, records=[rec(1, "init_process_group"), rec(11, "all_gather", "raised", where="eval.py:25",
                                                               numel=31, out_splits=[31] * 4, error=LOST)],
                 ended="raised", error=LOST, exit_code=1, failed_at=2000.0) for r in (1, 3)]
    died = [rank(r, records=None, ended="exited", exit_code=-6, error=abort, failed_at=1999.0 + r / 10,
                 died_in=rec(2, "all_gather", "in_flight", where="eval.py:25", numel=30)) for r in (0, 2)]
    cause = explain([died[0], lost[0], died[1], lost[1]])
    assert cause.headline.startswith(
        "The ranks' sizes of all_gather #11 at eval.py:25 do not meet (4 of the 8 pairs whose sizes were recorded): "
        "rank 0 sends rank 1 30 floats (tensor), which expects 31 floats from it (tensor_list[0]);")
    assert cause.headline.endswith("; gloo aborted ranks 0, 2 on them: Received data size doesn't match expected "
                                   "size (62 vs 60 bytes).")
    # (a rank's relay numbers only the collectives the program called: its line says none)
    assert lines(cause)[0] == "rank 0 (node1): all_gather, 30 floats at eval.py:25"


# A file one rank loads that another saves (torch.load, torch.save: lab.rank.files)

MISSED = "FileNotFoundError: [Errno 2] No such file or directory: 'ckpt-0.pt'"


def loaded_too_soon(saver_host: str = "node2", saved_at: float = 100.4,
                    path: str = "/run/ckpt-0.pt") -> list[RankFacts]:
    """Rank 0 (on rank 1's host, node2) saves ckpt-0.pt at train.py:30 (at ``saved_at``); rank 1 looked for it at
    train.py:31 at 100.0."""
    return [read(0, saver_host, inflight=[rec(6, "all_reduce", "in_flight")], files=[
                ["saved", "/run/old.pt", "train.py:30", 90.0], ["saved", path, "train.py:30", saved_at]]),
            rank(1, records=loop(5), ended="raised", error=MISSED, exit_code=1, failed_at=100.0,
                 files=[["missing", "/run/ckpt-0.pt", "train.py:31", 100.0]])]


def test_a_file_a_rank_did_not_find_is_named_with_the_save_of_the_rank_that_writes_it_and_when() -> None:
    cause = explain(loaded_too_soon())
    assert cause.headline == (
        "Rank 1 (node2) failed first: it raised " + MISSED + "; rank 0 saved ckpt-0.pt at train.py:30, 0.4 s after "
        "rank 1 looked for it at train.py:31; rank 0 still waits in all_reduce.")
    assert cause.fix is not None and "dist.barrier() on every rank" in cause.fix
    assert "1.2 s before" in explain(loaded_too_soon(saved_at=98.8)).headline


def test_a_file_saved_on_another_host_is_said_with_both_hosts_and_no_time_between_their_clocks() -> None:
    headline = explain(loaded_too_soon(saver_host="node9")).headline
    assert "rank 0 saved ckpt-0.pt on node9 at train.py:30; rank 1 looked for it on node2 at train.py:31" in headline
    assert " s after" not in headline


@pytest.mark.parametrize("change", ["another path saved", "another error", "the error names another file"])
def test_no_save_is_named_where_the_records_do_not_tie_it_to_the_failure(change: str) -> None:
    ranks = loaded_too_soon(path="/run/ckpt-1.pt" if change == "another path saved" else "/run/ckpt-0.pt")
    if change != "another path saved":
        error = "ValueError: ckpt-0.pt is bad" if change == "another error" else MISSED.replace("ckpt-0", "data")
        ranks[1] = rank(1, records=loop(5), ended="raised", error=error, exit_code=1, failed_at=100.0,
                        files=[["missing", "/run/ckpt-0.pt", "train.py:31", 100.0]])
    cause = explain(ranks)
    assert cause.kind == "crash" and "saved" not in cause.headline and "barrier" not in (cause.fix or "")


def test_malformed_files_are_skipped_and_said() -> None:
    ranks = loaded_too_soon()
    ranks[1] = rank(1, records=loop(5), ended="raised", error=MISSED, exit_code=1, failed_at=100.0, files=[
        ["missing", "/run/ckpt-0.pt", "train.py:31", 100.0], ["missing", "ckpt-0.pt", "relative.py:1", 1.0],
        ["opened", "/run/x", "a.py:1", 1.0], ["missing", "/run/\x1b[2J", "a.py:1", 1.0], "junk"])
    cause = explain(ranks)
    assert "rank 0 saved ckpt-0.pt at train.py:30" in cause.headline
    assert "rank 1: 4 malformed files skipped" in cause.notes


READY_TWICE = ("RuntimeError: Expected to mark a variable ready only once. This error is caused by one of the "
               "following reasons: 1) Use of a module parameter outside the `forward` function. ...\nParameter at "
               "index 1 with name inner.0.bias has been marked as ready twice. This means that multiple autograd "
               "engine  hooks have fired for this particular parameter during this iteration.")


@pytest.mark.parametrize("error, fix", [
    (READY_TWICE, "DDP got the gradient of inner.0.bias twice in one backward pass"),
    ("RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.",
     "pass find_unused_parameters=True"),
    ("RuntimeError: [3]: params[2] in this process with sizes [3, 64] appears not to match sizes of the same param "
     "in process 0.", "what every rank knows"),
    ("RuntimeError: Expected to mark a variable ready only once.", None),  # (no parameter named: no template's)
    ("ValueError: marked as ready twice", None),
])
def test_ddps_own_errors_get_the_fix_their_message_fits_and_no_other(error: str, fix: str | None) -> None:
    cause = explain([rank(0, records=loop(3), ended="raised", error=error, exit_code=1, failed_at=10.0),
                     rank(1, records=[*loop(3), rec(4, "all_reduce", "raised", error=LOST)], ended="raised",
                          error=LOST, exit_code=1)])
    assert cause.kind == "crash"
    if fix is None:
        assert cause.fix is None, cause.fix
    else:
        assert cause.fix is not None and fix in cause.fix, cause.fix
        phrases = ("twice in one backward pass", "pass find_unused_parameters=True", "what every rank knows")
        assert [p for p in phrases if p in cause.fix] == [p for p in phrases if p in fix]


def test_failures_are_ordered_by_time_then_by_arrival() -> None:
    ranks = [rank(0, ended="raised", error="ValueError: a", arrival=1),
             rank(1, ended="raised", error="ValueError: b", arrival=0),
             rank(2, ended="raised", error="ValueError: c")]
    assert explain(ranks).headline.startswith("Rank 1 (node2) failed first")
    ranks.append(rank(3, ended="raised", error="ValueError: d", failed_at=5.0))
    assert explain(ranks).headline.startswith("Rank 3 (node4) failed first")
    # A failure inside a call is dated by its record.
    bad_root = rec(1, "broadcast", "raised", root=9, error="ValueError: bad root", t0=1.0, t1=1.5)
    ranks.append(rank(4, records=[bad_root], ended="raised", error="ValueError: bad root"))
    assert explain(ranks).headline.startswith("Rank 4 (node5) failed first: it raised ValueError: bad root at "
                                              "train.py:10")


def test_a_rank_killed_by_a_signal_or_exiting_with_a_status_is_a_failure_of_its_own() -> None:
    ranks = [rank(0, records=[rec(1, "all_reduce", "raised", error=LOST)], ended="exited", exit_code=1),
             rank(1, records=loop(0), ended="exited", exit_code=-9)]
    cause = explain(ranks)
    assert cause.headline == ("Rank 1 (node2) failed first: it was killed by SIGKILL; rank 0 lost its connection to "
                              "rank 1 in all_reduce #1.")
    ranks[1] = rank(1, ended="exited", exit_code=3)
    assert "it exited with status 3" in explain(ranks).headline
    ranks[1] = rank(1, ended="exited", exit_code=137)
    assert "it was killed by SIGKILL (exit status 137)" in explain(ranks).headline


def test_a_timeout_is_a_consequence() -> None:
    ranks = [rank(0, ended="raised", error="RuntimeError: [gloo] Timed out waiting 30000ms for recv operation"),
             rank(1, ended="raised", error="ZeroDivisionError: division by zero", failed_at=50.0)]
    assert explain(ranks).headline.startswith("Rank 1 (node2) failed first")


def test_lost_connections_and_nothing_else_are_said_as_known() -> None:
    ranks = [rank(r, records=[rec(1, "all_reduce", "raised", error=LOST)], ended="raised", error=LOST)
             for r in range(2)]
    cause = explain(ranks)
    assert cause.kind == "unknown"
    assert cause.headline.startswith("No cause found in the records: ranks 0, 1 lost their connection: RuntimeError")


# The rendezvous


def test_ranks_that_never_joined_are_named_with_their_host() -> None:
    ranks = [rank(r, records=[], inflight=[rec(1, "all_reduce", "in_flight")]) for r in range(2)]
    ranks += [rank(r, records=None, inflight=None, stage="rendezvous") for r in (2, 3)]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "rendezvous", "Ranks 2, 3 on node3, node4 never joined the process group: still in init_process_group; "
                      "ranks 0, 1 wait for them.")
    assert cause.fix is not None and "node3, node4" in cause.fix and "lab doctor" in cause.fix


def test_a_rank_that_never_started() -> None:
    ranks = [rank(0, records=None, inflight=None, stage="rendezvous"), rank(1, records=None, inflight=None,
                                                                           stage="starting")]
    cause = explain(ranks)
    assert cause.headline == "Rank 0 waits in init_process_group for rank 1 on node2, which has not started."
    assert lines(cause) == ["rank 0 (node1): still in init_process_group", "rank 1 (node2): not started"]


def joining(r: int) -> RankFacts:
    """A rank in init_process_group, as the recorder sees it (the world's first collective, in flight)."""
    return rank(r, inflight=[rec(1, "init_process_group", "in_flight", numel=None, dtype=None, where="train.py:15")])


def test_ranks_in_the_rendezvous_wait_for_a_rank_that_exited_before_it() -> None:
    ranks = [joining(0), joining(1), rank(2, records=[], ended="exited", exit_code=0, exit_call="train.py:14")]
    cause = explain(ranks)
    assert (cause.kind, cause.headline) == (
        "rendezvous", "Ranks 0, 1 wait in init_process_group for rank 2 on node3, which exited with status 0 at "
                      "train.py:14.")
    assert cause.fix is not None and "also one with nothing to do" in cause.fix
    assert lines(cause)[0] == "rank 0 (node1): still in init_process_group at train.py:15"


def test_a_rank_that_computes_before_the_rendezvous_is_waited_for() -> None:
    ranks = [joining(0), joining(1), rank(2, records=[], stopped_at="train.py:13 in <module>: time.sleep(600)")]
    cause = explain(ranks)
    assert (cause.kind, cause.headline, cause.fix) == (
        "rendezvous", "Ranks 0, 1 wait in init_process_group for rank 2 on node3, which is not in a "
                      "torch.distributed call at train.py:13 in <module>: time.sleep(600).", None)


def test_no_rank_past_the_rendezvous() -> None:
    ranks = [rank(r, records=None, inflight=None, stage="rendezvous") for r in range(3)]
    cause = explain(ranks)
    assert cause.headline == "No rank got past the rendezvous: ranks 0-2 are still in init_process_group."
    assert cause.fix is not None and "MASTER_ADDR:MASTER_PORT" in cause.fix


# Healthy: no cause


def test_every_rank_finished() -> None:
    ranks = [rank(r, records=loop(10), counts={"world": {"all_reduce": 10}}, ended="exited", exit_code=0)
             for r in range(4)]
    cause = explain(ranks)
    assert (cause.kind, cause.fix, cause.notes) == ("none", None, ())
    assert cause.headline == "Every rank finished; none is left in a torch.distributed call."
    assert lines(cause)[0] == "rank 0 (node1): exited with status 0"


def test_ranks_that_compute_wait_for_nobody() -> None:
    ranks = [rank(r, records=loop(3)) for r in range(2)]
    assert explain(ranks).headline == "No rank is waiting in a torch.distributed call."


def test_no_ranks() -> None:
    assert (explain([]).kind, explain([]).headline) == ("unknown", "No rank to explain.")


# Untrusted records


def test_every_malformed_field_skips_its_record() -> None:
    good = rec(1, "all_reduce")
    bad = [("seq", 0), ("seq", True), ("seq", "1"), ("group", ""), ("group", 3), ("op", None), ("state", "gone"),
           ("state", ["done"]), ("t0", float("nan")), ("t0", "now"), ("numel", -1), ("numel", 2.5), ("peer", -3),
           ("root", "0"), ("tag", 1 << 70), ("dtype", 32), ("where", ["a"]), ("shape", [2, -1]), ("shape", "4"),
           ("shape", [1] * 100), ("async", "yes"), ("t1", float("inf")), ("error", {"a": 1})]
    for name, value in bad:
        assert read_record({**good, name: value}) == name, (name, value)
    assert read_record("all_reduce") == "not an object"
    assert read_record({**good, "extra": object()}) != "extra"  # unknown fields are left alone


def test_malformed_records_are_skipped_and_said() -> None:
    junk: list[Any] = [None, 7, "x", [], {"seq": -1}, {**rec(2, "recv"), "peer": -1}, {**rec(3, "x"), "numel": "4"}]
    ranks = [rank(0, records=junk + loop(1), ended="exited", exit_code=0),
             rank(1, records=loop(1), counts={"world": {"all_reduce": "no"}}, ended="exited", exit_code=0),
             rank(-1), rank(1)]
    cause = explain(ranks)
    assert cause.kind == "none"
    assert cause.notes == (
        "rank 0: 7 malformed flight records skipped (4 not an object, 1 with a bad numel, 1 with a bad peer, "
        "1 with a bad seq)",
        "rank 1: malformed or too many call counts skipped",
        "rank -1: a negative rank: skipped", "rank 1: given twice: skipped")


def test_a_huge_list_is_read_up_to_its_newest_records() -> None:
    ranks = [rank(0, records=[rec(1, "all_reduce")] * 200_000 + loop(3), ended="exited", exit_code=0)]
    cause = explain(ranks)
    assert cause.kind == "none"
    assert cause.notes == (f"rank 0: {200_003} flight records: the oldest {200_003 - RECORDS_MAX} skipped",)


def test_hostile_text_is_shown_escaped_and_cut() -> None:
    evil = "ValueError: \x1b[2J\x1b[32mPASS\r" + "x" * 10_000
    ranks = [rank(0, ended="raised", error=evil), rank(1, records=[rec(1, "recv", "in_flight", peer=0,
                                                                       where="\u202eevil.py:1\n")])]
    cause = explain(ranks)
    assert "\x1b" not in cause.headline and "\\x1b[2J" in cause.headline and len(cause.headline) < 400
    assert "\u202e" not in "".join(lines(cause)) and "\n" not in "".join(lines(cause))


def test_a_group_whose_id_names_no_ranks_has_the_ranks_seen_calling_on_it() -> None:
    """Rank 2 never called on the group: it is not waited for (nor is a number of thousands of digits
    in a group's id read as a rank)."""
    for group in ("g" + "9" * 4000 + "#0", "my-group"):
        ranks = [rank(0, records=[rec(1, "all_reduce", group=group)],
                      inflight=[rec(2, "all_reduce", "in_flight", group=group)]),
                 rank(1, records=[rec(1, "all_reduce", group=group)]), rank(2, records=loop(1))]
        cause = explain(ranks)
        assert cause.kind == "straggler"
        assert cause.headline.startswith("Rank 0 is waiting on rank 1, which is not in a torch.distributed call")


def test_malformed_counts_are_skipped() -> None:
    counts = {"world": {"all_reduce": -1, "broadcast": "2", 3: 1, "barrier": 2}, "g": "x", 5: {}}
    ranks = [rank(0, records=loop(1), counts=counts, ended="exited", exit_code=0)]
    assert explain(ranks).notes == ("rank 0: malformed or too many call counts skipped",)


@pytest.mark.parametrize("seed", range(20))
def test_random_junk_never_raises(seed: int) -> None:
    chance = random.Random(seed)
    values: list[Any] = [None, True, -1, 0, 1, 2, 1 << 80, 1.5, float("nan"), "", "world", "send", "recv",
                         "all_reduce", "done", "in_flight", "waiting", "raised", [], [1], {}, {"a": 1}]
    keys = ["seq", "group", "op", "numel", "shape", "dtype", "peer", "root", "tag", "reduce_op", "async", "where",
            "state", "error", "t0", "t1"]

    def junk_record() -> Any:
        if chance.random() < 0.1:
            return chance.choice(values)
        record = rec(chance.randint(1, 4), chance.choice(["send", "recv", "all_reduce", "broadcast", "isend"]),
                     chance.choice(["done", "in_flight", "waiting", "raised"]), peer=chance.randint(0, 4),
                     tag=chance.randint(0, 2))
        for key in chance.sample(keys, chance.randint(0, 3)):
            record[key] = chance.choice(values)
        return record

    facts = [read(r, f"n{r}", records=[junk_record() for _ in range(chance.randint(0, 12))],
                  inflight=[junk_record() for _ in range(chance.randint(0, 3))],
                  counts=chance.choice([None, {"world": {"all_reduce": chance.choice(values)}}, {3: [1]}]),
                  ended=chance.choice(["running", "exited", "raised"]), exit_code=chance.choice([None, 0, 1, -9, 137]),
                  error=chance.choice([None, "ValueError: x", LOST, SIZE_CHECK]),
                  stage=chance.choice(["starting", "rendezvous", "joined"]),
                  failed_at=chance.choice([None, 1.0, float("nan")]), arrival=chance.choice([None, 0, 1]))
             for r in range(chance.randint(1, 5))]
    cause = explain(facts)
    assert cause.headline.endswith(".") and len(cause.evidence) == len(facts)
    json.dumps(cause.to_json())


# The data


def test_the_cause_as_json() -> None:
    ranks = [rank(r, inflight=[rec(1, "recv", "in_flight", peer=1 - r, tag=0)]) for r in (0, 1)]
    data = json.loads(json.dumps(explain(ranks).to_json()))
    assert data == {"kind": "p2p-cycle", "headline": "0 waits for 1, 1 for 0: both receive first.",
                    "evidence": [{"rank": 0, "host": "node1", "call": "recv from 1, tag 0, 4 floats",
                                  "where": "train.py:10"},
                                 {"rank": 1, "host": "node2", "call": "recv from 0, tag 0, 4 floats",
                                  "where": "train.py:10"}],
                    "fix": data["fix"], "notes": []}
    assert data["fix"].startswith("Let one side send first")


def test_a_large_subgroup_is_named_short() -> None:
    group = "g" + ",".join(map(str, range(200))) + "#0"
    ranks = [rank(r, inflight=[rec(1, "all_reduce", "in_flight", group=group)]) for r in range(200)]
    assert explain(ranks).headline.startswith("No cause found in the records: ranks 0-199 are in all_reduce #1 on "
                                              "group [0-199], SUM")


def test_words() -> None:
    assert [ranks_named(r) for r in ([3], [0, 2, 3], [0, 1, 2], [0, 1, 2, 5], [1, 2])] == [
        "rank 3", "ranks 0, 2, 3", "ranks 0-2", "ranks 0-2, 5", "ranks 1, 2"]
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]
