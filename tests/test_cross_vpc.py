"""The cross-VPC lab for real: two private networks, a NAT gateway, the doctor and the
tutorial's failure, on a real engine. Under CI=true these run; elsewhere they skip
without an engine. The lab is one of its own name (NAME), beside the default one, which other
tests change as these run."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.containerlab import containers, resources, topology
from lab.errors import ExitCode

from .conftest import Lab
from .load import cpu_hog
from .test_lab_docker import _client

pytestmark = pytest.mark.docker
NAME = "xvpc"
TOPOLOGY = topology.Topology(kind="cross-vpc", lab=NAME)  # (its names: its subnets are the engine's choice)
NAMED = ("up", "down", "net", "break", "fix", "status")  # the commands that take the lab's --name


class CrossVpcLab(Lab):
    """The CLI on this module's lab: every command about a lab names it."""

    def argv(self, *args: str) -> list[str]:
        return super().argv(*args, *(("--name", NAME) if args and args[0] in NAMED else ()))


def raw_rules() -> str:
    return subprocess.run(["iptables", "-t", "raw", "-S", "PREROUTING"], capture_output=True, text=True,
                          timeout=30).stdout


@pytest.fixture(scope="module")
def xvpc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Path]]:
    client = _client()
    inventory = tmp_path_factory.mktemp("xvpc") / "inventory.yaml"
    lab = CrossVpcLab()
    result = lab("up", "--topology", "cross-vpc", "--inventory", str(inventory), timeout=1500)
    assert result.code == 0, result.text[-4000:]
    bridges = [f"br-{client.networks.get(n.name).id[:12]}" for n in TOPOLOGY.networks()]
    assert all(b in raw_rules() for b in bridges)  # the netfilter fix is in place
    yield lab, inventory
    result = lab("down", timeout=300)
    assert result.code == 0, result.text
    assert resources.lab_containers(client, TOPOLOGY.lab) == []
    assert not any(b in raw_rules() for b in bridges)  # and gone again


def doctor(lab: Lab, inventory: Path) -> tuple[int, dict]:
    result = lab("doctor", "--hosts", str(inventory), "--json", timeout=300)
    assert result.out.strip(), result.err
    return result.code, json.loads(result.out)


def test_a_host_sees_only_its_private_address(xvpc: tuple[Lab, Path]) -> None:
    out = subprocess.run(["docker", "exec", TOPOLOGY.container(3), "ip", "-o", "-4", "addr"],
                         capture_output=True, text=True, timeout=30).stdout
    addresses = {line.split()[3].split("/")[0] for line in out.splitlines()}
    assert addresses == {"127.0.0.1", containers.running_topology(_client(), NAME).address(3)}
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


# -- the third way across: a WireGuard overlay (lab net overlay) -----------------------------------

OVERLAY = "lab.overlay.inventory.yaml"


def in_host(i: int, *argv: str, user: str = "lab") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", "-u", user, TOPOLOGY.container(i), *argv], capture_output=True,
                          text=True, timeout=60)


def overlay_sidecars() -> list[str]:
    return [c.name for c in resources.lab_containers(_client(), NAME) if c.labels.get(topology.ROLE) == "overlay"]


def assert_no_overlay_left() -> None:
    """No sidecar (and so no wireguard-go, no key), no interface and no /etc/hosts line on any host."""
    assert overlay_sidecars() == []
    for i in TOPOLOGY.indices():
        assert "labwg0" not in in_host(i, "ip", "-o", "link").stdout
        assert "lab-overlay" not in in_host(i, "cat", "/etc/hosts").stdout


def test_the_overlay_lesson_end_to_end(xvpc: tuple[Lab, Path]) -> None:
    """Without peering the run fails naming the NAT; on the overlay every exercise passes and the
    doctor is clean and reports it; once it is down the failure is back."""
    lab, inventory = xvpc
    failed = lab("run", "all", "--hosts", str(inventory), "--json", timeout=300)
    assert failed.code == ExitCode.NETWORK, failed.text[-4000:]
    cause = json.loads(failed.out)["cause"]
    assert sum("behind NAT" in e["call"] for e in cause["evidence"]) == 4
    assert "peer the VPCs" in cause["fix"] and "lab net overlay up" in cause["fix"]

    overlaid = inventory.parent / OVERLAY
    up = lab("net", "overlay", "up", "--inventory", str(overlaid), timeout=300)
    assert up.code == 0, up.text[-4000:]
    written = overlaid.read_text()
    assert [f"data_address: 10.77.0.1{i}" in written for i in TOPOLOGY.indices()] == [True] * 4
    assert written.count("network_interface: labwg0") == 4
    try:
        result = lab("run", "all", "--hosts", str(overlaid), "--json", timeout=600)
        assert result.code == 0, result.text[-6000:]
        report = json.loads(result.out)
        assert report["passed"] and len(report["exercises"]) == 19, [e["name"] for e in report["exercises"]]
        code, diagnosis = doctor(lab, overlaid)
        assert code == 0, [f for f in diagnosis["findings"] if f["severity"] == "error"]
        reported = {f["subject"]: f["message"] for f in diagnosis["findings"] if f["check"] == "overlay"}
        assert sorted(reported) == [TOPOLOGY.name(i) for i in TOPOLOGY.indices()]
        for i in TOPOLOGY.indices():
            assert reported[f"node{i}"].startswith(f"labwg0 10.77.0.1{i}/24 MTU 1420 (lab {NAME}'s WireGuard overlay)")
            peers = [f"node{j} " for j in TOPOLOGY.indices() if j != i]
            assert all(p in reported[f"node{i}"] for p in peers) and "never" not in reported[f"node{i}"]
        shown = lab("net", "overlay", "show")
        assert shown.code == 0 and shown.out.count("10.99.0.1") == 12 and "never" not in shown.out, shown.text
    finally:
        down = lab("net", "overlay", "down", timeout=120)
    assert down.code == 0, down.text
    assert_no_overlay_left()
    again = lab("run", "p2p", "--hosts", str(inventory), "--json", timeout=300)
    assert again.code == ExitCode.NETWORK, again.text[-4000:]
    code, diagnosis = doctor(lab, overlaid)  # its data addresses lead nowhere now, and it says why
    assert code != 0 and any(f["check"] == "overlay" and "has no labwg0" in f["message"]
                             for f in diagnosis["findings"])


def test_the_hosts_stay_unprivileged_and_never_see_a_key(xvpc: tuple[Lab, Path]) -> None:
    lab, inventory = xvpc
    assert lab("net", "overlay", "up", "--inventory", str(inventory.parent / OVERLAY), timeout=300).code == 0
    try:
        sidecar = json.loads(subprocess.run(["docker", "inspect", f"{NAME}-wg-node1"], capture_output=True, text=True,
                                            timeout=30).stdout)[0]["HostConfig"]
        assert sidecar["CapDrop"] == ["ALL"] and sidecar["CapAdd"] == ["NET_ADMIN"] and not sidecar["Privileged"]
        assert sidecar["SecurityOpt"] == ["no-new-privileges"] and sidecar["PidsLimit"] == 128
        assert [d["PathOnHost"] for d in sidecar["Devices"]] == ["/dev/net/tun"]
        changed = in_host(1, "ip", "link", "set", "labwg0", "mtu", "1300", user="root")
        assert changed.returncode != 0 and "Operation not permitted" in changed.stderr
        assert in_host(1, "wg", "show", "labwg0", user="root").returncode != 0  # its peers: root in the sidecar only
        key = subprocess.run(["docker", "exec", f"{NAME}-wg-node1", "stat", "-c", "%a %U", "/run/lab-wg/private.key"],
                             capture_output=True, text=True, timeout=30).stdout.split()
        assert key == ["600", "root"]
        assert in_host(1, "ls", "/run/lab-wg", user="root").returncode != 0  # not in the host's filesystem
    finally:
        assert lab("net", "overlay", "down", timeout=120).code == 0
    assert_no_overlay_left()


def test_a_host_wireguard_cannot_start_on_and_one_nobody_reaches_are_named_and_leave_nothing(
        xvpc: tuple[Lab, Path]) -> None:
    lab, inventory = xvpc
    made = subprocess.run(["docker", "run", "--rm", "--network", f"container:{TOPOLOGY.container(3)}", "--cap-drop",
                           "ALL", "--cap-add", "NET_ADMIN", "--entrypoint", "ip", "lab-host:latest", "link", "add",
                           "labwg0", "type", "vxlan", "id", "42", "dev", "eth0", "dstport", "4789"],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr  # an interface of that name, not WireGuard's: wireguard-go fails
    try:
        result = lab("net", "overlay", "up", "--inventory", str(inventory.parent / OVERLAY), timeout=300)
    finally:
        subprocess.run(["docker", "run", "--rm", "--network", f"container:{TOPOLOGY.container(3)}", "--cap-drop",
                        "ALL", "--cap-add", "NET_ADMIN", "--entrypoint", "ip", "lab-host:latest", "link", "del",
                        "labwg0"], capture_output=True, timeout=60)
    assert result.code == ExitCode.RUN_ERROR, result.text
    assert result.err.splitlines() == ["lab: error: host node3: wireguard-go cannot start: Failed to create TUN "
                                       "device: invalid argument (an interface labwg0 is there already, not "
                                       "WireGuard's)"]
    assert_no_overlay_left()

    assert lab("break", "partition", "node2").code == 0
    try:
        result = lab("net", "overlay", "up", "--inventory", str(inventory.parent / OVERLAY), timeout=300)
    finally:
        assert lab("fix", "partition").code == 0
    assert result.code == ExitCode.UNREACHABLE, result.text
    assert result.err.splitlines() == ["lab: error: host node2: no WireGuard handshake with any peer within 20s: the "
                                       "others do not reach it at its endpoint 10.99.0.12:51820 (UDP), or it does "
                                       "not reach them"]
    assert_no_overlay_left()


# -- a busy machine: the real faults are still named, and only they ------------------------------

@pytest.mark.load
def test_on_a_busy_machine_the_preflight_stops_the_unpeered_job_naming_nat_and_passes_it_peered(
        xvpc: tuple[Lab, Path]) -> None:
    """Before any rank starts, on a busy machine: the pairs that cannot reach each other across the
    VPCs, the NAT behind it and its fix; peered, the same job passes."""
    lab, inventory = xvpc
    with cpu_hog():
        stopped = lab("run", "p2p", "--hosts", str(inventory), "--json", timeout=600)
        assert lab("net", "peering", "on").code == 0
        try:
            passed = lab("run", "p2p", "--hosts", str(inventory), timeout=600)
        finally:
            assert lab("net", "peering", "off").code == 0
    assert stopped.code == ExitCode.NETWORK, stopped.text[-4000:]
    report = json.loads(stopped.out)
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
    assert passed.code == ExitCode.OK, passed.text[-2000:]


@pytest.mark.load
def test_on_a_busy_machine_the_overlays_mtu_black_hole_is_named_by_the_run_and_the_doctor_and_undone_by_fix(
        xvpc: tuple[Lab, Path]) -> None:
    """Small messages pass and large ones vanish: on a busy machine the run's preflight names the
    host, and the doctor's large message does; lab fix mends it. (The overlay stays up: the
    module's `lab down` must take it, and checks nothing is left.)"""
    lab, inventory = xvpc
    overlaid = inventory.parent / OVERLAY
    assert lab("net", "overlay", "up", "--inventory", str(overlaid), timeout=300).code == 0
    with cpu_hog():
        healthy = lab("run", "p2p", "--hosts", str(overlaid), timeout=600)
    # (seen twice in CI, never here: node1 and node4 unreachable to each other over the overlay for the
    # preflight's 2.5 s right after every pair's handshake; what each end's WireGuard says then, kept)
    shown = "" if healthy.code == ExitCode.OK else lab("net", "overlay", "show").text
    assert lab("break", "mtu", "node2").code == 0
    try:
        with cpu_hog():
            stopped = lab("run", "p2p", "--hosts", str(overlaid), "--json", timeout=600)
        code, diagnosis = doctor(lab, overlaid)
    finally:
        assert lab("fix").code == 0
    assert healthy.code == ExitCode.OK, healthy.text[-4000:] + shown  # the overlay's userspace crypto, loaded: slow
    assert stopped.code == ExitCode.NETWORK, stopped.text[-4000:]  # the preflight: before any rank starts
    cause = json.loads(stopped.out)["cause"]
    assert "small messages pass but large ones do not" in cause["headline"] and "node2" in cause["headline"], cause
    assert code == ExitCode.CHECK_FAILED
    errors = [f for f in diagnosis["findings"] if f["severity"] == "error"]
    assert [(f["check"], f["subject"]) for f in errors] == [("mtu", "node2")], errors
    assert "none of its bytes acknowledged" in errors[0]["message"] and "--mtu" in errors[0]["fix"]
    assert all(link["ok"] for link in diagnosis["links"])  # every connection and handshake passed
    code, diagnosis = doctor(lab, overlaid)
    assert code == 0, [f for f in diagnosis["findings"] if f["severity"] == "error"]
