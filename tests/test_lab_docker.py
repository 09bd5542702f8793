"""The container lab for real: a real engine, real containers on a real network, real sshd
reached by paramiko, real torch.distributed across the containers.

Under CI=true these run (the engine is installed and started when missing); elsewhere
they skip with the reason when no engine can be had.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from lab import cluster, engine

from .conftest import REPO, WRONG, Lab
from .tutorials import assert_prints_as_shown, tutorial_scripts

pytestmark = pytest.mark.docker
TOPOLOGY = cluster.Topology()
INVENTORY = REPO / "inventory.yaml"


def _client():
    try:
        if os.environ.get("CI") == "true":
            return engine.ensure_engine(lambda message: print(f"lab: {message}"))
        return engine.client()
    except engine.EngineError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no Docker engine: {exc}")


@pytest.fixture(scope="module")
def lab_up() -> Iterator[Lab]:
    client = _client()
    lab = Lab()
    result = lab("up", timeout=1500)
    assert result.code == 0, result.text[-4000:]
    assert "PASS" in result.out and "p2p" in result.out  # the smoke check ran across the hosts
    yield lab
    result = lab("down", timeout=300)
    assert result.code == 0, result.text
    assert cluster.lab_containers(client) == []
    assert client.networks.list(filters={"label": cluster.LABEL}) == []
    assert client.volumes.list(filters={"label": cluster.LABEL}) == []


def workers_on(container: str) -> list[str]:
    """Rank processes still alive in a host container."""
    done = subprocess.run(["docker", "exec", container, "pgrep", "-af", "lab[.](worker|launcher|node|rank_output)"],
                          capture_output=True, text=True, timeout=30)
    return done.stdout.split("\n") if done.stdout.strip() else []


def assert_no_workers_anywhere() -> None:
    left = {c: workers_on(c) for c in (TOPOLOGY.container(i) for i in TOPOLOGY.indices())}
    assert {c: w for c, w in left.items() if w} == {}


def inventory_variant(tmp_path: Path, hosts: int, slots: int, **extra: str) -> Path:
    """The lab's inventory cut to ``hosts`` hosts with ``slots`` each, paths made absolute."""
    data = yaml.safe_load(INVENTORY.read_text())
    v = data["all"]["vars"]
    v["ansible_ssh_private_key_file"] = str(REPO / v["ansible_ssh_private_key_file"])
    v["ssh_known_hosts_file"] = str(REPO / v["ssh_known_hosts_file"])
    v["slots"] = slots
    v.update(extra)
    data["all"]["hosts"] = dict(list(data["all"]["hosts"].items())[:hosts])
    path = tmp_path / f"inventory-{hosts}x{slots}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_json(lab: Lab, *args: str) -> tuple[int, dict]:
    result = lab("run", *args, "--json", timeout=600)
    assert result.out.strip(), result.err[-3000:]
    return result.code, json.loads(result.out)


def test_status_shows_every_host_answering(lab_up: Lab) -> None:
    result = lab_up("status")
    assert result.code == 0, result.text
    for i in TOPOLOGY.indices():
        assert TOPOLOGY.container(i) in result.out and TOPOLOGY.address(i) in result.out
    assert result.out.count("answers") == TOPOLOGY.hosts


def test_run_all_across_four_hosts(lab_up: Lab) -> None:
    code, report = run_json(lab_up, "all", "--hosts", str(INVENTORY))
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    assert [(r["host"], r["hostname"]) for r in report["ranks"]] == [
        (f"node{i}", f"node{i}") for i in TOPOLOGY.indices()]  # each rank in its own container
    assert_no_workers_anywhere()


def test_run_all_on_two_hosts_with_two_slots(lab_up: Lab, tmp_path: Path) -> None:
    code, report = run_json(lab_up, "all", "--hosts", str(inventory_variant(tmp_path, 2, 2)))
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    assert [r["hostname"] for r in report["ranks"]] == ["node1", "node1", "node2", "node2"]
    assert report["plan"]["master_addr"] == TOPOLOGY.address(1)


def test_a_host_stopped_mid_run_is_named_and_nothing_is_left(lab_up: Lab) -> None:
    victim = TOPOLOGY.container(2)
    proc = lab_up.popen("run", "p2p", "--hosts", str(INVENTORY), "--timeout", "60", "--json",
                        "--solution", str(WRONG / "p2p_never_sends.py"))
    try:
        deadline = time.monotonic() + 60
        while not workers_on(victim) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert workers_on(victim), "the rank never started on node2"
        started = time.monotonic()
        subprocess.run(["docker", "kill", victim], check=True, capture_output=True, timeout=60)
        out, _ = proc.communicate(timeout=120)
        assert time.monotonic() - started < 60
    finally:
        proc.kill()
        subprocess.run(["docker", "start", victim], capture_output=True, timeout=60)
    report = json.loads(out[out.index('{\n  "passed"'):])  # rank lines (stderr) come first
    assert proc.returncode != 0
    entry = report["exercises"][0]
    assert "node2" in entry["reason"], entry
    for i in TOPOLOGY.indices():
        if TOPOLOGY.container(i) != victim:
            assert workers_on(TOPOLOGY.container(i)) == []
    cluster.wait_for_ssh(TOPOLOGY)


def test_sshd_not_answering_is_a_clear_error_within_the_connect_timeout(lab_up: Lab, tmp_path: Path) -> None:
    inventory = inventory_variant(tmp_path, 2, 1)
    data = yaml.safe_load(inventory.read_text())
    data["all"]["hosts"]["node2"]["ansible_port"] = 2222  # nothing listens there
    inventory.write_text(yaml.safe_dump(data))
    started = time.monotonic()
    result = lab_up("run", "p2p", "--hosts", str(inventory))
    assert result.code == 3, result.text
    assert "node2" in result.err and "2222" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert time.monotonic() - started < 30


def test_an_unknown_host_key_is_refused_unless_accepted(lab_up: Lab, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    inventory = inventory_variant(tmp_path, 2, 1, ssh_known_hosts_file=str(known))
    result = lab_up("run", "p2p", "--hosts", str(inventory))
    assert result.code == 3, result.text
    assert "unknown SSH host key" in result.err and "--accept-new-host-keys" in result.err
    result = lab_up("run", "p2p", "--hosts", str(inventory), "--accept-new-host-keys")
    assert result.code == 0, result.text
    assert TOPOLOGY.address(1) in known.read_text()


def test_sigint_leaves_no_process_on_any_host(lab_up: Lab) -> None:
    proc = lab_up.popen("run", "p2p", "--hosts", str(INVENTORY), "--timeout", "120",
                        "--solution", str(WRONG / "p2p_never_sends.py"))
    deadline = time.monotonic() + 60
    while not all(workers_on(TOPOLOGY.container(i)) for i in TOPOLOGY.indices()):
        assert time.monotonic() < deadline, "the ranks never started"
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert_no_workers_anywhere()


def test_a_second_lab_up_reuses_the_image_and_keeps_no_older_one(lab_up: Lab) -> None:
    result = lab_up("up", "--no-smoke", timeout=600)
    assert result.code == 0, result.text
    assert "is up to date" in result.out and "building image" not in result.out
    current = re.search(r"image (lab-host:\w+) is up to date", result.out)[1]
    tags = {t for image in engine.client().images.list(name="lab-host") for t in image.tags}
    assert tags == {current, "lab-host:latest"}


def test_the_docker_transport_runs_ranks_by_docker_exec(lab_up: Lab, tmp_path: Path) -> None:
    inventory = tmp_path / "docker.yaml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "docker", "ansible_python_interpreter": cluster.PYTHON,
                 "shared_dir": cluster.SHARED_DIR, "slots": 2},
        "hosts": {TOPOLOGY.name(i): {"docker_container": TOPOLOGY.container(i),
                                     "data_address": TOPOLOGY.address(i)} for i in (1, 2)}}}))
    code, report = run_json(lab_up, "p2p", "all-reduce", "init-file", "--hosts", str(inventory))
    assert code == 0, report
    assert [r["hostname"] for r in report["ranks"]] == ["node1", "node1", "node2", "node2"]
    code, report = run_json(lab_up, "p2p", "--hosts", str(inventory), "--timeout", "5",
                            "--solution", str(WRONG / "p2p_never_sends.py"))
    assert code == 4 and "p2p_never_sends.py" in report["exercises"][0]["reason"]
    assert_no_workers_anywhere()


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_run_all_across_hosts_under_each_host_launcher(lab_up: Lab, tmp_path: Path, launcher: str) -> None:
    code, report = run_json(lab_up, "all", "--hosts", str(inventory_variant(tmp_path, 2, 2)),
                            "--launcher", launcher)
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    # Each host's launcher started its two ranks; c10d orders the hosts by address, as the inventory does.
    assert [r["host"] for r in sorted(report["ranks"], key=lambda r: r["rank"])] == ["node1", "node1", "node2", "node2"]
    assert len({r["hostname"] for r in report["ranks"]}) == 2
    assert_no_workers_anywhere()


@pytest.mark.parametrize("launcher", ["lab", "torchrun", "spawn"])
def test_the_tutorials_scripts_run_unchanged_across_hosts(lab_up: Lab, tmp_path: Path, launcher: str) -> None:
    for script in tutorial_scripts(tmp_path):
        n = script.nproc  # on 2 hosts, as the tutorial's 2 nodes (ranks 0..n/2-1 on node1)
        inventory = inventory_variant(tmp_path, 2, n // 2)
        result = lab_up("launch", "--hosts", str(inventory), "--launcher", launcher, "--timeout", "120",
                        str(script.path))
        assert result.code == 0, result.text
        assert f"{script.name}: {n} of {n} ranks succeeded" in result.out
        assert f"[node2 r{n - 1}] " in result.out  # the last rank ran, and printed, on the second host
        assert_prints_as_shown(script, result.out)
    assert_no_workers_anywhere()
