"""The command line on bad input: one line per problem, naming the place, a distinct exit code,
before anything starts (no engine, no processes, no hosts needed)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import lab as lab_package
from lab.cli.main import build_parser
from lab.containerlab.topology import Topology
from lab.errors import ExitCode, HostsUnreachable, HostUnreachable

from .conftest import REPO, said_apart_from_phases

HOSTILE = Path(__file__).resolve().parent / "hostile"


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
    key.chmod(0o600)
    ports = {"a": closed_port(), "b": closed_port()}
    inventory = tmp_path / "inventory.yaml"
    hosts = "".join(f"    {n}: {{ansible_host: 127.0.0.1, ansible_port: {p}}}\n" for n, p in ports.items())
    inventory.write_text(f"all:\n  vars: {{ansible_user: lab, ansible_ssh_private_key_file: key}}\n  hosts:\n{hosts}")
    done = lab("run", "p2p", "--hosts", str(inventory))
    assert done.returncode == ExitCode.UNREACHABLE, done.stderr
    assert said_apart_from_phases(done.stderr) == [
        f"lab: error: host {n} (127.0.0.1:{p}): cannot connect: Connection refused" for n, p in ports.items()]


def test_a_group_of_unreachable_hosts_keeps_each_ones_error() -> None:
    errors = [HostUnreachable("a", "host a: down"), HostUnreachable("b", "host b: down")]
    group = HostsUnreachable.of(errors)
    assert isinstance(group, HostsUnreachable) and [e.host for e in group.errors] == ["a", "b"]
    assert str(group).splitlines() == ["host a: down", "host b: down"]
    assert HostsUnreachable.of(errors[:1]) is errors[0]


# -- the inventory on the command line: hostile files are bad input, not a hang or a crash ----


def test_a_merge_bomb_inventory_is_refused_at_once_with_its_line() -> None:
    path = HOSTILE / "merge_bomb.yaml"
    started = time.monotonic()
    done = lab("run", "p2p", "--dry-run", "--hosts", str(path))
    assert time.monotonic() - started < 30
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert done.stderr.splitlines() == [f"lab: error: {path}:5: the merges (<<) here bring in more than 10,000 "
                                        "entries (each counted as often as it is merged): a merge bomb?"]


def test_a_deeply_nested_inventory_is_bad_input_not_an_internal_error() -> None:
    path = HOSTILE / "deep_nesting.yaml"
    done = lab("doctor", "--hosts", str(path))
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    assert done.stderr.splitlines() == [f"lab: error: {path}:5: the YAML is nested more than 100 levels deep"]


def test_verbose_names_the_ignored_variables_in_one_line(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  vars: {ntp_server: ntp.example.com, ansible_become_user: root}\n"
                         "  hosts:\n    h1: {ansible_host: 10.0.0.1, rack: 3, slots: 2}\n")
    quiet = lab("run", "p2p", "--dry-run", "--hosts", str(inventory))
    assert quiet.returncode == ExitCode.OK and quiet.stderr == "", quiet.stderr
    verbose = lab("run", "p2p", "--dry-run", "-v", "--hosts", str(inventory))
    assert verbose.returncode == ExitCode.OK, verbose.stderr
    notes = [line for line in verbose.stderr.splitlines() if "ignored" in line]
    assert len(notes) == 1 and re.fullmatch(
        rf"lab \[\+\d+\.\d\ds\]: {re.escape(str(inventory))}: ignored variables the lab does not use: ntp_server, "
        "ansible_become_user, rack", notes[0]), notes


def test_a_typo_in_a_variable_is_still_an_error(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  hosts:\n    h1: {ansible_hots: 10.0.0.1}\n")
    done = lab("run", "p2p", "--dry-run", "--hosts", str(inventory))
    assert done.returncode == ExitCode.BAD_INPUT
    assert done.stderr.splitlines() == [f"lab: error: {inventory}:3: unknown key 'ansible_hots': "
                                        "did you mean 'ansible_host'?"]


def test_a_private_key_others_can_read_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "loose_key"  # (made here: git keeps no mode but the x bit)
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o644)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  vars:\n    ansible_ssh_private_key_file: loose_key\n  hosts: {h1: }\n")
    done = lab("run", "p2p", "--dry-run", "--hosts", str(inventory))
    assert done.returncode == ExitCode.BAD_INPUT
    assert done.stderr.splitlines() == [f"lab: error: {inventory}:3: ansible_ssh_private_key_file: key file {key} "
                                        f"has mode 0644; a private key must not be readable by others "
                                        f"(chmod 600 {key})"]


@pytest.mark.parametrize("argv, name", [
    (["net", "overlay", "up", "--name", "l2"], "l2"),
    (["net", "--name", "l1", "overlay", "up"], "l1"),
    (["net", "--name", "l1", "shape", "--name", "l2", "--rate", "1mbit"], "l2"),
    (["net", "shape", "node1", "--name", "l3", "--rate", "1mbit"], "l3"),
    (["net", "peering", "show"], "lab"),
])
def test_a_commands_options_are_taken_after_its_subcommand_too(argv: list[str], name: str) -> None:
    assert build_parser().parse_args(argv).name == name


def test_an_unknown_exercise_names_the_nearest_one() -> None:
    done = lab("run", "ring_allreduce")
    assert done.returncode == ExitCode.BAD_INPUT and done.stdout == ""
    assert done.stderr == ("lab: error: unknown exercise 'ring_allreduce': did you mean 'ring-allreduce'?; "
                           "see 'python -m lab list'\n")
    assert "did you mean" not in lab("run", "zzzz").stderr  # (nothing near: nothing said)


@pytest.mark.local
def test_exercises_are_reported_in_the_order_named() -> None:
    done = lab("run", "barrier", "p2p", "all-reduce", "--nproc", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert [e["name"] for e in json.loads(done.stdout)["exercises"]] == ["barrier", "p2p", "all-reduce"]


def test_the_lab_command_runs_from_any_folder_and_says_its_versions(tmp_path: Path) -> None:
    """`make venv` installs the package: `lab` is on the venv's PATH, and works outside the checkout."""
    command = Path(sys.executable).parent / "lab"
    done = subprocess.run([str(command), "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(rf"lab {re.escape(lab_package.__version__)} \(torch 2\.13\.0\S*, Python 3\.\d+\.\d+\)\n",
                        done.stdout), done.stdout


def test_the_shell_completes_commands_and_exercise_names(tmp_path: Path) -> None:
    script = lab("completion", "bash")
    assert script.returncode == 0 and "complete " in script.stdout and " lab" in script.stdout, script.stderr
    assert lab("completion", "fish").returncode == ExitCode.BAD_INPUT
    for line, wanted in (("lab gr", {"grade"}), ("lab run ring", {"ring-allreduce"}),
                         ("lab grade x --exercise all-", {"all-reduce", "all-gather"})):
        assert wanted <= completions(line), line


def completions(line: str) -> set[str]:
    """What the shell would offer for ``line`` (argcomplete's protocol: the words on fd 8)."""
    read, write = os.pipe()
    env = {**os.environ, "_ARGCOMPLETE": "1", "_ARGCOMPLETE_IFS": "\n", "COMP_LINE": line,
           "COMP_POINT": str(len(line)), "COMP_TYPE": "9"}
    try:
        subprocess.run([sys.executable, "-m", "lab"], cwd=REPO, env=env, capture_output=True, timeout=60,
                       pass_fds=(write, 8), preexec_fn=lambda: os.dup2(write, 8))
    finally:
        os.close(write)
    with os.fdopen(read) as words:
        return {w.strip() for w in words.read().split("\n") if w.strip()}


@pytest.mark.docker
def test_status_of_a_lab_that_is_not_there_is_bad_input() -> None:
    done = lab("status", "--name", "no-such-lab")
    assert done.returncode == ExitCode.BAD_INPUT and done.stdout == "", done.stdout
    assert done.stderr.startswith("lab: error: no lab named no-such-lab is running") and done.stderr.count("\n") == 1


def test_nproc_per_node_and_nnodes_shape_the_hosts_as_torchruns_do(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text("all:\n  vars:\n    ansible_connection: local\n  hosts:\n    alpha:\n    beta:\n    gamma:\n")
    done = lab("run", "p2p", "--hosts", str(inventory), "--nnodes", "2", "--nproc-per-node", "3", "--dry-run")
    assert done.returncode == 0, done.stderr
    plan = yaml.safe_load(done.stdout)
    assert plan["world_size"] == 6 and [h["name"] for h in plan["hosts"]] == ["alpha", "beta"], plan["hosts"]
    # --nproc that disagrees with the hosts is one line, not ignored
    done = lab("run", "p2p", "--hosts", str(inventory), "--nproc", "2")
    assert done.returncode == ExitCode.BAD_INPUT and done.stderr.count("\n") == 1, done.stderr
    assert f"--nproc 2 disagrees with {inventory}: 3 rank(s) on 3 host(s)" in done.stderr
    assert lab("run", "p2p", "--hosts", str(inventory), "--nproc", "3", "--dry-run").returncode == 0
    for args, words in ((["--nnodes", "4"], f"--nnodes 4: {inventory} has 3 host(s)"),
                        (["--nproc-per-node", "0"], "--nproc-per-node must be at least 1")):
        done = lab("run", "p2p", "--hosts", str(inventory), *args)
        assert done.returncode == ExitCode.BAD_INPUT and words in done.stderr, done.stderr
    done = lab("run", "p2p", "--nnodes", "2")
    assert done.returncode == ExitCode.BAD_INPUT and "the local cluster is one node" in done.stderr


@pytest.mark.parametrize("argv, unneeded", [
    (["list"], ("paramiko", "docker", "torch")),
    (["run", "p2p", "--dry-run"], ("paramiko", "docker", "torch")),
    (["launch", "--help"], ("paramiko", "docker", "torch")),
])
def test_a_command_that_reaches_no_ssh_or_docker_host_imports_neither_sdk(argv: list[str], unneeded: tuple[str, ...],
                                                                           tmp_path: Path) -> None:
    """Each CLI start imports only what its command needs: paramiko and the Docker SDK are half of it."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    probe = ("import runpy, sys\n"
             f"sys.argv = ['lab', *{argv!r}]\n"
             "try:\n    runpy.run_module('lab', run_name='__main__')\n"
             "except SystemExit as exc:\n    assert exc.code in (0, None), exc.code\n"
             f"print(sorted(m for m in {unneeded!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]", done.stdout[-500:]
