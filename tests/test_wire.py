"""What a host's connections carried, measured outside the ranks (lab.rank.wire), and the grade's
check of it against the ranks' records (lab.suite.method.check_carried).

The measure runs for real: the kernel's socket diagnostics in a network namespace of the test's own
(``unshare -n``: root), real TCP connections on its loopback, some closed before it ever sampled them,
one of another user's. The whole path (a sandboxed grade, the share users on the container lab) is in
tests/test_grade.py and tests/test_lab_docker.py (walter, who hides an all_reduce from the recorder).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab.rank.zygote import Measure
from lab.suite.check import Carried, Verdict, World
from lab.suite.exercises import ring_cases
from lab.suite.method import Method, check_carried, nonblocking, point_to_point, read_summaries, uses
from lab.suite.registry import EXERCISES

REPO = Path(__file__).resolve().parent.parent

# In a network namespace of its own: the measure started with a connection already open (none of the
# ranks': it never counts), then one connection that stays open, one opened, used and closed before
# any sample (its last count comes from the kernel's destroy message), and one of another user's, closed
# as its process exits after a sample saw it (the "uid" mode leaves it out; "netns" counts it, its last
# count waited for: the kernel sends destroy messages from a work queue). Prints what each mode measured.
# (A byte counts once its peer acknowledged it: the last byte on an open connection may not be yet.)
MEASURED = r"""
import json, os, socket, sys
from lab.rank.wire import Wire

def pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return client, server

def carry(sender, receiver, size):
    sender.sendall(b"x" * size)
    got = 0
    while got < size:
        got += len(receiver.recv(1 << 16))

os.system("ip link set lo up")
before = pair()
carry(*before, 7000)
wires = {mode: Wire.start(mode) for mode in ("netns", "uid")}
carry(*before, 1000)
kept = pair()
carry(*kept, 100000)
carry(kept[1], kept[0], 5000)
for wire in wires.values():
    wire.poll(force=True)
carry(*kept, 20000)
carry(kept[1], kept[0], 1)  # (its segment acknowledges the 20000, which a delayed ACK would still hold)
gone = pair()
carry(*gone, 30000)
gone[0].close(); gone[1].close()
carried, polled = os.pipe(), os.pipe()
child = os.fork()
if child == 0:
    os.setgid(65534); os.setuid(65534)
    other = pair()
    carry(*other, 50000)
    os.write(carried[1], b"1")
    os.read(polled[0], 1)  # (its sockets close as it exits, after a sample saw them)
    os._exit(0)
os.read(carried[0], 1)
for wire in wires.values():
    wire.poll(force=True)
os.write(polled[1], b"1")
os.waitpid(child, 0)
print(json.dumps({mode: [wire.carried(), wire.lost] for mode, wire in wires.items()}))
"""


# A rank that exits right after its last send, its peer busy elsewhere (the peer's window full: it reads
# a second later): the connection is closing, most of the bytes still in the sender's kernel, as the
# launcher takes its last count. Prints what each mode measured and what was sent.
DRAINED = r"""
import json, os, socket, time
from lab.rank.wire import Wire

SENT = 3_000_000
os.system("ip link set lo up")
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
listener.bind(("127.0.0.1", 0))
listener.listen()
wires = {mode: Wire.start(mode) for mode in ("netns", "uid")}
reader = os.fork()
if reader == 0:
    conn, _ = listener.accept()
    time.sleep(1)
    while conn.recv(1 << 16):
        pass
    os._exit(0)
sent, sampled = os.pipe(), os.pipe()
sender = os.fork()
if sender == 0:
    out = socket.create_connection(listener.getsockname())
    out.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    out.sendall(b"x" * SENT)
    os.write(sent[1], b"1")
    os.read(sampled[0], 1)  # (it exits after a sample saw its connection, as a rank's lives that long)
    os._exit(0)
os.read(sent[0], 1)
for wire in wires.values():
    wire.poll(force=True)
os.write(sampled[1], b"1")
os.waitpid(sender, 0)
print(json.dumps({"sent": SENT, **{mode: wire.carried() for mode, wire in wires.items()}}))
os.waitpid(reader, 0)
"""


def carried(exercise: str, method: Method | None, calls: dict[int, Any], world: World) -> Verdict:
    """The wire check on summaries as they come (JSON data), read as an exercise's judge reads them."""
    return check_carried(exercise, method, read_summaries(calls), world)


def _in_a_network_namespace(code: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        reason = "a network namespace of the test's own needs root and unshare (util-linux)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the measure cannot be tested: {reason}")
        pytest.skip(reason)
    return subprocess.run(["unshare", "-n", sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_every_byte_is_counted_once_at_its_sender_closed_connections_and_other_users_as_the_mode_says() -> None:
    done = _in_a_network_namespace(MEASURED)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    sampled = 100000 + 5000 + 20000  # (not the 7000 + 1000 of the connection open before the measure began)
    # each connection's SYN and FIN count a byte each in bytes_acked: a few bytes over, never under.
    # "uid" cannot tell whose the connection closed between two samples was: it falls short, never over
    assert sampled <= measured["uid"][0] <= sampled + 1 + 8, measured
    assert sampled + 30000 + 50000 <= measured["netns"][0] <= sampled + 1 + 30000 + 50000 + 12, measured
    assert measured["uid"][1] == measured["netns"][1] == 0


def test_the_last_bytes_of_a_connection_closed_while_its_peer_had_not_read_them_count() -> None:
    """The sender exited with most of its bytes unacknowledged: the last count waits for them (an
    honest rank's last send on a busy machine, which the measure once left out: a records-claim-more
    fail for an honest student)."""
    done = _in_a_network_namespace(DRAINED)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    for mode in ("netns", "uid"):  # (the sender's SYN and FIN count a byte each, the reader's FIN one: one user)
        assert measured["sent"] <= measured[mode] <= measured["sent"] + 3, measured

def test_a_launcher_asked_for_a_measure_it_cannot_take_or_keep_says_why() -> None:
    assert Measure.begin(None).asked is False and Measure.begin("").fds == []
    bogus = Measure.begin("everything")
    assert bogus.asked and bogus.fds == []
    assert bogus.end() == {"carried": 0, "lost": 0, "error": "no such mode of measure: 'everything'"}
    # one that stops measuring while the ranks run says so: what it had counted is no measure
    broken = Measure.begin("uid")
    assert broken.wire is not None and broken.fds == [broken.wire.fileno()]
    broken.wire.close()
    broken.look(closed=True)
    assert broken.fds == [] and broken.end() == {"carried": 0, "lost": 0, "failed": "the kernel's socket diagnostics "
                                                 "failed: Bad file descriptor"}


# -- the check ----------------------------------------------------------------------------------


def ring_calls(sent: int, messages: int, barriers: int = 0) -> dict[str, object]:
    counts = {"isend": messages, "recv": messages, **({"barrier": barriers} if barriers else {})}
    return {"counts": counts, "sent": {"1": sent}, "messages": messages}


def world(carried: dict[str, Carried] | None, hosts: tuple[str, ...] = ("sandbox",) * 3) -> World:
    return World(3, "gloo", hosts, (0, 1, 2), carried=carried)


def test_the_records_account_for_what_was_carried_headers_and_the_labs_own_traffic_included() -> None:
    # a reference ring of 3 ranks, as measured: 17.0 MB recorded in 864 messages, 17.12 MB carried
    calls = {r: ring_calls(5_664_320, 288) for r in range(3)}
    verdict = carried("ring-allreduce", point_to_point(), calls, world({"sandbox": Carried(17_124_620)}))
    assert verdict.passed, verdict
    assert verdict.notes == ("the connections carried 17.1 MB; the ranks' records account for 17.0 MB in 864 "
                             "message(s)",)


def test_more_carried_than_recorded_fails_every_rank_and_says_how_much_went_unseen() -> None:
    calls = {r: ring_calls(528, 96) for r in range(3)}
    verdict = carried("ring-allreduce", point_to_point(), calls, world({"sandbox": Carried(13_878_848)}))
    assert not verdict.passed
    assert verdict.reason == ("the ranks' connections carried 13.9 MB but their records account for 1.6 KB: 13.9 MB "
                              "went by calls the call recorder did not see (measured outside the ranks, by each "
                              "host's launcher)")
    assert verdict.mismatches[0].what == "bytes the connections carried" and verdict.mismatches[0].got == "13.9 MB"
    # each host's measure adds up: two hosts carried it between them
    split = world({"a": Carried(6_000_000), "b": Carried(7_878_848)}, ("a", "b", "b"))
    verdict = carried("p2p", nonblocking(), calls, split)
    assert "carried 13.9 MB" in verdict.reason
    assert [(m.what, m.expected, m.got) for m in verdict.mismatches[1:]] == [
        ("bytes a's connections carried (rank 0)", "its records' 528 bytes, and headers", "6.0 MB"),
        ("bytes b's connections carried (ranks 1, 2)", "its records' 1.1 KB, and headers", "7.9 MB")]
    # the launchers of ranks that share a network namespace (a sandbox's) count its sockets once between them,
    # the most any of them saw; the others' hosts add theirs
    shared = world({h: Carried(n, space="boot/net:[1]") for h, n in (("r0", 13_878_848), ("r1", 13_000_000))}
                   | {"r2": Carried(1_000_000)}, ("r0", "r1", "r2"))
    verdict = carried("p2p", nonblocking(), calls, shared)
    assert "carried 14.9 MB" in verdict.reason
    assert [(m.what, m.got) for m in verdict.mismatches[1:]] == [
        ("bytes r0, r1's connections carried (ranks 0, 1)", "13.9 MB"), ("bytes r2's connections carried (rank 2)",
                                                                         "1.0 MB")]
    # a program that makes groups is allowed their members' connecting anew (20 groups of 3, as measured)
    made = {r: {"counts": {}, "sent": {}, "messages": 0, "groups": 20} for r in range(3)}
    assert carried("p2p", point_to_point(), made, world({"sandbox": Carried(76_516)})).passed
    assert not carried("p2p", point_to_point(), {r: {**c, "groups": 0} for r, c in made.items()},
                             world({"sandbox": Carried(76_516)})).passed
    # barriers are allowed their small messages to every rank
    calls = {r: ring_calls(0, 0, barriers=20) for r in range(3)}
    assert carried("p2p", point_to_point(), calls, world({"sandbox": Carried(100_000)})).passed


def test_records_that_claim_more_than_was_carried_fail_as_no_evidence() -> None:
    # a hidden all_reduce, its counters padded to look like a ring's: the records say more than went over the wire
    calls = {r: ring_calls(14_000_000, 288) for r in range(3)}
    verdict = carried("ring-allreduce", point_to_point(), calls, world({"sandbox": Carried(13_878_848)}))
    assert not verdict.passed
    assert verdict.reason.startswith("the ranks' records say they sent 42.0 MB but their connections carried 13.9 MB: "
                                     "records that claim more than went over the wire are no evidence of the method")
    # across hosts, each host's count stands beside its ranks' records: where the records outran the wire
    across = world({"node1": Carried(5_700_000), "node2": Carried(5_700_000), "node3": Carried(0)},
                   ("node1", "node2", "node3"))
    verdict = carried("ring-allreduce", point_to_point(), {r: ring_calls(5_664_320, 288) for r in range(3)}, across)
    assert not verdict.passed
    assert [(m.what, m.expected, m.got) for m in verdict.mismatches[1:]] == [
        (f"bytes {host}'s connections carried (rank {r})", "its records' 5.7 MB, and headers", got)
        for r, (host, got) in enumerate((("node1", "5.7 MB"), ("node2", "5.7 MB"), ("node3", "0 bytes")))]
    # an honest run's records never do: every byte they count went, and its headers with it
    calls = {r: ring_calls(5_664_320, 288) for r in range(3)}
    assert carried("ring-allreduce", point_to_point(), calls, world({"sandbox": Carried(17_124_620)})).passed


def test_the_ring_carries_at_least_what_its_functions_must_move_and_at_most_what_they_may() -> None:
    method, tensors = EXERCISES["ring-allreduce"].method, ring_cases.TENSOR_BYTES
    assert method is not None and tensors == 1_699_296
    honest = {r: ring_calls(5_664_320, 288) for r in range(3)}  # the tutorial's 2 tensors and the chunked 2 * 2/3
    assert carried("ring-allreduce", method, honest, world({"sandbox": Carried(17_124_620)})).passed
    # the sums looked up from inputs sent (in 2 bytes a value) before any graded function ran, a token round
    # the ring in each: every byte recorded, and far fewer than an all-reduce of the tensors must move
    early = {r: ring_calls(2 * 2 * ring_cases.DRAWN + 96 * 8, 96 + 2) for r in range(3)}
    verdict = carried("ring-allreduce", method, early, world({"sandbox": Carried(3 * 2 * 2 * ring_cases.DRAWN
                                                                                          + 60_000)}))
    assert not verdict.passed
    assert verdict.reason.startswith("the ranks' connections carried 1.8 MB, less than ring-allreduce's functions must "
                                     "move to compute their results (2(n-1) = 4 times the 1,699,296 bytes of each "
                                     "function's tensors on a rank, for each of the 2 functions: 13.6 MB)")
    assert (verdict.mismatches[0].expected, verdict.mismatches[0].got) == ("at least 13.6 MB", "1.8 MB")
    # whole tensors to every rank in both functions, and every byte recorded: more than they may move
    every = {r: ring_calls(2 * 2 * tensors, 2 * 2 * 96) for r in range(3)}
    verdict = carried("ring-allreduce", method, every, world({"sandbox": Carried(3 * 2 * 2 * tensors + 150_000)}))
    assert not verdict.passed
    assert verdict.reason.startswith("the ranks' connections carried 20.5 MB, more than ring-allreduce's functions may "
                                     "move (allreduce(): whole tensors to each of the n-1 others, n(n-1) = 6 times")
    assert "what a rank sends outside them counts too" in verdict.reason
    # with 2 ranks an exchange is the whole of both rings: exactly the least, and it passes
    pair = {r: ring_calls(2 * tensors, 2 * 96) for r in range(2)}
    two = World(2, "gloo", ("sandbox",) * 2, (0, 1), carried={"sandbox": Carried(2 * 2 * tensors + 40_000)})
    assert carried("ring-allreduce", method, pair, two).passed


def test_a_host_that_said_nothing_lost_count_or_stopped_measuring_fails_one_that_could_not_begin_is_a_note() -> None:
    calls = {r: ring_calls(1000, 10) for r in range(3)}
    hosts = ("a", "b", "b")
    silent = carried("p2p", point_to_point(), calls, world({"a": Carried(3000)}, hosts))
    assert not silent.passed and silent.reason.startswith("the launcher of b ended before it said what the "
                                                          "connections carried")
    unable = carried("p2p", point_to_point(), calls, world({"a": Carried(3000), "b": Carried(0, 0, "no")}, hosts))
    assert unable.passed and unable.notes == ("the connections were not measured (b: no)",)
    stopped = world({"a": Carried(3000), "b": Carried(0, 0, failed="x")}, hosts)
    broke = carried("p2p", point_to_point(), calls, stopped)
    assert not broke.passed and broke.reason == ("the measure of the connections failed while the ranks ran on b (x): "
                                                 "p2p's method is not shown")
    lost = carried("p2p", point_to_point(), calls, world({"a": Carried(3000, 2), "b": Carried(1000)}, hosts))
    assert not lost.passed and lost.reason == ("the launcher of a lost count of the connections the ranks closed (more "
                                               "at once than the kernel could report): p2p's method is not shown")
    # nothing measured, or a method whose collectives no record counts in bytes: no check
    assert carried("p2p", point_to_point(), calls, world(None)) == carried(
        "all-reduce", uses("all_reduce"), calls, world({"sandbox": Carried(10 ** 9)}))
    assert carried("all-reduce", uses("all_reduce"), calls, world({"sandbox": Carried(10 ** 9)})).passed
