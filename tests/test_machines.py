"""A lab across Docker machines, for real: two "machines" (containers each running their own
dockerd and sshd, tests/machines.py) reached over SSH by the lab, joined in a Swarm by
``lab up --machines``, the lab image sent to each by docker save | load, lab hosts on both,
real torch.distributed across them.

The tests run in file order on one lab: up, runs, a second lab in host mode, a machine
killed mid-run and brought back, then ``down``; then a Swarm the machines were in before the
lab. Under CI=true they run (the engine is installed and started when missing); elsewhere
they skip with the reason when no engine can be had.
"""
from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lab.containerlab import engine, state, topology
from lab.containerlab.swarm import JOINED_LABEL
from lab.errors import ExitCode

from . import machines
from .conftest import HOST_PROCESSES, Lab, Result, run_processes

pytestmark = pytest.mark.machines
LAB = "mtest"  # the lab across the machines (overlay network)
HOST_LAB = "mtest-host"  # the one in --network host
URL_LAB = "mtest-urls"  # the one whose machines are named by docker_host URLs
PREFIX = "lab-test-machine"  # the machines' containers: lab-test-machine-m1, -m2


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[machines.Machines]:
    """Two Docker machines, m1 and m2, in no Swarm, and the machines.yaml naming them."""
    try:
        if os.environ.get("CI") == "true":
            client = engine.ensure_engine(lambda message: print(f"lab: {message}"))
        else:
            client = engine.client()
    except engine.EngineError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no Docker engine: {exc}")
    machines.remove(client, PREFIX)
    _forget_labs()
    tag = machines.build(client, state.home())
    found = machines.start(client, tag, PREFIX, 2, tmp_path_factory.mktemp("machines"))
    yield found
    machines.remove(client, PREFIX)
    _forget_labs()


def _forget_labs() -> None:
    """The records of this module's labs, whose machines are gone once the test machines are (a
    run stopped half way, or a lab a failed test could not take down, leaves one naming them)."""
    for name in (LAB, HOST_LAB, URL_LAB, "mtest-bad", "mtest-fail"):
        shutil.rmtree(state.lab_dir(name), ignore_errors=True)


class Spread:
    """The lab across the two machines: the CLI on it, and what the machines hold."""

    def __init__(self, two: machines.Machines, workdir: Path) -> None:
        self.machines = two
        self.inventory = workdir / f"{LAB}.inventory.yaml"
        self.cli = Lab()
        self.up_output = ""

    def __call__(self, *args: str, timeout: float = 600) -> Result:
        return self.cli(*args, timeout=timeout)

    def up(self, *extra: str) -> Result:
        return self("up", "--machines", str(self.machines.file), "--name", LAB, "--inventory", str(self.inventory),
                    *extra, timeout=1500)

    def down(self) -> Result:
        return self("down", "--name", LAB)

    def hosts(self) -> dict[str, dict]:
        return yaml.safe_load(self.inventory.read_text())["all"]["hosts"]

    def containers(self, machine: str, lab: str | None = LAB) -> list[str]:
        """The lab's containers on the machine (lab None: every lab's)."""
        label = topology.LABEL if lab is None else f"{topology.NAME_LABEL}={lab}"
        done = self.machines.docker(machine, "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}")
        assert done.returncode == 0, done.stderr
        return sorted(done.stdout.split())

    def lab_networks(self, machine: str) -> list[str]:
        done = self.machines.docker(machine, "network", "ls", "--filter", f"label={topology.LABEL}", "--format",
                                    "{{.Name}}")
        return sorted(done.stdout.split())

    def ranks_in(self, machine: str, container: str) -> list[str]:
        return run_processes(self.machines.docker(machine, "exec", container, *HOST_PROCESSES).stdout)

    def swarm(self, machine: str) -> str:
        return self.machines.docker(machine, "info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()

    def node_labels(self, manager: str) -> dict[str, dict]:
        """hostname -> the labels of its Swarm node, as the manager lists them."""
        done = self.machines.docker(manager, "node", "ls", "--format", "{{.ID}}")
        nodes = {}
        for node_id in done.stdout.split():
            node = json.loads(self.machines.docker(manager, "node", "inspect", node_id).stdout)[0]
            nodes[node["Description"]["Hostname"]] = node["Spec"].get("Labels") or {}
        return nodes


@pytest.fixture(scope="module")
def spread(two: machines.Machines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spread]:
    """The lab LAB up across the machines: 4 hosts, 2 on each."""
    lab = Spread(two, tmp_path_factory.mktemp("spread"))
    result = lab.up("--hosts", "4")
    assert result.code == 0, result.text[-4000:]
    lab.up_output = result.out
    yield lab
    lab.down()
    lab("down", "--name", HOST_LAB, "--machines", str(two.file))


def test_up_joins_the_machines_in_a_swarm_and_sends_the_image_once(spread: Spread) -> None:
    out = spread.up_output
    assert "machine m1: starting a swarm there" in out and "machine m2: joining the swarm of m1" in out, out
    assert out.count("sending image lab-host:") == 2 and "PASS    p2p" in out, out
    assert (spread.swarm("m1"), spread.swarm("m2")) == ("active", "active")
    assert {name: labels.get(JOINED_LABEL) for name, labels in spread.node_labels("m1").items()} == {
        "m1": "1", "m2": "1"}
    assert {name: h["machine"] for name, h in spread.hosts().items()} == {
        "node1": "m1", "node2": "m1", "node3": "m2", "node4": "m2"}
    addresses = [ipaddress.ip_address(h["data_address"]) for h in spread.hosts().values()]
    subnet = ipaddress.ip_network(f"{addresses[0]}/24", strict=False)
    assert len(set(addresses)) == 4 and all(a in subnet for a in addresses), addresses
    again = spread.up("--hosts", "4", "--no-smoke")  # everything there already: nothing sent, nothing restarted
    assert again.code == 0 and "sending image" not in again.out and "starting" not in again.out, again.text


def test_a_second_up_with_other_hosts_or_limits_removes_and_remakes_what_differs(spread: Spread) -> None:
    """Two hosts instead of four (one a machine), with another memory limit: the hosts no longer
    wanted where they are go, the kept one is made anew for its limit, each at an address no host had
    (one just freed is what Docker's overlay gets wrong); then four again."""
    before = {name: h["data_address"] for name, h in spread.hosts().items()}
    fewer = spread.up("--hosts", "2", "--memory", "2048")
    assert fewer.code == 0 and "PASS    p2p" in fewer.out, fewer.text[-3000:]
    after = {name: h["data_address"] for name, h in spread.hosts().items()}
    assert after.keys() == {"node1", "node2"} and not set(after.values()) & set(before.values()), (before, after)
    assert "machine m1: removing mtest-node2 (not in this lab's 2 host(s) there)" in fewer.out, fewer.out
    assert "host node1: making mtest-node1 anew: its memory limit is 4096 MB, not 2048" in fewer.out, fewer.out
    assert (spread.containers("m1"), spread.containers("m2")) == (["mtest-node1"], ["mtest-node2"])
    back = spread.up("--hosts", "4", "--no-smoke")
    assert back.code == 0, back.text[-3000:]
    assert (spread.containers("m1"), spread.containers("m2")) == (["mtest-node1", "mtest-node2"],
                                                                  ["mtest-node3", "mtest-node4"])


def test_run_all_passes_with_ranks_on_both_machines(spread: Spread) -> None:
    result = spread("run", "all", "--hosts", str(spread.inventory), "--json")
    report = json.loads(result.out)
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (result.code, failed) == (0, {}), result.err[-3000:]
    assert [r["hostname"] for r in report["ranks"]] == ["node1", "node2", "node3", "node4"]
    assert "init-file is left out of `run all`" in result.err  # (no directory every host mounts)
    for machine, containers in (("m1", ("mtest-node1", "mtest-node2")), ("m2", ("mtest-node3", "mtest-node4"))):
        for c in containers:
            assert spread.ranks_in(machine, c) == [], c


def test_status_ls_and_the_doctor_name_each_hosts_machine(spread: Spread) -> None:
    status = spread("status", "--name", LAB)
    assert status.code == 0 and status.out.count("answers") == 4, status.text
    rows = [line for line in status.out.splitlines() if "mtest-node" in line]
    assert [row.split()[1] for row in rows] == ["m1", "m1", "m2", "m2"], status.out
    doctor = spread("doctor", "--hosts", str(spread.inventory), "--json")
    diagnosis = json.loads(doctor.out)
    assert doctor.code == 0 and diagnosis["ok"], doctor.out[-3000:]
    assert {h["name"]: h["machine"] for h in diagnosis["hosts"]} == {
        "node1": "m1", "node2": "m1", "node3": "m2", "node4": "m2"}


def test_a_class_graded_across_the_machines(spread: Spread, tmp_path: Path) -> None:
    from .test_grade import CLASS, read_grades

    submissions = tmp_path / "class"
    submissions.mkdir()
    expected = {"alice": "pass", "bob": "fail", "ivan": "fail"}
    for student in expected:
        (submissions / f"{student}.py").write_text((CLASS / f"{student}.py").read_text())
    result = spread("grade", str(submissions), "--exercise", "ring-allreduce", "--hosts", str(spread.inventory),
                    "--parallel", "2", "--timeout", "30", "--out", str(tmp_path / "book"))
    assert result.code == 0, result.text[-4000:]
    grades = read_grades(tmp_path / "book")
    assert {s: grades[s]["verdict"] for s in expected} == expected, grades
    assert "called all_reduce" in grades["ivan"]["reason"]


def test_a_host_mode_lab_stands_beside_on_the_machines_own_addresses(spread: Spread, tmp_path: Path) -> None:
    inventory = tmp_path / "host.inventory.yaml"
    result = spread("up", "--machines", str(spread.machines.file), "--name", HOST_LAB, "--network", "host",
                    "--inventory", str(inventory))
    assert result.code == 0 and "PASS    p2p" in result.out, result.text[-3000:]
    hosts = yaml.safe_load(inventory.read_text())["all"]["hosts"]
    addresses = spread.machines.addresses
    assert {name: (h["machine"], h["ansible_host"], h["data_address"], h["ansible_port"])
            for name, h in hosts.items()} == {
        "node1": ("m1", addresses["m1"], addresses["m1"], 2222),
        "node2": ("m2", addresses["m2"], addresses["m2"], 2222)}
    down = spread("down", "--name", HOST_LAB)  # (the machines as recorded)
    assert down.code == 0, down.text
    assert spread.containers("m1", HOST_LAB) == spread.containers("m2", HOST_LAB) == []
    assert spread.containers("m1") == ["mtest-node1", "mtest-node2"]  # the other lab is untouched


def test_engines_named_by_docker_host_urls_ssh_and_tcp_with_tls(spread: Spread, tmp_path: Path) -> None:
    """m1's engine by ``ssh://root@ADDRESS`` (the Docker SDK over the lab's SSH), m2's by
    ``tcp://ADDRESS:2376`` with TLS: a second overlay lab on the Swarm the first one made, p2p
    across, down leaving the first lab and the Swarm; then a certificate of another CA is
    refused in one line naming the machine, before anything starts."""
    m = spread.machines
    key, known = m.file.parent / "machine_key", m.file.parent / "machines_known_hosts"

    def machines_file(cert_path: Path) -> Path:
        path = tmp_path / f"{cert_path.name}.yaml"
        path.write_text(f"all:\n  vars: {{ansible_user: root, ansible_ssh_private_key_file: {key}, "
                        f"ssh_known_hosts_file: {known}}}\n  hosts:\n"
                        f"    m1: {{docker_host: 'ssh://root@{m.addresses['m1']}:22'}}\n"
                        f"    m2: {{docker_host: 'tcp://{m.addresses['m2']}:{machines.TLS_PORT}', "
                        f"docker_cert_path: {cert_path}}}\n")
        return path

    inventory = tmp_path / "urls.inventory.yaml"
    up = spread("up", "--machines", str(machines_file(m.tls)), "--name", URL_LAB, "--hosts", "2",
                "--inventory", str(inventory))
    assert up.code == 0 and "PASS    p2p" in up.out, up.text[-3000:]
    assert "starting a swarm" not in up.out and "joining the swarm" not in up.out, up.out  # (in it already)
    assert f"machine m2 ({m.addresses['m2']}): Docker" in up.out, up.out
    hosts = yaml.safe_load(inventory.read_text())["all"]["hosts"]
    assert {name: h["machine"] for name, h in hosts.items()} == {"node1": "m1", "node2": "m2"}
    assert spread("down", "--name", URL_LAB).code == 0
    assert spread.containers("m2", URL_LAB) == [] and spread.containers("m2") == ["mtest-node3", "mtest-node4"]
    assert (spread.swarm("m1"), spread.swarm("m2")) == ("active", "active")  # (the first lab still uses it)

    machines.certificates(tmp_path / "strangers", {})  # a client certificate of a CA the engines do not know
    refused = spread("up", "--machines", str(machines_file(tmp_path / "strangers")), "--name", URL_LAB,
                     "--inventory", str(inventory))
    assert refused.code == 3 and "Traceback" not in refused.text, refused.text
    last = refused.err.strip().splitlines()[-1]
    assert last.startswith(f"lab: error: machine m2: its Docker engine does not answer at tcp://{m.addresses['m2']}"
                           f":{machines.TLS_PORT}: "), refused.err
    assert spread.containers("m1", URL_LAB) == [], refused.text


def test_an_unreachable_machine_is_one_line_and_nothing_starts_elsewhere(spread: Spread, tmp_path: Path) -> None:
    machines_file = tmp_path / "machines.yaml"
    machines_file.write_text(spread.machines.file.read_text() + "    m3: {ansible_host: 127.0.0.1, ansible_port: 1}\n")
    result = spread("up", "--machines", str(machines_file), "--name", "mtest-bad", "--inventory",
                    str(tmp_path / "bad.inventory.yaml"))
    assert result.code == 3, result.text
    assert result.err.strip().splitlines()[-1] == "lab: error: machine m3 (127.0.0.1:1): cannot connect: " \
                                                  "Connection refused", result.err
    assert spread.containers("m1", "mtest-bad") == spread.containers("m2", "mtest-bad") == []
    assert not (state.lab_dir("mtest-bad") / "machines").exists()


def test_a_machine_killed_mid_run_fails_the_run_in_one_line_and_leaves_nothing(spread: Spread,
                                                                                tmp_path: Path) -> None:
    script = tmp_path / "steady.py"
    script.write_text("import time, torch, torch.distributed as dist\n"
                      "dist.init_process_group('gloo')\n"
                      "print('ranks connected', flush=True)\n"
                      "for _ in range(600):\n    dist.all_reduce(torch.ones(1)); time.sleep(0.1)\n")
    job = spread.cli.popen("launch", "--hosts", str(spread.inventory), "--timeout", "120", str(script))
    try:
        assert job.stdout is not None
        for line in job.stdout:
            if "ranks connected" in line:
                break
        killed = time.monotonic()
        assert machines.kill(spread.machines, "m2").returncode == 0
        out = job.communicate(timeout=120)[0]
        assert job.returncode == 3 and time.monotonic() - killed < 45, out
        errors = [line for line in out.splitlines() if line.startswith("lab: error:")]
        assert len(errors) == 1 and "on machine m2" in errors[0] and "lost" in errors[0], out
    finally:
        job.kill()
        job.wait()
    for c in ("mtest-node1", "mtest-node2"):  # the ranks on the machine still up were stopped
        assert spread.ranks_in("m1", c) == [], c
    machines.restart(spread.machines, "m2")
    back = spread.up("--hosts", "4")  # its hosts made again, in the Swarm it rejoined
    assert back.code == 0 and "PASS    p2p" in back.out and "starting mtest-node3" in back.out, back.text[-3000:]


def test_down_leaves_every_engine_clean_and_no_swarm(spread: Spread) -> None:
    result = spread.down()
    assert result.code == 0 and f"lab {LAB} is down on every machine" in result.out, result.text
    for m in ("m1", "m2"):
        assert (spread.containers(m, None), spread.lab_networks(m), spread.swarm(m)) == ([], [], "inactive"), m
    again = spread.down()
    assert again.code == 0 and "nothing to remove" in again.out, again.text


def test_a_lab_up_that_fails_on_one_machine_removes_what_it_started_on_all(spread: Spread, tmp_path: Path) -> None:
    """Two ways a `lab up` fails on m2: one line names the host and the machine, and the host it
    started on m1, the overlay network and the Swarm it made are gone.
    - A container of another's named as the lab's second host would be: found before any host
      starts, and left be.
    - m2's copy of the lab image is broken (no command to run): m1's host was made at the same
      time as m2's failed, and is removed."""
    m = spread.machines
    up = ("up", "--machines", str(m.file), "--name", "mtest-fail", "--hosts", "2", "--no-smoke",
          "--inventory", str(tmp_path / "fail.inventory.yaml"))

    swarms = (spread.swarm("m1"), spread.swarm("m2"))  # (inactive when the module's lab is down)

    def failed_cleanly(result: Result) -> None:
        assert result.code != 0 and "Traceback" not in result.text, result.text
        assert spread.containers("m1", "mtest-fail") == [], result.text
        assert [n for n in spread.lab_networks("m1") if n.startswith("mtest-fail")] == [], result.text
        assert (spread.swarm("m1"), spread.swarm("m2")) == swarms, result.text

    image = m.docker("m2", "images", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}", "lab-host").stdout.split()
    assert m.docker("m2", "create", "--name", "mtest-fail-node2", image[1]).returncode == 0
    try:
        result = spread(*up)
        assert result.err.strip().splitlines() == [
            "lab: error: a container named mtest-fail-node2 on machine m2 is not lab mtest-fail's: remove or "
            "rename it, or give the lab another --name"], result.text
        assert "starting mtest-fail-node" not in result.out, result.out
        failed_cleanly(result)
        assert "mtest-fail-node2" in m.docker("m2", "ps", "-a", "--format", "{{.Names}}").stdout.split()
    finally:
        m.docker("m2", "rm", "-f", "mtest-fail-node2")

    broken = m.docker("m2", "import", "/dev/null")  # an image of no files and no command
    assert broken.returncode == 0, broken.stderr
    assert m.docker("m2", "tag", broken.stdout.strip(), image[0]).returncode == 0
    try:
        result = spread(*up)
        assert result.err.startswith("lab: error: host node2: cannot start mtest-fail-node2 on machine m2: "), \
            result.text
        assert "machine m1: removed container mtest-fail-node1" in result.out, result.out
        failed_cleanly(result)
    finally:
        assert m.docker("m2", "tag", image[1], image[0]).returncode == 0
        m.docker("m2", "rmi", broken.stdout.strip())


def test_a_swarm_the_machines_were_in_is_used_and_left_as_found(spread: Spread, tmp_path: Path) -> None:
    """m1 manages a Swarm of its own before the lab, and takes no lab host (lab_hosts: 0): the lab
    joins m2 to it, and down takes out only m2, leaving m1's Swarm (and its own network there) as
    they were."""
    m = spread.machines
    manager_only = tmp_path / "machines.yaml"
    manager_only.write_text(m.file.read_text().replace(f"m1: {{ansible_host: {m.addresses['m1']}}}",
                                                       f"m1: {{ansible_host: {m.addresses['m1']}, lab_hosts: 0}}"))
    assert "lab_hosts: 0" in manager_only.read_text()
    assert m.docker("m1", "swarm", "init", "--advertise-addr", m.addresses["m1"]).returncode == 0
    try:
        assert m.docker("m1", "network", "create", "-d", "overlay", "--attachable", "theirs").returncode == 0
        up = spread("up", "--machines", str(manager_only), "--name", LAB, "--inventory", str(spread.inventory),
                    "--hosts", "2", "--no-smoke", timeout=1500)
        assert up.code == 0 and "starting a swarm" not in up.out and "m2: joining the swarm of m1" in up.out, \
            up.text[-3000:]
        assert {n: labels.get(JOINED_LABEL) for n, labels in spread.node_labels("m1").items()} == {
            "m1": None, "m2": "1"}
        assert {name: h["machine"] for name, h in spread.hosts().items()} == {"node1": "m2", "node2": "m2"}
        assert spread("run", "p2p", "--hosts", str(spread.inventory)).code == 0
        down = spread.down()
        assert down.code == 0, down.text
        assert (spread.swarm("m1"), spread.swarm("m2")) == ("active", "inactive")
        assert "theirs" in m.docker("m1", "network", "ls", "--format", "{{.Name}}").stdout.split()
        assert spread.containers("m1", None) == spread.containers("m2", None) == []
    finally:
        m.docker("m1", "swarm", "leave", "--force")


def test_an_overlay_over_ssh_on_the_machines_as_a_sudo_user_and_nothing_left_after_down(
        two: machines.Machines, tmp_path: Path) -> None:
    """`lab net overlay --hosts`: the machines as VMs, reached as a user who becomes root with sudo -n;
    no kernel WireGuard here, so wireguard-go, daemonized; down takes every trace away."""
    for name in two.names:
        made = subprocess.run(["docker", "exec", two.container(name), "sh", "-c",
                               "id ops >/dev/null 2>&1 || useradd -m ops && usermod -p '*' ops && "
                               "echo 'ops ALL=(root) NOPASSWD: ALL' > /etc/sudoers.d/ops && "
                               "chmod 644 /etc/lab-machine/authorized_keys"],  # (read as the user logging in)
                              capture_output=True, text=True, timeout=60)
        assert made.returncode == 0, made.stderr
    vms = yaml.safe_load(two.file.read_text())
    vms["all"]["vars"]["ansible_user"] = "ops"
    inventory = tmp_path / "vms.yaml"
    inventory.write_text(yaml.safe_dump(vms))
    cli = Lab()
    refused = cli("net", "overlay", "up", "--hosts", str(inventory))
    assert refused.code == ExitCode.RUN_ERROR and refused.err.splitlines() == [
        "lab: error: host m1: WireGuard needs root there: log in as root, or set ansible_become: true "
        "(passwordless sudo)"], refused.err
    vms["all"]["vars"]["ansible_become"] = True
    inventory.write_text(yaml.safe_dump(vms))
    try:
        up = cli("net", "overlay", "up", "--hosts", str(inventory), timeout=300)
        assert up.code == 0, up.text[-3000:]
        written = yaml.safe_load((tmp_path / "vms.overlay.yaml").read_text())["all"]["hosts"]
        assert {n: (h["data_address"], h["network_interface"], h["ansible_user"], h["ansible_become"])
                for n, h in written.items()} == {"m1": ("10.77.0.11", "labwg0", "ops", True),
                                                 "m2": ("10.77.0.12", "labwg0", "ops", True)}
        on_m1 = subprocess.run(["docker", "exec", two.container("m1"), "sh", "-c",
                                "stat -c '%a %U' /run/lab-wg/private.key && pgrep -x wireguard-go && "
                                "ping -c 1 -W 5 10.77.0.12 >/dev/null && getent hosts 10.77.0.12"],
                               capture_output=True, text=True, timeout=60)
        assert on_m1.returncode == 0, on_m1.stderr
        lines = on_m1.stdout.splitlines()
        assert lines[0] == "600 root" and lines[-1].split() == ["10.77.0.12", "m2-labwg0"]
        shown = cli("net", "overlay", "show", "--hosts", str(inventory))
        assert shown.code == 0 and shown.out.count(":51820") == 2 and "never" not in shown.out, shown.text
    finally:
        down = cli("net", "overlay", "down", "--hosts", str(inventory), timeout=300)
    assert down.code == 0 and down.out.count("removed labwg0") == 2, down.text
    for name in two.names:
        left = subprocess.run(["docker", "exec", two.container(name), "sh", "-c", "ip link show labwg0; "
                               "pgrep -x wireguard-go; ls /run/lab-wg; grep lab-overlay /etc/hosts"],
                              capture_output=True, text=True, timeout=60)
        assert left.stdout == "" and "does not exist" in left.stderr, (left.stdout, left.stderr)
