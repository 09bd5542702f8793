"""lab doctor: the probe's pure parts and the analysis on plain data; then real probes on
the local cluster, over a real sshd, and on the container lab.

The unit tests build what probes report by hand (no processes). The local tests run
the real probes through LocalTransport. The sshd and docker tiers skip where their
server or engine is missing, and fail instead under CI=true.
"""
from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from lab.cli.views.doctor import print_diagnosis
from lab.doctor.run import _ProbeRun, diagnose, explain_hang
from lab.errors import ExitCode
from lab.inventory.hosts import load_inventory, local_inventory
from lab.inventory.model import Host, Inventory
from lab.netcheck.model import Diagnosis, Finding, HostFacts, HostReport, Master, Runtime
from lab.netcheck.rules import NO_NETWORK_CAUSE, SAME_NETWORK_FIX, analyse, hang_causes, plan_targets
from lab.rank.netfacts import (
    Advertised,
    Interface,
    Link,
    Lookup,
    Target,
    gloo_address,
    is_loopback,
    nccl_address,
    parse_if_inet6,
    parse_ip_json,
    plain_address,
)
from lab.rank.protocol import LINE_MAX, event_line
from lab.transport.base import RankProcess, Transport
from lab.transport.reach import transport_for
from lab.transport.ssh.settings import SSHSettings
from lab.transport.ssh.transport import SSHTransport

from .conftest import REPO, live_pids_with
from .sshd import SSHServer

LO = Interface("lo", ("127.0.0.1", "::1"))


# -- building what probes report --------------------------------------------------------


def facts(address: str, *, hostname: str = "host", resolved: tuple[str, ...] | None = None,
          machine: str | None = None, gloo: Advertised | None = None, extra: tuple[Interface, ...] = (),
          reverse: tuple[Lookup, ...] = (), python: str = "3.11.2", env: dict[str, str] | None = None) -> HostFacts:
    """A probe's facts for a host whose eth0 has ``address``."""
    interfaces = (LO, Interface("eth0", (address,)), *extra)
    answer = resolved if resolved is not None else (address,)
    return HostFacts(hostname=hostname, python=python, machine=machine or f"machine-{address}",
                     interfaces=interfaces, resolved=Lookup(hostname, answer, 0.001),
                     gloo=gloo or gloo_address(None, hostname, answer, interfaces, lambda a: True),
                     nccl=nccl_address(None, interfaces), port=40000, reverse=reverse, env=env or {})


def report(name: str, address: str, *, data: str | None = None, torch: str | None = "2.13.0",
           links: tuple[Link, ...] = (), slots: int = 1, **kwargs: object) -> HostReport:
    host = Host(name, address, data_address=data, slots=slots)
    runtime = Runtime(torch, None if torch else "ModuleNotFoundError: No module named 'torch'")
    return HostReport(host, facts(address, hostname=name, **kwargs), runtime, links)  # type: ignore[arg-type]


def link(kind: str, peer: str, address: str, *, seen: str | None = None, failure: str | None = None) -> Link:
    target = Target(kind, peer, address, 40000)
    if failure:
        error = {"timeout": "no answer within 5s", "refused": "connection refused",
                 "slow": "connected, but no reply within 5s: the host is busy"}[failure]
        return Link(target, False, 5.0, failure, error)
    return Link(target, True, 0.002, seen=seen, answered_by=peer, peer_ip=address)


def checks(findings: list[Finding], severity: str = "error") -> list[tuple[str, str]]:
    return [(f.check, f.subject) for f in findings if f.severity == severity]


def mesh_links(name: str, reports_addresses: dict[str, str], seen: str) -> tuple[Link, ...]:
    """Everything ``name`` connects to on a healthy flat network."""
    return (link("master", "a", reports_addresses["a"], seen=seen),
            *(link("mesh", peer, address, seen=seen) for peer, address in reports_addresses.items() if peer != name))


def flat_cluster(**changes: dict[str, object]) -> list[HostReport]:
    addresses = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}
    return [report(n, a, links=mesh_links(n, addresses, a), **changes.get(n, {}))  # type: ignore[arg-type]
            for n, a in addresses.items()]


MASTER = Master("a", "10.0.0.1", 40000)


# -- unit: the probe's pure parts -----------------------------------------------------


def test_gloo_follows_the_hostname_and_127_0_1_1_is_flagged_when_hosts_are_apart() -> None:
    interfaces = [LO, Interface("eth0", ("10.0.0.2",))]
    advertised = gloo_address(None, "b", ["127.0.1.1", "10.0.0.2"], interfaces, lambda a: True)
    assert (advertised.address, advertised.interface, advertised.error) == ("127.0.1.1", "lo", None)
    cluster = flat_cluster(b={"resolved": ("127.0.1.1",)})
    found = analyse(cluster, MASTER)
    resolve = next(f for f in found if f.check == "resolve")
    assert (resolve.severity, resolve.subject) == ("error", "b")
    assert "127.0.1.1 (loopback)" in resolve.message and "/etc/hosts" in resolve.fix
    assert "'10.0.0.2 b'" in resolve.fix and "GLOO_SOCKET_IFNAME" in resolve.fix


def test_loopback_is_fine_while_every_host_shares_one_machine() -> None:
    same = [report(n, "10.0.0.9", machine="this", resolved=("127.0.1.1",)) for n in ("a", "b")]
    assert checks(analyse(same, MASTER)) == []


def test_gloo_skips_addresses_it_cannot_bind_and_falls_back_to_loopback() -> None:
    interfaces = [LO, Interface("eth0", ("10.0.0.2",))]
    bindable = {"10.0.0.2"}.__contains__
    assert gloo_address(None, "b", ["203.0.113.9", "10.0.0.2"], interfaces, bindable).address == "10.0.0.2"
    fallback = gloo_address(None, "b", ["203.0.113.9"], interfaces, bindable)
    assert (fallback.address, fallback.interface, fallback.error) == ("127.0.0.1", "lo", None)
    assert "resolves to no address" in fallback.how


def test_socket_ifname_wins_over_the_hostname_and_a_missing_interface_is_an_error() -> None:
    interfaces = [LO, Interface("eth0", ("10.0.0.2", "fd00::2")), Interface("wg0", ())]
    assert gloo_address("eth0", "b", ["127.0.1.1"], interfaces, lambda a: True).address == "10.0.0.2"
    assert gloo_address("eth0,wg0", "b", [], interfaces, lambda a: True).interface == "eth0"
    assert gloo_address("eth9", "b", [], interfaces, lambda a: True).error == "there is no interface eth9"
    assert gloo_address("wg0", "b", [], interfaces, lambda a: True).error == "interface wg0 has no address"


def test_nccl_interface_choice() -> None:
    interfaces = [LO, Interface("docker0", ("172.17.0.1",)), Interface("eth0", ("10.0.0.2",)),
                  Interface("ib0", ("192.168.1.2",)), Interface("eth1", ())]
    assert nccl_address(None, interfaces).interface == "ib0"  # InfiniBand first
    assert nccl_address(None, interfaces[:3]).interface == "eth0"  # then anything but docker* and lo
    assert nccl_address(None, interfaces[:2]).interface == "docker0"
    assert nccl_address("eth", interfaces).address == "10.0.0.2"  # a prefix; eth1 has no address
    assert nccl_address("^eth,ib,docker", interfaces).interface == "lo"
    assert nccl_address("=eth", interfaces).error is not None  # exact names only


def test_interfaces_from_ip_json_and_proc() -> None:
    text = json.dumps([{"ifname": "lo", "addr_info": [{"family": "inet6", "local": "::1"},
                                                      {"family": "inet", "local": "127.0.0.1"}]},
                       {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "10.213.0.12"}]},
                       {"ifname": "tunl0"}])
    assert parse_ip_json(text) == [Interface("lo", ("127.0.0.1", "::1")), Interface("eth0", ("10.213.0.12",)),
                                   Interface("tunl0", ())]
    proc = ("00000000000000000000000000000001 01 80 10 80       lo\n"
            "fd000000000000000000000000000002 04 40 00 82     eth0\n")
    assert parse_if_inet6(proc) == {"lo": ["::1"], "eth0": ["fd00::2"]}
    assert plain_address("::ffff:10.0.0.3") == "10.0.0.3" and is_loopback("127.0.1.1") and not is_loopback("node1")


# -- unit: the analysis ------------------------------------------------------------------


def test_a_healthy_flat_cluster_has_no_finding_but_the_gpu_note() -> None:
    found = analyse(flat_cluster(), MASTER)
    assert [(f.severity, f.check) for f in found] == [("info", "gpus")]


def test_nat_seen_address_against_what_the_host_believes() -> None:
    addresses = {"a": "10.0.0.1", "node3": "10.20.0.13"}
    cluster = [report("a", "10.0.0.1", links=mesh_links("a", addresses, "10.0.0.1")),
               report("node3", "10.20.0.13", links=mesh_links("node3", addresses, "10.99.0.13"))]
    nat = [f for f in analyse(cluster, MASTER) if f.check == "nat"]
    assert [(f.severity, f.subject) for f in nat] == [("warning", "node3")]
    assert nat[0].message.startswith("node3 is seen as 10.99.0.13 but believes it is 10.20.0.13: behind NAT")
    assert "WireGuard" in nat[0].fix and "VPC" in nat[0].fix


def test_the_cross_vpc_topology_reads_as_the_tutorials_failure() -> None:
    """Two VPCs behind a 1:1 NAT gateway; data_address (and MASTER_ADDR) are the external
    addresses, which everyone reaches; each host advertises its private one."""
    private = {"node1": "10.10.0.11", "node2": "10.10.0.12", "node3": "10.20.0.13", "node4": "10.20.0.14"}
    external = {name: f"10.99.0.{address.rsplit('.', 1)[1]}" for name, address in private.items()}
    vpc = {name: address.split(".")[1] for name, address in private.items()}
    cluster = []
    for name in private:
        links = [link("master", "node1", external["node1"], seen=external[name])]
        for peer in private:
            if peer == name:
                continue
            same = vpc[peer] == vpc[name]
            links.append(link("mesh", peer, private[peer], seen=private[name]) if same
                         else link("mesh", peer, private[peer], failure="timeout"))
            links.append(link("data", peer, external[peer], seen=external[name]))
        cluster.append(report(name, private[name], data=external[name], links=tuple(links)))
    master = Master("node1", external["node1"], 40000)
    found = analyse(cluster, master)
    first = found[0]
    assert (first.check, first.subject) == ("mesh", "cluster")
    assert first.message == ("the store (MASTER_ADDR) is reachable but ranks advertise private addresses other "
                             "hosts cannot reach: the rendezvous will connect, then the mesh hangs")
    assert first.fix == SAME_NETWORK_FIX
    assert {f.subject for f in found if f.check == "mesh"} == {"cluster", "-> node1", "-> node2", "-> node3",
                                                               "-> node4"}
    to_node1 = next(f for f in found if f.subject == "-> node1")
    assert to_node1.message.startswith("node3, node4 cannot reach node1 at 10.10.0.11:40000")
    assert "reachable as 10.99.0.11" in to_node1.cause
    assert {f.subject for f in found if f.check == "nat"} == set(private)
    assert any(f.check == "master" and "not an address node1 has" in f.message for f in found)
    diagnosis = Diagnosis(tuple(cluster), master, tuple(found))
    assert not diagnosis.ok and diagnosis.exit_code == ExitCode.CHECK_FAILED
    assert hang_causes(diagnosis)[0].startswith("cluster: the store (MASTER_ADDR) is reachable")


def test_a_host_nobody_reaches_at_all_is_a_firewall_or_route_problem() -> None:
    cluster = flat_cluster()
    for r in cluster:
        r.links = tuple(link("mesh", "c", "10.0.0.3", failure="timeout") if each.target.peer == "c" else each
                        for each in r.links)
    found = analyse(cluster, MASTER)
    to_c = next(f for f in found if f.subject == "-> c")
    assert "firewall" in to_c.cause and "32768-60999" in to_c.fix and "MASTER_PORT" in to_c.fix
    assert "private" not in found[0].message


def test_master_unreachable_from_everyone_and_from_one() -> None:
    cluster = flat_cluster()
    for r in cluster:
        r.links = tuple(link("master", "a", "10.0.0.1", failure="refused") if each.target.kind == "master" else each
                        for each in r.links)
    everyone = [f for f in analyse(cluster, MASTER) if f.check == "master"]
    assert [(f.subject, f.message) for f in everyone] == [
        ("cluster", "no host reaches MASTER_ADDR 10.0.0.1:40000 (connection refused)")]
    assert "data_address of a" in everyone[0].fix and "port 40000" in everyone[0].fix
    cluster = flat_cluster()
    cluster[2].links = (link("master", "a", "10.0.0.1", failure="timeout"), *cluster[2].links[1:])
    assert checks(analyse(cluster, MASTER)) == [("master", "c")]


def test_versions_must_match_and_torch_must_import() -> None:
    cluster = flat_cluster(b={"torch": "2.12.1"}, c={"torch": None, "python": "3.10.12"})
    found = analyse(cluster, MASTER)
    messages = {f.subject: f.message for f in found if f.check == "versions" and f.subject != "cluster"}
    assert messages["c"].startswith("torch is not importable") and "No module named 'torch'" in messages["c"]
    cluster_level = [f.message for f in found if f.check == "versions" and f.subject == "cluster"]
    assert cluster_level == ["Python differs between hosts: 3.11 on a, b; 3.10 on c",
                             "torch differs between hosts: 2.13.0 on a; 2.12.1 on b"]
    same_release = flat_cluster(b={"torch": "2.13.0+cu128"})
    assert checks(analyse(same_release, MASTER)) == []


def test_address_families_must_agree() -> None:
    v6 = Advertised("fd00::2", "eth0", "hostname b resolves to it")
    cluster = flat_cluster(b={"gloo": v6})
    family = [f for f in analyse(cluster, MASTER) if f.check == "family"]
    assert [(f.severity, f.subject) for f in family] == [("error", "cluster")]
    assert "b fd00::2 (IPv6)" in family[0].message and "a 10.0.0.1 (IPv4)" in family[0].message
    master_v6 = [f for f in analyse(flat_cluster(), Master("a", "fd00::1", 40000)) if f.check == "family"]
    assert [(f.severity, f.message) for f in master_v6] == [
        ("warning", "MASTER_ADDR fd00::1 is IPv6 but the hosts advertise IPv4 addresses")]


def test_slow_reverse_lookups_warn() -> None:
    slow = (Lookup("10.0.0.2", (), 5.0, "no answer within 5s"),)
    found = analyse(flat_cluster(b={"reverse": slow}), MASTER)
    lookup = next(f for f in found if f.check == "lookup")
    assert (lookup.severity, lookup.subject) == ("warning", "b")
    assert lookup.message.startswith("slow name resolution: reverse lookups stall init")
    assert "gethostbyaddr(10.0.0.2) took 5.0s" in lookup.message and "/etc/hosts" in lookup.fix


def test_targets_are_master_every_advertised_peer_and_differing_data_addresses() -> None:
    cluster = [report("a", "10.0.0.1", slots=2), report("b", "10.0.0.2", data="203.0.113.2")]
    plans = plan_targets(cluster, MASTER)
    assert [(t.kind, t.peer, t.address) for t in plans["a"]] == [
        ("master", "a", "10.0.0.1"), ("mesh", "a", "10.0.0.1"), ("mesh", "b", "10.0.0.2"),
        ("data", "b", "203.0.113.2")]
    assert [(t.kind, t.peer) for t in plans["b"]] == [("master", "a"), ("mesh", "a")]


def test_explain_hang_says_when_the_network_is_not_the_cause() -> None:
    diagnosis = Diagnosis(tuple(flat_cluster()), MASTER, tuple(analyse(flat_cluster(), MASTER)))
    assert hang_causes(diagnosis) == [NO_NETWORK_CAUSE]


# -- real probes on this machine ---------------------------------------------------------


def local_hosts(tmp_path: Path, body: str) -> Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text(f"all:\n  vars: {{ansible_connection: local}}\n  hosts:\n{body}")
    return load_inventory(path)


def marked(marker: str) -> list[int]:
    return live_pids_with(f"LAB_DOCTOR_TEST={marker}")


@pytest.mark.local
def test_local_cluster_is_ok_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    marker = str(time.time_ns())
    monkeypatch.setenv("LAB_DOCTOR_TEST", marker)  # every probe inherits it
    diagnosis = diagnose(local_inventory(3))
    assert diagnosis.ok and diagnosis.exit_code == ExitCode.OK, diagnosis.findings
    (only,) = diagnosis.reports
    assert only.facts is not None and only.runtime is not None and only.runtime.torch
    assert is_loopback(only.facts.gloo.address or "")  # this machine's hostname: loopback serves one machine
    assert [(pair, link.ok) for pair, link in diagnosis.mesh().items()] == [(("local", "local"), True)]
    assert diagnosis.master.address == "127.0.0.1" and all(each.ok for each in only.links)
    assert marked(marker) == []
    assert not list(Path(tempfile.gettempdir()).glob("lab-doctor-*"))  # the run directory is gone


@pytest.mark.local
def test_two_local_hosts_reach_each_other_through_their_advertised_addresses(tmp_path: Path) -> None:
    diagnosis = diagnose(local_hosts(tmp_path, "    a: {}\n    b: {slots: 2}\n"), timeout=3.0)
    assert diagnosis.ok, diagnosis.findings
    mesh = diagnosis.mesh()
    assert sorted(mesh) == [("a", "b"), ("b", "a"), ("b", "b")] and all(each.ok for each in mesh.values())
    for r in diagnosis.reports:
        assert r.facts is not None and r.facts.gloo.address is not None
        assert is_loopback(r.facts.gloo.address) or r.facts.gloo.address in r.facts.addresses
    assert not any(f.check == "nat" for f in diagnosis.findings)
    json.dumps(diagnosis.to_json())  # plain data all the way down
    assert explain_hang(local_hosts(tmp_path, "    a: {}\n    b: {}\n")) == [NO_NETWORK_CAUSE]


@pytest.mark.local
def test_a_network_interface_that_does_not_exist_is_a_failure_with_the_fix(tmp_path: Path) -> None:
    diagnosis = diagnose(local_hosts(tmp_path, "    a: {}\n    b: {network_interface: nosuch0}\n"))
    assert not diagnosis.ok and diagnosis.exit_code == ExitCode.CHECK_FAILED
    (error,) = diagnosis.errors
    assert (error.check, error.subject) == ("interface", "b")
    assert "network_interface nosuch0" in error.message and "there is no interface nosuch0" in error.message
    assert "init_process_group fails" in error.cause
    assert error.fix.startswith("set network_interface of b in the inventory to one of its interfaces")
    console_text = render(diagnosis)
    assert "there is no interface nosuch0" in console_text and "fix: set network_interface of b" in console_text


@pytest.mark.local
def test_a_master_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.create_server(("", 0)) as busy:
        port = busy.getsockname()[1]
        diagnosis = diagnose(local_hosts(tmp_path, "    a: {}\n    b: {}\n"), master_port=port)
    (error,) = diagnosis.errors
    assert (error.check, error.subject) == ("master", "a")
    assert f"MASTER_PORT {port} cannot be used on a" in error.message and "in use" in error.message
    assert all(link.ok for r in diagnosis.reports for link in r.links)  # the rest still checked


@pytest.mark.local
def test_an_unreachable_host_is_named_with_the_transports_reason(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]  # free again below: nothing listens
    inventory = Inventory("<test>", (Host("gone", "127.0.0.1", port=port, user="root", connection="ssh"),
                                     Host("here", "127.0.0.1", connection="local")))
    settings = SSHSettings(connect_timeout=3.0, ssh_config=str(tmp_path / "none"))
    started = time.monotonic()
    diagnosis = diagnose(inventory, settings, timeout=2.0)
    assert time.monotonic() - started < 30
    assert list(diagnosis.unreachable) == ["gone"] and str(port) in diagnosis.unreachable["gone"]
    assert diagnosis.exit_code == ExitCode.UNREACHABLE and not diagnosis.ok
    assert "unreachable" in render(diagnosis)


def render(diagnosis: Diagnosis) -> str:
    from rich.console import Console

    console = Console(width=250, record=True, force_terminal=False)
    print_diagnosis(console, diagnosis)
    return console.export_text()


# -- writing to a process's stdin, on every transport -------------------------------------


def echo_through(transport: Transport, cwd: str = "/tmp") -> tuple[list[bytes], int]:
    """Start a process that echoes its stdin and ends at end-of-file; send, close, read."""
    process: RankProcess = transport.start(["sh", "-c", "while read line; do echo got $line; done; echo eof"],
                                           {}, cwd)
    try:
        process.send(b"one\n")
        process.send(b"two\n")
        process.close_stdin()
        process.close_stdin()  # twice is fine
        lines = list(iter(process.stdout.readline, b""))
        deadline = time.monotonic() + 10
        while (status := process.poll()) is None:
            assert time.monotonic() < deadline, "the process did not end at end-of-file"
            time.sleep(0.02)
        return lines, status
    finally:
        process.kill()
        transport.close()


@pytest.mark.local
def test_local_process_stdin() -> None:
    lines, status = echo_through(transport_for(Host("here", "127.0.0.1", connection="local")))
    assert (lines, status) == ([b"got one\n", b"got two\n", b"eof\n"], 0)


def ssh_inventory(server: SSHServer, tmp_path: Path) -> Inventory:
    (tmp_path / "known_hosts").write_text(server.known_hosts_line)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_host": "127.0.0.1", "ansible_port": server.port, "ansible_user": "root",
                 "ansible_ssh_private_key_file": str(server.client_key), "ssh_known_hosts_file": "known_hosts",
                 "ansible_python_interpreter": sys.executable, "data_address": "127.0.0.1"},
        "hosts": {"a": None, "b": None}}}))
    return load_inventory(path)


@pytest.mark.sshd
def test_ssh_process_stdin(server: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    host = ssh_inventory(server, tmp_path).hosts[0]
    transport = SSHTransport(host, SSHSettings(connect_timeout=5.0, ssh_config=str(tmp_path / "none")))
    lines, status = echo_through(transport)
    assert (lines, status) == ([b"got one\n", b"got two\n", b"eof\n"], 0)


@pytest.mark.sshd
def test_diagnose_over_ssh(server: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = SSHSettings(connect_timeout=5.0, ssh_config=str(tmp_path / "none"))
    diagnosis = diagnose(ssh_inventory(server, tmp_path), settings)
    assert diagnosis.ok, diagnosis.findings
    assert sorted(diagnosis.mesh()) == [("a", "b"), ("b", "a")]
    assert all(r.runtime is not None and r.runtime.torch for r in diagnosis.reports)
    assert not list(Path(tempfile.gettempdir()).glob("lab-doctor-*"))


# -- the container lab -------------------------------------------------------------------


INVENTORY = REPO / "inventory.yaml"
NODE2 = "lab-node2"


def lab(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def plain_lab_is_up() -> bool:
    status = lab("status", timeout=120)
    if status.returncode != 0 or status.stdout.count("answers") < 4 or not INVENTORY.exists():
        return False
    hosts = yaml.safe_load(INVENTORY.read_text())["all"]["hosts"]
    return all(str(h.get("ansible_host", "")).startswith("10.213.0.") for h in hosts.values())


@pytest.fixture(scope="module")
def container_lab() -> Inventory:
    """The 4-host plain container lab, started when it is not up (and left up)."""
    from lab.containerlab import engine

    try:
        if os.environ.get("CI") == "true":  # must run: install and start the engine when missing
            engine.ensure_engine(lambda message: print(f"lab: {message}"))
        else:
            engine.client()
    except engine.EngineError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no Docker engine: {exc}")
    if not plain_lab_is_up():
        done = lab("up", "--no-smoke")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return load_inventory(INVENTORY)


@pytest.mark.docker
def test_the_container_lab_is_ok_with_every_pair_and_no_nat(container_lab: Inventory) -> None:
    diagnosis = diagnose(container_lab)
    assert diagnosis.ok, diagnosis.findings
    mesh = diagnosis.mesh()
    assert len(mesh) == 12 and all(link.ok for link in mesh.values())
    assert not [f for f in diagnosis.findings if f.check == "nat"]
    for r in diagnosis.reports:
        assert r.facts is not None and r.facts.gloo.address == r.host.address  # node i: 10.213.0.1i
        assert r.facts.hostname == r.name and r.runtime is not None and r.runtime.torch
    assert diagnosis.master.address == "10.213.0.11"


@pytest.mark.docker
def test_docker_process_stdin(container_lab: Inventory) -> None:
    host = Host("node1", "node1", connection="docker", container="lab-node1")
    lines, status = echo_through(transport_for(host))
    assert (lines, status) == ([b"got one\n", b"got two\n", b"eof\n"], 0)


@pytest.mark.docker
def test_a_hostname_resolving_to_127_0_1_1_is_flagged(container_lab: Inventory) -> None:
    """node2's /etc/hosts maps node2 to 127.0.1.1, as Debian's installer does."""
    def docker_exec(script: str) -> str:
        done = subprocess.run(["docker", "exec", NODE2, "sh", "-c", script], capture_output=True, text=True,
                              timeout=60, check=True)
        return done.stdout

    original = docker_exec("cat /etc/hosts")
    try:  # docker bind-mounts /etc/hosts: rewrite it in place, never replace the file
        docker_exec("sed 's/^10\\.213\\.0\\.12[[:space:]].*/127.0.1.1\\tnode2/' /etc/hosts > /tmp/hosts.lab "
                    "&& cat /tmp/hosts.lab > /etc/hosts && rm /tmp/hosts.lab")
        assert "127.0.1.1\tnode2" in docker_exec("cat /etc/hosts")
        diagnosis = diagnose(container_lab)
    finally:
        subprocess.run(["docker", "exec", "-i", NODE2, "sh", "-c", "cat > /etc/hosts"], input=original, text=True,
                       timeout=60, check=True)
    assert docker_exec("cat /etc/hosts") == original
    assert not diagnosis.ok and diagnosis.exit_code == ExitCode.CHECK_FAILED
    resolve = next(f for f in diagnosis.errors if f.check == "resolve")
    assert resolve.subject == "node2" and "127.0.1.1 (loopback)" in resolve.message
    assert "'10.213.0.12 node2'" in resolve.fix
    broken = sorted(pair for pair, link in diagnosis.mesh().items() if not link.ok)
    assert broken == [("node1", "node2"), ("node3", "node2"), ("node4", "node2")]
    assert any("node2" in line and "127.0.1.1" in line for line in hang_causes(diagnosis))


def test_a_probe_that_floods_is_read_within_bounds_and_its_events_still_count() -> None:
    """A host's probe (or what poses as one) printing a 40 MiB line with no end, then a valid event,
    and a flood on stderr: the doctor holds neither whole, and takes the event."""
    token = "t" * 16

    class Flooding:
        stdout = io.BufferedReader(io.BytesIO(b"x" * (40 << 20) + b"\n" + event_line(token, "runtime", python="3.11")
                                              .encode()))  # type: ignore[arg-type]
        stderr = io.BufferedReader(io.BytesIO(b"y" * (40 << 20) + b"\nthe last line\n"))  # type: ignore[arg-type]

        def kill(self) -> None:
            pass

    flooding = Flooding()
    tracemalloc.start()
    try:
        probe = _ProbeRun("h1", flooding, token)  # type: ignore[arg-type]
        assert probe.wait("runtime", time.monotonic() + 30) == {"python": "3.11"}
        probe.stop()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"reading the probe took {peak >> 20} MiB"  # (the lines are 40 MiB each)
    assert list(probe.stderr)[-1] == "the last line" and max(len(line) for line in probe.stderr) <= LINE_MAX
