"""The command line on bad input: one line per problem, naming the place, a distinct exit code,
before anything starts (no engine, no processes, no hosts needed)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from lab.containerlab.topology import Topology
from lab.errors import ExitCode, HostsUnreachable, HostUnreachable

from .conftest import REPO


def lab(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def closed_port() -> int:
    """A port on loopback that nothing listens on (bound to no one once this returns)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_lab_up_refuses_more_hosts_than_its_networks_hold_before_starting_anything() -> None:
    assert Topology(hosts=244).max_hosts == 244 and Topology(hosts=244, kind="cross-vpc").hosts == 244
    done = lab("up", "--hosts", "300", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("lab: error: --hosts 300: the lab's networks hold at most 244 hosts "
                                   "(node i is .10+i of a /24)")


def test_every_unreachable_host_is_one_line_naming_it(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("not a key: the connection is refused before it is read\n")
    ports = {"a": closed_port(), "b": closed_port()}
    inventory = tmp_path / "inventory.yaml"
    hosts = "".join(f"    {n}: {{ansible_host: 127.0.0.1, ansible_port: {p}}}\n" for n, p in ports.items())
    inventory.write_text(f"all:\n  vars: {{ansible_user: lab, ansible_ssh_private_key_file: key}}\n  hosts:\n{hosts}")
    done = lab("run", "p2p", "--hosts", str(inventory))
    assert done.returncode == ExitCode.UNREACHABLE, done.stderr
    assert done.stderr.splitlines() == [f"lab: error: host {n} (127.0.0.1:{p}): cannot connect: Connection refused"
                                        for n, p in ports.items()]


def test_a_group_of_unreachable_hosts_keeps_each_ones_error() -> None:
    errors = [HostUnreachable("a", "host a: down"), HostUnreachable("b", "host b: down")]
    group = HostsUnreachable.of(errors)
    assert isinstance(group, HostsUnreachable) and [e.host for e in group.errors] == ["a", "b"]
    assert str(group).splitlines() == ["host a: down", "host b: down"]
    assert HostsUnreachable.of(errors[:1]) is errors[0]
