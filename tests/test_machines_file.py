"""A lab across machines before anything starts: machines.yaml read and checked (each error with
its line), the hosts placed over the machines, `run all` on hosts that share no directory, and
the command line's refusals. No engine and no machine needed (tests/test_machines.py has them)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from lab.containerlab import machines_lab, state
from lab.containerlab.engine import EngineError
from lab.containerlab.engine_lab import EngineLab
from lab.containerlab.labs import find_lab
from lab.containerlab.lifecycle import UpRequest
from lab.containerlab.machines import Machine, load_machines
from lab.containerlab.machines_lab import MachinesLab, Spread, place
from lab.core.plan import Options
from lab.core.planner import without_unshared
from lab.errors import InventoryError, UsageError
from lab.inventory.model import Host
from lab.suite import registry

from .conftest import REPO


def machines_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "machines.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_machines_file_reads_like_an_inventory(tmp_path: Path) -> None:
    key = tmp_path / "id"
    key.write_text("key\n")
    key.chmod(0o600)
    certs = tmp_path / "certs"
    certs.mkdir()
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (certs / name).write_text("x")
    found = load_machines(str(machines_file(tmp_path, """\
        all:
          vars: {ansible_user: admin, ansible_ssh_private_key_file: id}
          children:
            gpus:
              hosts:
                gpu1: {ansible_host: 10.0.0.5}
                gpu2: {ansible_host: 10.0.0.6, lab_hosts: 2, ansible_port: 2200}
          hosts:
            tls: {docker_host: "tcp://10.0.0.7:2376", docker_cert_path: certs, lab_hosts: 0}
            viassh: {docker_host: "ssh://ops@10.0.0.8:2022"}
        """)))
    by_name = {m.name: m for m in found}
    assert by_name["gpu1"] == Machine("gpu1", "10.0.0.5", 22, "admin", str(key), source=by_name["gpu1"].source)
    assert (by_name["gpu2"].port, by_name["gpu2"].lab_hosts) == (2200, 2)
    assert (by_name["tls"].cert_path, by_name["tls"].lab_hosts, by_name["tls"].address) == (str(certs), 0, "10.0.0.7")
    ssh = by_name["viassh"].ssh_host()  # docker_host's user and port win for the SSH login
    assert (ssh.address, ssh.port, ssh.user) == ("10.0.0.8", 2022, "ops")
    assert by_name["gpu1"].source.endswith("machines.yaml:6")


@pytest.mark.parametrize("text, line, words", [
    ("all:\n  hosts:\n    a: {docker_host: 'tcp://10.0.0.7:2376'}\n", 3, "needs docker_cert_path (TLS)"),
    ("all:\n  hosts:\n    a: {docker_host: 'http://10.0.0.7'}\n", 3, "ssh://[USER@]HOST[:PORT] or tcp://HOST:PORT"),
    ("all:\n  hosts:\n    a: {docker_host: 'ssh://x; rm -rf /'}\n", 3, "ssh://[USER@]HOST[:PORT]"),
    ("all:\n  hosts:\n    a: {docker_host: 'ssh://h:abc'}\n", 3, "a port from 1 to 65535"),
    ("all:\n  hosts:\n    a: {docker_host: 'tcp://h:99999', docker_cert_path: /x}\n", 3, "a port from 1 to 65535"),
    ("all:\n  hosts:\n    a: {docker_cert_path: /nonexistent}\n", 3, "ca.pem, cert.pem, key.pem missing"),
    ("all:\n  hosts:\n    a: {lab_hosts: -1}\n", 3, "lab_hosts must be an integer >= 0"),
    ("all:\n  hosts:\n    a: {slots: 2}\n", 3, "invalid slots '2' (a variable of a lab's hosts, not of a machine"),
    ("all:\n  hosts:\n    a: {lab_hosts: 0}\n", None, "every machine has lab_hosts: 0"),
])
def test_a_bad_machines_file_is_one_error_naming_its_line(tmp_path: Path, text: str, line: int | None,
                                                          words: str) -> None:
    with pytest.raises(InventoryError) as caught:
        load_machines(str(machines_file(tmp_path, text)))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'machines.yaml'}{f':{line}' if line else ''}:"), message
    assert words in message and "\n" not in message, message


def machine(name: str, lab_hosts: int | None = None) -> Machine:
    return Machine(name, name, lab_hosts=lab_hosts)


@pytest.mark.parametrize("fixed, wanted, network, expected", [
    ((None, None), None, "overlay", ("m1", "m2")),  # one host per machine
    ((None, None), 5, "overlay", ("m1", "m1", "m1", "m2", "m2")),  # evenly, the first ones first
    ((2, None), 5, "overlay", ("m1", "m1", "m2", "m2", "m2")),  # lab_hosts, the rest shared
    ((0, None), 3, "overlay", ("m2", "m2", "m2")),  # none on m1
    ((2, 1), None, "overlay", ("m1", "m1", "m2")),
    ((None, 0), None, "host", ("m1",)),
    ((None, None), None, "host", ("m1", "m2")),
])
def test_hosts_are_placed_in_blocks_in_the_files_order(fixed: tuple[int | None, ...], wanted: int | None,
                                                       network: str, expected: tuple[str, ...]) -> None:
    machines = [machine(f"m{i + 1}", n) for i, n in enumerate(fixed)]
    assert place(machines, wanted, network) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("fixed, wanted, network, words", [
    ((2, 2), 5, "overlay", "--hosts 5: the machines file places 4 host(s) with lab_hosts"),
    ((3, None), 2, "overlay", "--hosts 2: the machines file places 3 host(s)"),
    ((None, None), 3, "host", "--network host runs one host per machine (2 here)"),
    ((2, None), None, "host", "--network host runs one host per machine"),
])
def test_a_placement_that_cannot_be_is_refused(fixed: tuple[int | None, ...], wanted: int | None, network: str,
                                               words: str) -> None:
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        place([machine(f"m{i + 1}", n) for i, n in enumerate(fixed)], wanted, network)  # type: ignore[arg-type]


def test_the_labels_of_a_spread_lab() -> None:
    spread = Spread("class", ("m1", "m1", "m2"), "overlay", subnet="10.215.3.0/24")
    assert spread.labels(3)["lab.machine"] == "m2" and "lab.ssh_port" not in spread.labels(3)
    assert Spread("class", ("m1",), "host", ssh_port=2223).labels(1)["lab.ssh_port"] == "2223"


def test_a_lab_is_across_the_machines_given_else_those_its_up_recorded_else_on_the_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(state.STATE_VAR, str(tmp_path / "state"))
    inventory = str(tmp_path / "class.inventory.yaml")
    assert find_lab("class", inventory) == EngineLab("class", Path(inventory))
    assert find_lab("class", inventory, "m.yaml") == MachinesLab("class", Path(inventory), "m.yaml")
    record = state.write(state.lab_dir("class") / "machines", b"/site/machines.yaml\n")
    found = find_lab("class", inventory)
    assert found == MachinesLab("class", Path(inventory), "/site/machines.yaml", given=False)
    assert found.across_machines and found.paths.machines_record == record
    with pytest.raises(UsageError, match="lab class is across the machines of /site/machines.yaml: "):
        found.up(UpRequest(), print, print)  # (`lab up` without --machines is for this machine's engine)
    assert find_lab("class", inventory, "other.yaml") == MachinesLab("class", Path(inventory), "other.yaml")


def test_run_all_leaves_out_the_file_rendezvous_where_hosts_share_no_directory() -> None:
    everything = Options(tuple(registry.select(["all"])))
    apart = [Host("a", "10.0.0.1"), Host("b", "10.0.0.2")]
    kept, left_out = without_unshared(everything, apart)
    assert [e.name for e in left_out] == ["init-file"]
    assert [e.name for e in kept.exercises] == [e.name for e in everything.exercises if e.name != "init-file"]
    shared = [Host("a", "10.0.0.1", shared_dir="/nfs"), Host("b", "10.0.0.2", shared_dir="/nfs")]
    assert without_unshared(everything, shared) == (everything, ())


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent.sock"})


@pytest.mark.parametrize("args, message", [
    (("up", "--network", "host"), "--network and --accept-new-host-keys are for a lab across --machines"),
    (("up", "--machines", "m.yaml", "--topology", "cross-vpc"), "--machines starts a plain lab"),
    (("up", "--machines", "/nonexistent/machines.yaml"), "/nonexistent/machines.yaml: file not found"),
    (("down", "--all", "--machines", "m.yaml"), "--all is for the labs on this machine's engine"),
])
def test_the_command_line_refuses_what_a_lab_across_machines_cannot_do(args: tuple[str, ...], message: str) -> None:
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"lab: error: {message}" or message in done.stderr.strip().splitlines()[-1], \
        done.stderr


def test_a_docker_calls_failure_is_one_line_and_a_tls_one_names_its_cause() -> None:
    from docker.errors import APIError
    from requests.exceptions import SSLError

    from lab.containerlab.engine import reason

    buried = SSLError("HTTPSConnectionPool(host='10.0.0.7', port=2376): Max retries exceeded with url: /v1.41/info "
                      "(Caused by SSLError(SSLError(1, '[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca "
                      "(_ssl.c:2580)')))")
    assert reason(buried) == "TLS: tlsv1 alert unknown ca"
    assert reason(APIError("500 Server Error", explanation="network lab-net not found\nmore")) == \
        "network lab-net not found"
    assert reason(OSError("x" * 400)) == "x" * 300


class _Gossip:
    """A machine's engine whose overlay listing learns one more endpoint each time it is read, up
    to ``learns`` (then no more news): the Swarm's gossip as `docker network inspect -v` shows it."""

    def __init__(self, name: str, endpoints: list[str], learns: int) -> None:
        self.name, self.endpoints, self.learns, self.reads = name, endpoints, learns, 0
        self.client = SimpleNamespace(api=SimpleNamespace(inspect_network=self.inspect_network))

    def inspect_network(self, network: str, verbose: bool) -> dict[str, object]:
        assert (network, verbose) == ("gtest-overlay", True)
        self.reads += 1
        tasks = [{"EndpointIP": a} for a in self.endpoints[:min(self.reads, self.learns)]]
        return {"Containers": {}, "Services": {"": {"Tasks": tasks}}}


def test_the_overlay_is_waited_for_while_the_swarm_tells_the_machines_of_hosts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait ends when every machine lists every host, however long the gossip takes while it
    moves; with no news for GOSSIP_WAIT it names what each machine lacks (no stopwatch on a host)."""
    clock = iter(range(0, 10_000, 10))  # 10 s between reads: slower than GOSSIP_WAIT allows at once
    monkeypatch.setattr(machines_lab.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(machines_lab.time, "sleep", lambda seconds: None)
    spread = Spread("gtest", ("m1", "m2"), "overlay")
    addresses = {"node1": "10.215.0.2", "node2": "10.215.0.3"}
    slow = [_Gossip("m1", ["10.215.0.2", "10.215.0.3"], learns=2), _Gossip("m2", ["10.215.0.3", "10.215.0.2"], 2)]
    machines_lab._wait_for_gossip(slow, spread, addresses)
    assert [m.reads for m in slow] == [2, 2]
    stuck = [_Gossip("m1", ["10.215.0.2", "10.215.0.3"], learns=2), _Gossip("m2", ["10.215.0.3", "10.215.0.2"], 1)]
    with pytest.raises(EngineError) as failed:
        machines_lab._wait_for_gossip(stuck, spread, addresses)
    assert str(failed.value).startswith("the Swarm did not tell every machine of the hosts on gtest-overlay "
                                        "(machine m2 does not know node1 (10.215.0.2); no news in 90s)"), failed.value
    assert stuck[1].reads > machines_lab.GOSSIP_WAIT / 10
