"""The cross-VPC lab for real: two private networks, a NAT gateway, the doctor and the
tutorial's failure, on a real engine. Under CI=true these run; elsewhere they skip
without an engine."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.containerlab import resources, topology
from lab.errors import ExitCode

from .conftest import Lab
from .test_lab_docker import _client

pytestmark = pytest.mark.docker
TOPOLOGY = topology.Topology(kind="cross-vpc")


def raw_rules() -> str:
    return subprocess.run(["iptables", "-t", "raw", "-S", "PREROUTING"], capture_output=True, text=True,
                          timeout=30).stdout


@pytest.fixture(scope="module")
def xvpc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Path]]:
    client = _client()
    inventory = tmp_path_factory.mktemp("xvpc") / "inventory.yaml"
    lab = Lab()
    result = lab("up", "--topology", "cross-vpc", "--inventory", str(inventory), timeout=1500)
    assert result.code == 0, result.text[-4000:]
    bridges = [f"br-{client.networks.get(n.name).id[:12]}" for n in TOPOLOGY.networks()]
    assert all(b in raw_rules() for b in bridges)  # the netfilter fix is in place
    yield lab, inventory
    result = lab("down", timeout=300)
    assert result.code == 0, result.text
    assert resources.lab_containers(client, None) == []
    assert not any(b in raw_rules() for b in bridges)  # and gone again


def doctor(lab: Lab, inventory: Path) -> tuple[int, dict]:
    result = lab("doctor", "--hosts", str(inventory), "--json", timeout=300)
    assert result.out.strip(), result.err
    return result.code, json.loads(result.out)


def test_a_host_sees_only_its_private_address(xvpc: tuple[Lab, Path]) -> None:
    out = subprocess.run(["docker", "exec", TOPOLOGY.container(3), "ip", "-o", "-4", "addr"],
                         capture_output=True, text=True, timeout=30).stdout
    addresses = {line.split()[3].split("/")[0] for line in out.splitlines()}
    assert addresses == {"127.0.0.1", TOPOLOGY.address(3)}
    gateway = subprocess.run(["docker", "inspect", "-f", "{{.HostConfig.CapAdd}}", TOPOLOGY.gateway_container],
                             capture_output=True, text=True, timeout=30).stdout
    host = subprocess.run(["docker", "inspect", "-f", "{{json .HostConfig}}", TOPOLOGY.container(1)],
                          capture_output=True, text=True, timeout=30).stdout
    config = json.loads(host)
    assert "NET_ADMIN" in gateway and not config["Privileged"] and config["CapDrop"] == ["ALL"]
    assert config["CapAdd"] == list(topology.HostLimits.CAPABILITIES)  # sshd's, and no NET_ADMIN


def test_doctor_reports_the_unreachable_pairs_and_the_nat_then_passes_with_peering(
        xvpc: tuple[Lab, Path]) -> None:
    lab, inventory = xvpc
    code, report = doctor(lab, inventory)
    assert code == 1, report["findings"]
    failed = {(link["from"], link["target"]["peer"]) for link in report["links"]
              if link["target"]["kind"] == "mesh" and not link["ok"]}
    across = {(f"node{a}", f"node{b}") for a in (1, 2) for b in (3, 4)}
    assert failed == across | {(b, a) for a, b in across}
    assert any(f["check"] == "nat" for f in report["findings"])
    assert lab("net", "peering", "on").code == 0
    try:
        code, report = doctor(lab, inventory)
        assert code == 0, [f for f in report["findings"] if f["severity"] == "error"]
    finally:
        assert lab("net", "peering", "off").code == 0


def test_run_cross_vpc_shows_the_failure_diagnoses_it_and_passes_with_peering(xvpc: tuple[Lab, Path]) -> None:
    lab, inventory = xvpc
    result = lab("run", "cross-vpc", "--hosts", str(inventory), "--json", timeout=600)
    assert result.code == 0, result.text[-6000:]
    report = json.loads(result.out)
    assert report["passed"] and all(step["passed"] for step in report["steps"])
    assert "connected to the store" in result.err  # the ranks said so, as it happened
    assert lab("net", "peering", "show").out.strip().endswith("peering is off")  # left as it was


def test_the_preflight_stops_the_unpeered_job_before_its_ranks_start_naming_nat_and_passes_it_peered(
        xvpc: tuple[Lab, Path]) -> None:
    lab, inventory = xvpc
    result = lab("run", "p2p", "--hosts", str(inventory), "--json", timeout=300)
    assert result.code == ExitCode.NETWORK, result.text[-4000:]
    report = json.loads(result.out)
    cause = report["cause"]
    assert report["status"] == "preflight" and cause["kind"] == "network"
    assert "the store (MASTER_ADDR) is reachable but ranks advertise private addresses" in cause["headline"]
    evidence = [e["call"] for e in cause["evidence"]]
    for a, b in (("node1, node2", "node3"), ("node1, node2", "node4"), ("node3, node4", "node1"),
                 ("node3, node4", "node2")):
        assert any(line.startswith(f"{a} cannot reach {b} at 10.") for line in evidence), evidence
    assert sum("behind NAT" in line for line in evidence) == 4
    assert "peer the VPCs" in cause["fix"]
    assert [r["hostname"] for r in report["ranks"]] == [None] * 4  # no rank started
    assert lab("net", "peering", "on").code == 0
    try:
        result = lab("run", "p2p", "--hosts", str(inventory), timeout=300)
        assert result.code == ExitCode.OK, result.text[-4000:]
    finally:
        assert lab("net", "peering", "off").code == 0
