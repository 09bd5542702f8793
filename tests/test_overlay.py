"""``lab net overlay``'s pure parts, run for real where they are shell: the mesh's plan, the scripts a
host's root runs (with a stand-in for ``wg``: this machine has no wireguard-tools), what ``wg show``
says, the doctor's reading of a large message that did not get through, and the overlay's
inventory key. The overlay itself, end to end, is in test_cross_vpc (the Docker tier)."""
from __future__ import annotations

import socket
import stat
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from lab.errors import InventoryError, LabError
from lab.inventory.hosts import inventory_text, load_inventory
from lab.net import overlay, wireguard
from lab.net.wireguard import Member, PeerState
from lab.netcheck.model import Master
from lab.netcheck.rules import analyse
from lab.rank.netfacts import Target
from lab.rank.probe import LARGE, Listener, check_link

from .conftest import Lab
from .test_doctor import flat_cluster, link

A = Member("node1", "10.99.0.11", "10.77.0.11", "KEY1=")
B = Member("node2", "10.99.0.12", "10.77.0.12", "KEY2=", port=51821)
FAKE_WG = """#!/bin/sh
case "$1" in
  genkey) echo PRIVATE-KEY ;;
  pubkey) read key; echo "public-of-$key" ;;
  show) printf 'PRIVATE-KEY\\tPUBLIC\\t51820\\toff\\n'
        printf 'KEY2=\\t(none)\\t10.99.0.12:51820\\t10.77.0.12/32\\t1764115200\\t1240\\t2480\\t25\\n' ;;
esac
"""


@pytest.fixture
def fake_wg(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "wg").write_text(FAKE_WG)
    (tmp_path / "bin" / "wg").chmod(0o755)
    return {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}


def sh(script: str, env: dict[str, str]) -> str:
    done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_plan_addresses_and_mtu() -> None:
    assert wireguard.member_addresses("10.77.0.0/24", 3) == ["10.77.0.11", "10.77.0.12", "10.77.0.13"]
    with pytest.raises(ValueError, match="holds at most 244 hosts"):
        wireguard.member_addresses("10.77.0.0/24", 245)
    assert wireguard.overlay_mtu([1500, 1500]) == 1420
    assert wireguard.overlay_mtu([1500, 1450]) == 1370  # the narrowest path counts
    assert wireguard.overlay_mtu([1300]) == wireguard.MIN_MTU


def test_the_configuration_names_every_peer_with_its_endpoint_keepalive_and_one_address() -> None:
    script = wireguard.configure_script(A, [B], 24, 1420, "/run/lab-wg/private.key")
    assert script.split(" && ") == [
        "wg set labwg0 private-key /run/lab-wg/private.key listen-port 51820 peer KEY2= endpoint "
        "10.99.0.12:51821 allowed-ips 10.77.0.12/32 persistent-keepalive 25",
        "ip address replace 10.77.0.11/24 dev labwg0",
        "ip link set labwg0 mtu 1420 up"]


def test_the_key_is_made_once_for_root_only_and_only_its_public_half_is_printed(
        tmp_path: Path, fake_wg: dict[str, str]) -> None:
    key = tmp_path / "wg" / "private.key"
    assert sh(wireguard.keygen_script(str(key)), fake_wg) == "public-of-PRIVATE-KEY\n"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_text() == "PRIVATE-KEY\n"
    key.write_text("KEPT\n")
    assert sh(wireguard.keygen_script(str(key)), fake_wg) == "public-of-KEPT\n"  # a second up keeps it


class Saying(overlay.End):
    """An end whose shell says, to each script in turn, the next of ``answers``."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__("node3", "10.0.0.3")
        self.answers, self.scripts = answers, 0

    def sh(self, script: str) -> str:
        self.scripts += 1
        return self.answers.pop(0)

    def start(self) -> None:
        raise NotImplementedError

    def set_hosts(self, script: str) -> None:
        raise NotImplementedError

    def remove(self) -> bool:
        raise NotImplementedError


KEY = "x" * 42 + "Y="  # (a WireGuard key's shape: 43 base64 digits and its =)


def test_a_public_key_whose_reading_came_back_empty_is_read_again_and_none_at_all_is_the_hosts_error() -> None:
    """An engine's exec can lose a short command's output (docker-py #2042): seen as a peer with an
    empty key on another host ("Key is not the correct length or format"), where the host's own
    failure, or its key, was due."""
    lost_once = Saying(["", f"{KEY}\n"])
    assert overlay.public_key(lost_once) == KEY and lost_once.scripts == 2
    said = r"^host node3: no WireGuard public key could be read from it \(it said 'oops'\)$"
    with pytest.raises(LabError, match=said):
        overlay.public_key(Saying(["", "", "oops"]))


def test_an_ends_state_whose_reading_came_back_empty_is_read_again() -> None:
    """The same lost output, as the overlay came up: a host read with no key was left out of the
    ends `overlay up` returned, and writing the overlay's inventory raised KeyError for it."""
    state = f"key {KEY}\naddress 10.77.0.13/24\nmtu 1420\n"
    [found] = overlay.show([Saying(["key \naddress \nmtu \n", state])])
    assert (found.host, found.public_key, found.address, found.mtu) == ("node3", KEY, "10.77.0.13/24", 1420)
    assert overlay.show([Saying(["key \naddress \nmtu \n"] * overlay.KEY_READS)]) == []  # (it has none)


def test_show_never_prints_the_private_key_and_its_peers_are_read(fake_wg: dict[str, str]) -> None:
    out = sh(wireguard.show_script(), fake_wg)
    assert "PRIVATE" not in out
    assert wireguard.parse_peers(out) == [PeerState("KEY2=", "10.99.0.12:51820", 1764115200, 1240, 2480)]
    assert PeerState("K", "(none)", 0, 0, 0).age() is None
    assert PeerState("K", "x", 1000, 0, 0).age(now=1030) == 30


def test_the_overlay_names_its_addresses_in_both_forms_and_takes_them_away(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.10.0.11 node1\n")
    env = {"PATH": "/usr/bin:/bin"}
    for _ in range(2):  # a second up replaces its lines
        sh(wireguard.hosts_script([A, B], hosts=str(hosts)), env)
    assert hosts.read_text().splitlines() == [
        "127.0.0.1 localhost", "10.10.0.11 node1",
        "10.77.0.11 node1-labwg0 # lab-overlay", "::ffff:10.77.0.11 node1-labwg0 # lab-overlay",
        "10.77.0.12 node2-labwg0 # lab-overlay", "::ffff:10.77.0.12 node2-labwg0 # lab-overlay"]
    sh(wireguard.hosts_script([], hosts=str(hosts)), env)
    assert hosts.read_text() == "127.0.0.1 localhost\n10.10.0.11 node1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts"]


def test_a_large_message_gets_through_a_real_listener_and_one_nobody_reads_is_reported() -> None:
    listener = Listener("b", "token", 0, 2.0)
    try:
        passed = check_link(Target("mesh", "b", "127.0.0.1", listener.port), "a", "token", 2.0)
    finally:
        listener.close(wait=2.0)
    assert passed.ok and passed.large_error is None

    with socket.create_server(("127.0.0.1", 0)) as server:  # answers the handshake, then reads nothing
        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b'{"name": "b", "seen": "127.0.0.1"}\n')
                threading.Event().wait(2.0)
        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        stuck = check_link(Target("mesh", "b", "127.0.0.1", server.getsockname()[1]), "a", "token", 0.5)
        thread.join()
    assert stuck.ok and stuck.large_error == f"a {LARGE // 1024} KiB message did not arrive within 0.5s"
    assert stuck.large_acked is not None and stuck.large_acked > 0  # the kernel took it: slow, not lost


def test_the_doctor_names_the_black_hole_once_with_the_host_every_pair_has() -> None:
    reports = flat_cluster()
    lost = "a 64 KiB message did not arrive within 5s"
    for r in reports:
        r.links = tuple(replace(each, large_error=lost, large_acked=0, large_resent=6)
                        if "c" in (r.name, each.target.peer) else each for each in r.links)
    findings = analyse(reports, Master("a", "10.0.0.1", 40000))
    mtu = [f for f in findings if f.check == "mtu"]
    assert [(f.severity, f.subject) for f in mtu] == [("error", "c")]
    assert mtu[0].message == (f"small messages pass but large ones do not: {lost}, none of its bytes acknowledged "
                              "(a -> c; b -> c; c -> a; c -> b): every such pair has c")
    slow = flat_cluster()
    slow[0].links = (replace(link("mesh", "b", "10.0.0.2"), large_error=lost, large_acked=4096),)
    assert [(f.severity, f.subject) for f in analyse(slow, Master("a", "10.0.0.1", 40000)) if f.check == "mtu"] == [
        ("warning", "a -> b")]
    # none acknowledged, but nothing sent again either: no word from the network that it lost any (a
    # sender that was not scheduled in time), so no black hole
    unsent = flat_cluster()
    unsent[0].links = (replace(link("mesh", "b", "10.0.0.2"), large_error=lost, large_acked=0, large_resent=0),)
    assert [(f.severity, f.subject) for f in analyse(unsent, Master("a", "10.0.0.1", 40000)) if f.check == "mtu"] == [
        ("warning", "a -> b")]


def test_an_inventory_names_its_overlay_and_a_bad_one_is_refused_at_its_line(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n    node1:\n      overlay: xvpc\n    node2:\n      overlay: Not_A_Lab\n")
    with pytest.raises(InventoryError, match=r"inventory.yaml:6: .*overlay.*a lab's name"):
        load_inventory(str(inventory))
    inventory.write_text("all:\n  hosts:\n    node1:\n      overlay: xvpc\n")
    assert load_inventory(str(inventory)).hosts[0].overlay == "xvpc"


@pytest.mark.parametrize("args, message", [
    (("--subnet", "10.77.0.0/28"), "--subnet: 10.77.0.0/28: the overlay needs a private IPv4 network of a /24 or more"),
    (("--subnet", "8.8.8.0/24"), "--subnet: 8.8.8.0/24: the overlay needs a private IPv4 network of a /24 or more"),
    (("--mtu", "100"), "lab: error: --mtu 100: from 1280 to 9000"),
])
def test_bad_overlay_options_are_one_line(lab: Lab, args: tuple[str, ...], message: str) -> None:
    result = lab("net", "overlay", "up", *args)
    assert result.code == 2 and message in result.err and result.err.count("\n") <= 2, result.err


def test_a_host_without_wireguard_and_without_apt_get_is_told_what_to_install(tmp_path: Path) -> None:
    """The kernel has no WireGuard (``ip link add`` fails) and nothing can install wireguard-go."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("wg", "exit 0"), ("ip", "echo 'Error: Unknown device type.' >&2; exit 2")):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    for tool in ("mkdir", "sed", "grep", "tail"):
        (bin_dir / tool).symlink_to(f"/bin/{tool}" if Path(f"/bin/{tool}").exists() else f"/usr/bin/{tool}")
    done = subprocess.run(["/bin/sh", "-c", wireguard.host_start_script(key_dir=str(tmp_path / "keys"))],
                          env={"PATH": str(bin_dir)}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["wireguard-go is not installed and apt-get could not install it (Debian: "
                                        "apt-get install wireguard-go)"]
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700


def test_become_is_read_as_ansible_writes_it(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  vars: {ansible_become: 'yes'}\n  hosts:\n    a: {}\n    b: {ansible_become: false}\n")
    assert [h.become for h in load_inventory(str(inventory)).hosts] == [True, False]
    inventory.write_text("all:\n  hosts:\n    a:\n      ansible_become: maybe\n")
    with pytest.raises(InventoryError, match=r"inventory.yaml:4: .*ansible_become must be true or false, got 'maybe'"):
        load_inventory(str(inventory))


def test_the_overlays_inventory_is_the_hosts_as_read_with_their_overlay_addresses(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("key")
    key.chmod(0o600)
    source = tmp_path / "vms.yaml"
    source.write_text("all:\n  vars: {ansible_user: ops, ansible_become: true, ansible_ssh_private_key_file: id}\n"
                      "  hosts:\n    a: {ansible_host: 192.0.2.1, slots: 2}\n    b: {ansible_host: 192.0.2.2, "
                      "ansible_port: 2222}\ngpu:\n  hosts:\n    b:\n")
    read = load_inventory(str(source))
    written = tmp_path / "elsewhere" / "vms.overlay.yaml"
    written.parent.mkdir()
    written.write_text(inventory_text(read.hosts, "about", {"a": {"data_address": "10.77.0.11"},
                                                             "b": {"data_address": "10.77.0.12"}}))
    again = load_inventory(str(written))
    strip = ("source", "data_address")
    assert [{k: v for k, v in vars(h).items() if k not in strip} for h in again.hosts] == [
        {k: v for k, v in vars(h).items() if k not in strip} for h in read.hosts]
    assert [h.data_address for h in again.hosts] == ["10.77.0.11", "10.77.0.12"]
    assert again.hosts[1].groups == ("gpu",) and again.hosts[0].key_file == str(key)


def test_what_wireguard_go_said_is_its_error_without_its_banner() -> None:
    log = ("┌──────┐\n│   Running wireguard-go is not required   │\n└──────┘\n"
           "ERROR: (labwg0) 2026/11/26 00:21:48 Failed to create TUN device: invalid argument\n")
    assert wireguard.wireguard_go_said(log) == "Failed to create TUN device: invalid argument"
    assert wireguard.wireguard_go_said("INFO: (labwg0) starting\n") == "INFO: (labwg0) starting"
    assert wireguard.wireguard_go_said("") == ""
