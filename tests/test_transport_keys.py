"""Each transport's host keys, declared beside it (lab/transport/ssh/keys.py, lab/transport/docker/keys.py),
are what the inventory reads for a host of that transport, and what the transport then uses; a near miss of
one is refused, naming the key it meant; reading an inventory loads no transport."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import paramiko
import pytest

from lab.errors import ExitCode, InventoryError
from lab.inventory.hosts import HOST_KEYS, TRANSPORT_KEYS, load_inventory, parse_inventory
from lab.inventory.keys import Key, integer, merged
from lab.inventory.model import CONNECTIONS, Connection, Host
from lab.transport.docker.keys import DOCKER_KEYS
from lab.transport.docker.transport import DockerTransport
from lab.transport.ssh.connections import Connections
from lab.transport.ssh.keys import SSH_KEYS
from lab.transport.ssh.settings import SSHSettings

from .conftest import REPO

# A value for each key a transport declares, as written in the file, and the field's value it reads as
# (the files relative to the inventory's directory). A key declared without a sample here fails the test.
SAMPLES = {
    "ansible_port": ("2222", 2222),
    "ansible_user": ("lab", "lab"),
    "ansible_ssh_private_key_file": ("id_lab", "{dir}/id_lab"),
    "ssh_known_hosts_file": ("known_hosts", "{dir}/known_hosts"),
    "docker_container": ("lab-c1", "lab-c1"),
}


def inventory_of(tmp_path: Path, connection: str, values: Mapping[str, str]) -> Path:
    """An inventory of one host, ``h``, of ``connection`` with ``values``; its private key made, 0600."""
    key = tmp_path / "id_lab"
    key.write_text("key\n")
    key.chmod(0o600)
    lines = "".join(f"      {name}: {value}\n" for name, value in values.items())
    path = tmp_path / "inventory.yaml"
    path.write_text(f"all:\n  hosts:\n    h:\n      ansible_connection: {connection}\n{lines}")
    return path


def host_with(tmp_path: Path, connection: str, keys: Mapping[str, Key]) -> Host:
    """The host ``h`` read from an inventory that gives it every one of ``keys`` (by their samples)."""
    path = inventory_of(tmp_path, connection, {name: SAMPLES[name][0] for name in keys})
    (host,) = load_inventory(path).hosts
    return host


def test_every_connection_has_its_transports_declaration() -> None:
    assert set(TRANSPORT_KEYS) == set(CONNECTIONS)
    assert TRANSPORT_KEYS["ssh"] is SSH_KEYS and TRANSPORT_KEYS["docker"] is DOCKER_KEYS
    assert TRANSPORT_KEYS["local"] == TRANSPORT_KEYS["slurm"] == {}


@pytest.mark.parametrize("connection", sorted(TRANSPORT_KEYS))
def test_a_transports_declared_keys_are_what_the_inventory_reads_for_its_hosts(tmp_path: Path,
                                                                              connection: Connection) -> None:
    declared = TRANSPORT_KEYS[connection]
    assert set(declared) <= set(SAMPLES), f"give {sorted(set(declared) - set(SAMPLES))} a sample here"
    host = host_with(tmp_path, connection, declared)
    assert host.connection == connection
    for name, key in declared.items():
        wanted = SAMPLES[name][1]
        assert getattr(host, key.attribute) == (wanted.format(dir=tmp_path) if isinstance(wanted, str) else wanted)
        table = HOST_KEYS[name]  # read by the inventory as declared: the same field, the same reader
        assert (table.attribute, table.read) == (key.attribute, key.read)
        assert key.meaning in table.meaning  # (and the reference says what the transport does with it)


def test_the_ssh_transport_logs_in_where_and_as_its_declared_keys_say(tmp_path: Path) -> None:
    host = host_with(tmp_path, "ssh", SSH_KEYS)
    connections = Connections(host, SSHSettings(), "host h")
    target = connections._target(paramiko.SSHConfig())  # (no ~/.ssh/config: the inventory's values alone)
    assert (target.port, target.user, target.key_files) == (2222, "lab", (str(tmp_path / "id_lab"),))
    assert connections._known_hosts_files()[0] == str(tmp_path / "known_hosts")


def test_the_docker_transport_runs_in_the_container_and_as_the_user_its_declared_keys_say(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = host_with(tmp_path, "docker", DOCKER_KEYS)
    monkeypatch.setattr(DockerTransport, "running", lambda self: None)  # (no engine: the container is there)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert DockerTransport(host).prefix() == ["/usr/bin/docker", "exec", "-i", "--user", "lab", "lab-c1"]


DECLARED = [(connection, name) for connection, keys in sorted(TRANSPORT_KEYS.items()) for name in keys]


@pytest.mark.parametrize("connection, name", DECLARED)
def test_a_near_miss_of_a_declared_key_is_refused_naming_the_key(tmp_path: Path, connection: str, name: str) -> None:
    near = name[:-1]  # one letter short
    assert near not in HOST_KEYS
    text = f"all:\n  hosts:\n    h:\n      ansible_connection: {connection}\n      {near}: {SAMPLES[name][0]}\n"
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml", str(tmp_path))
    assert str(caught.value) == f"inv.yaml:5: unknown key '{near}': did you mean '{name}'?"
    assert caught.value.exit_code == ExitCode.BAD_INPUT


def test_the_command_line_refuses_a_near_miss_of_a_transports_key_with_exit_code_2(tmp_path: Path) -> None:
    path = inventory_of(tmp_path, "docker", {"docker_containr": "lab-c1"})
    done = subprocess.run([sys.executable, "-m", "lab", "run", "p2p", "--dry-run", "--hosts", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == ExitCode.BAD_INPUT and int(ExitCode.BAD_INPUT) == 2
    assert done.stderr.splitlines() == [f"lab: error: {path}:5: unknown key 'docker_containr': "
                                        "did you mean 'docker_container'?"]


def test_a_key_two_transports_declare_is_one_key_read_one_way() -> None:
    ssh, docker = SSH_KEYS["ansible_user"], DOCKER_KEYS["ansible_user"]
    assert HOST_KEYS["ansible_user"] == Key("user", ssh.read, f"{ssh.meaning}; {docker.meaning}")
    with pytest.raises(ValueError, match="ansible_port is declared twice"):
        merged(SSH_KEYS, {"ansible_port": Key("port", integer(1), "another reading of the port")})
    with pytest.raises(ValueError, match="ansible_user is declared twice"):
        merged(SSH_KEYS, {"ansible_user": Key("login", ssh.read, "the user, in another field")})


def test_the_machines_file_logs_in_with_the_ssh_transports_keys_as_declared() -> None:
    from lab.containerlab.machines import LAB_HOST_ONLY, MACHINE_KEYS

    assert all(MACHINE_KEYS[name] is key for name, key in SSH_KEYS.items())
    assert set(LAB_HOST_ONLY) <= set(HOST_KEYS) - set(SSH_KEYS)  # (what it refuses is a lab host's key)
    assert MACHINE_KEYS["ansible_host"].read is HOST_KEYS["ansible_host"].read  # (only its meaning is the machine's)


def test_reading_an_inventory_loads_no_transport_nor_its_client_library(tmp_path: Path) -> None:
    path = inventory_of(tmp_path, "docker", {name: SAMPLES[name][0] for name in [*SSH_KEYS, *DOCKER_KEYS]})
    script = textwrap.dedent(f"""\
        import sys
        from lab.inventory.hosts import load_inventory
        load_inventory({str(path)!r})
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("paramiko", "docker")
                     or m.startswith("lab.transport.") and not m.endswith(".keys")))
        """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['lab.transport.docker', 'lab.transport.ssh']"  # (the two packages: no code)
