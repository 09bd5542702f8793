"""The preflight: before any rank starts, each host's launcher checks the network the job will use,
and a failure stops the run with the doctor's cause (lab.rank.preflight, lab.core.preflight).

The controller's half on synthetic reports; the hosts' half for real: real sockets, the lab's
launchers (the zygote, torchrun, mp.spawn) on local hosts. The cross-VPC lab's unpeered and
peered runs are in test_cross_vpc.py."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from lab.core.planner import build_launch_plan
from lab.core.preflight import Preflight
from lab.errors import ExitCode
from lab.inventory.model import Host, Inventory
from lab.netcheck.rules import SAME_NETWORK_FIX
from lab.rank import ports, probe
from lab.rank.events import Probe, Pulse, parse_event
from lab.rank.netfacts import Target
from lab.rank.preflight import PULSE_EVERY
from lab.rank.probe import Listener, check_link, survey
from lab.rank.worker import TOKEN_VAR

from .conftest import REPO, Lab
from .test_doctor import facts, link, local_hosts

ADDRESSES = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.1.3"}
PORT = 40000


def three_hosts() -> Preflight:
    inventory = Inventory("inv.yaml", tuple(Host(name, address) for name, address in ADDRESSES.items()))
    plan = build_launch_plan(inventory, "/tmp/job.py", [], 60.0)
    return Preflight(plan, (PORT,))


def facts_event(name: str, master_port: int | None = PORT) -> Probe:
    """What ``name``'s launcher reports: rank 0's host (a) listens on ``master_port`` too."""
    reported = replace(facts(ADDRESSES[name], hostname=name), master_port=master_port if name == "a" else None)
    return Probe("facts", asdict(reported))


def healthy_links(check: Preflight) -> None:
    for name, address in ADDRESSES.items():
        assert check.lines() == {}
        check.take(name, links_event(link("master", "a", "10.0.0.1", seen=address),
                                     *(link("mesh", p, a, seen=address) for p, a in ADDRESSES.items() if p != name)))


def links_event(*links: object) -> Probe:
    return Probe("links", {"links": [asdict(each) for each in links]})  # type: ignore[call-overload]


# -- the controller's half ----------------------------------------------------------------------


def reported_facts(check: Preflight) -> dict[str, bytes]:
    for name in ADDRESSES:
        check.take(name, facts_event(name))
    return check.lines()


def test_targets_go_out_once_every_host_reported_its_facts_and_only_once() -> None:
    check = three_hosts()
    check.take("a", facts_event("a"))
    check.take("b", facts_event("b"))
    assert check.lines() == {}
    check.take("c", facts_event("c"))
    lines = check.lines()
    assert set(lines) == {"a", "b", "c"}
    targets = json.loads(lines["c"])["targets"]
    assert {(t["kind"], t["peer"], t["address"], t["port"]) for t in targets} == {
        ("master", "a", "10.0.0.1", PORT), ("mesh", "a", "10.0.0.1", 40000), ("mesh", "b", "10.0.0.2", 40000)}
    assert check.lines() == {}  # said once; no links yet


def test_a_network_that_passes_lets_rank_0s_host_go_first_then_the_others_once_it_closed() -> None:
    check = three_hosts()
    reported_facts(check)
    healthy_links(check)
    assert check.lines() == {"a": b"go\n"}
    check.take("b", Probe("closed", {}))  # (not rank 0's host: no matter)
    assert check.lines() == {} and not check.decided
    check.take("a", Probe("closed", {}))  # it no longer listens on MASTER_PORT, where the others' ranks go
    assert check.lines() == {"b": b"go\n", "c": b"go\n"}
    assert check.decided and check.cause is None and check.lines() == {}


def test_all_go_at_once_when_rank_0s_host_did_not_listen_on_the_master_port() -> None:
    check = three_hosts()
    for name in ADDRESSES:
        check.take(name, facts_event(name, master_port=None))  # (file:// has no store port)
    check.lines()
    healthy_links(check)
    assert check.lines() == {"a": b"go\n", "b": b"go\n", "c": b"go\n"} and check.decided


def test_hosts_that_reach_the_store_but_not_each_other_are_stopped_with_the_doctors_cause() -> None:
    check = three_hosts()
    reported_facts(check)
    vpc = {"a": "x", "b": "x", "c": "y"}
    for name, address in ADDRESSES.items():
        seen = "10.99.0.3" if name == "c" else address  # c reaches the store through NAT
        check.take(name, links_event(link("master", "a", "10.0.0.1", seen=seen),
                                     *(link("mesh", p, a, seen=address) if vpc[p] == vpc[name]
                                       else link("mesh", p, a, failure="timeout")
                                       for p, a in ADDRESSES.items() if p != name)))
    assert check.lines() == {}  # no host is told to go
    cause = check.cause
    assert check.decided and cause is not None and cause.kind == "network"
    assert cause.headline.startswith("The preflight stopped the run before any rank started: the store "
                                     "(MASTER_ADDR) is reachable but ranks advertise")
    lines = [e.line() for e in cause.evidence]
    assert "c cannot reach a at 10.0.0.1:40000, the address gloo advertises there (no answer within 5s)" in lines
    assert any(line.startswith("a, b cannot reach c at 10.0.1.3") for line in lines)
    assert "c is seen as 10.99.0.3 but believes it is 10.0.1.3: behind NAT (10.99.0.3 by a)" in lines
    assert cause.fix == SAME_NETWORK_FIX and cause.notes[-1].endswith("--no-preflight skips it")


def test_unreadable_facts_count_as_reported_and_stop_the_run_naming_the_host() -> None:
    check = three_hosts()
    check.take("a", facts_event("a"))
    check.take("b", Probe("facts", {"hostname": "b"}))
    check.take("c", facts_event("c"))
    assert set(check.lines()) == {"a", "c"}  # b has nothing to connect from, nor a listener to reach
    for name in ("a", "c"):
        check.take(name, links_event())
    assert check.lines() == {}
    assert check.cause is not None and "its launcher's preflight facts are unreadable" in check.cause.headline


# -- the hosts' half: real sockets ----------------------------------------------------------


def test_rank_0s_host_listens_on_the_master_port_the_run_holds() -> None:
    held = ports.hold(1)
    port = held[0].getsockname()[1]
    try:
        found, listeners = survey("a", "token", 2.0, "127.0.0.1", port, lookups=False)
        try:
            assert (found["master_port"], found["master_port_error"]) == (port, None)
            with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:  # it answers there
                conn.sendall(b'{"token": "token", "from": "b"}\n')
                assert json.loads(conn.makefile().readline())["name"] == "a"
        finally:
            for listener in listeners:
                listener.close(1.0)
    finally:
        for sock in held:
            sock.close()


def test_a_closed_listener_leaves_no_thread_behind() -> None:
    before = threading.active_count()
    listener = Listener("a", "token", 0, 2.0)
    with socket.create_connection(("127.0.0.1", listener.port), timeout=2) as conn:
        conn.sendall(b'{"token": "token", "from": "b"}\n')
        conn.makefile().readline()
    listener.close(1.0)
    assert threading.active_count() == before  # (a launcher forks its ranks right after)


# -- end to end, on local hosts ---------------------------------------------------------------

CHECK_ENV = """import os, threading
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()}: setting {os.environ.get('LAB_PREFLIGHT')!r}")
dist.destroy_process_group()
"""


@pytest.mark.local
@pytest.mark.parametrize("launcher", ["lab", "torchrun", "spawn"])
def test_a_host_without_its_interface_stops_the_job_before_any_rank_starts(
        lab: Lab, tmp_path: Path, launcher: str) -> None:
    local_hosts(tmp_path, "    a: {}\n    b: {network_interface: nosuch0}\n")
    script = tmp_path / "job.py"
    script.write_text(CHECK_ENV)
    result = lab("launch", "--hosts", str(tmp_path / "inventory.yaml"), "--launcher", launcher, "--json", str(script))
    assert result.code == ExitCode.NETWORK, result.text[-3000:]
    report = json.loads(result.out)
    assert report["status"] == "preflight" and report["cause"]["kind"] == "network"
    assert "there is no interface nosuch0 on b" in report["cause"]["headline"]
    assert report["cause"]["fix"].startswith("set network_interface of b in the inventory")
    assert "setting" not in result.err  # no rank ran
    assert lab.leftovers() == []


@pytest.mark.local
@pytest.mark.parametrize("launcher", ["lab", "torchrun", "spawn"])
def test_a_job_that_passes_the_preflight_runs_and_its_ranks_see_nothing_of_it(
        lab: Lab, tmp_path: Path, launcher: str) -> None:
    local_hosts(tmp_path, "    a: {}\n    b: {slots: 2}\n")
    script = tmp_path / "job.py"
    script.write_text(CHECK_ENV)
    result = lab("launch", "--hosts", str(tmp_path / "inventory.yaml"), "--launcher", launcher, str(script))
    assert result.code == ExitCode.OK, result.text[-3000:]
    assert sorted(line.split("] ", 1)[-1] for line in result.out.splitlines() if "setting" in line) == [
        f"rank {r}: setting None" for r in range(3)]
    assert lab.leftovers() == []


@pytest.mark.local
def test_no_preflight_starts_the_ranks_whatever_the_network(lab: Lab, tmp_path: Path) -> None:
    local_hosts(tmp_path, "    a: {}\n    b: {network_interface: nosuch0}\n")
    script = tmp_path / "job.py"
    script.write_text(CHECK_ENV)
    result = lab("launch", "--hosts", str(tmp_path / "inventory.yaml"), "--no-preflight", "--json", str(script))
    report = json.loads(result.out)
    assert result.code != ExitCode.NETWORK and report["status"] != "preflight"
    assert "nosuch0" in result.err  # gloo itself failed on b, as it does without the lab
    assert lab.leftovers() == []


def test_peers_too_busy_to_answer_are_a_warning_that_says_so_never_a_stop() -> None:
    check = three_hosts()
    reported_facts(check)
    for name, address in ADDRESSES.items():
        # every connection to c was made, but c's launcher did not answer the handshake in time
        check.take(name, links_event(link("master", "a", "10.0.0.1", seen=address),
                                     *(link("mesh", p, a, failure="slow") if p == "c" else
                                       link("mesh", p, a, seen=address) for p, a in ADDRESSES.items() if p != name)))
    assert check.lines() == {"a": b"go\n"} and check.cause is None
    busy = [f for f in check.findings() if f.check == "busy"]
    assert [(f.severity, f.subject) for f in busy] == [("warning", "a -> c"), ("warning", "b -> c")]
    assert busy[0].message == "10.0.1.3:40000 took the connection (connected, but no reply within 5s: the host is busy)"


# -- the hosts' half: judged by what the network says ------------------------------------------


def test_refused_is_said_at_once_and_unanswered_syns_only_after_the_window_with_their_count() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # bound, not listening: a connection to it is refused (a reset)
        refused = check_link(Target("mesh", "b", "127.0.0.1", port), "a", "token", 2.5)
    assert (refused.ok, refused.failure, refused.error) == (False, "refused", "connection refused")
    # A listener whose queue is full: Linux drops the SYNs it cannot queue, as a firewall that drops
    # them would (nothing answers, nothing refuses).
    with socket.create_server(("127.0.0.1", 0), backlog=0) as full, \
            socket.create_connection(full.getsockname(), timeout=2):  # (the one its queue holds)
        unanswered = check_link(Target("mesh", "b", *full.getsockname()), "a", "token", 2.0)
    assert (unanswered.ok, unanswered.failure) == (False, "timeout")
    syns = int(re.fullmatch(r"no answer to (\d+) connection attempts \(SYN\) in 2\.\ds", unanswered.error or "")[1])
    assert syns >= 3  # the attempts started within the window, and the kernel's retries of the first


def test_a_peer_that_took_the_connection_and_does_not_answer_is_slow_not_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe, "REPLY_WAIT", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the kernel does), never answers
        link_ = check_link(Target("mesh", "b", *silent.getsockname()), "a", "token", 0.5)
    assert (link_.ok, link_.reached, link_.failure) == (False, True, "slow")
    assert link_.error == "connected, but no reply within 0.5s: the host is busy"


HOGGED_LAUNCHER = """
import json, os, sys
from lab.rank import preflight
os.environ[preflight.PREFLIGHT_VAR] = json.dumps({"name": "b", "master_addr": "127.0.0.1", "master_port": None})
checking = preflight.begin()
print("hogging", flush=True)
hog = 7 ** 4_000_000  # one C call that holds the interpreter for seconds, as loading libtorch does
checking.end()
print("ranks started", flush=True)
"""


def test_the_launchers_listener_answers_while_the_launcher_holds_its_interpreter(tmp_path: Path) -> None:
    token = "t0ken"
    launcher = subprocess.Popen([sys.executable, "-c", HOGGED_LAUNCHER], cwd=REPO, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO), TOKEN_VAR: token})
    pulses: list[float] = []

    def next_line() -> str:
        """The launcher's next line that is not its helper's pulse (those are kept)."""
        assert launcher.stdout is not None
        while True:
            line = launcher.stdout.readline().decode().rstrip("\n")
            event = parse_event(line, token)
            if not isinstance(event, Pulse):
                return line
            pulses.append(event.cpu)

    try:
        assert launcher.stdin is not None
        first = [next_line() for _ in range(2)]  # (in either order)
        assert "hogging" in first
        facts_ = parse_event(next(line for line in first if line != "hogging"), token)
        assert isinstance(facts_, Probe) and facts_.kind == "facts"
        answered = check_link(Target("mesh", "b", "127.0.0.1", int(facts_.fields["port"])), "a", token, 2.5)
        assert answered.ok and answered.answered_by == "b", answered  # while the launcher is held, not after
        assert launcher.poll() is None  # (still hogging: the answer came from its helper)
        launcher.stdin.write(b'{"targets": []}\n')
        launcher.stdin.flush()
        links = parse_event(next_line(), token)
        assert isinstance(links, Probe) and links.kind == "links"
        time.sleep(1.5 * PULSE_EVERY)  # (the verdict late, as a busy controller's: the helper pulses meanwhile,
        # whether the hog is still on or over; on a quiet machine it may be over before any verdict)
        launcher.stdin.write(b"go\n")
        launcher.stdin.flush()
        assert next_line() == "ranks started"
        assert launcher.wait(timeout=60) == 0
    finally:
        launcher.kill()
        launcher.wait()
    # the helper said, each second the launcher waited (its hog, the verdict), how much CPU it had used: more each time
    assert len(pulses) >= 1 and pulses == sorted(pulses) and pulses[-1] > 0, pulses


def test_a_launcher_whose_controller_goes_away_in_the_preflight_starts_no_rank() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", HOGGED_LAUNCHER.replace("7 ** 4_000_000", "0")], cwd=REPO,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(REPO), TOKEN_VAR: "t"})
    out, _ = launcher.communicate(b"", timeout=60)  # (end-of-file at once: no targets, no verdict)
    assert launcher.returncode == 1 and b"ranks started" not in out
