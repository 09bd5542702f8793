"""The SSH transport against a real OpenSSH server on 127.0.0.1: no mocks.

The tests run sshd from ``tests/sshd.py`` (root and /usr/sbin/sshd needed: skipped
elsewhere, a failure under CI=true). HOME points at an empty directory, so the user's
own ~/.ssh (config, known_hosts, keys, agent) plays no part.
"""
from __future__ import annotations

import json
import secrets
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from lab.core.judge import judge
from lab.core.outcome import RunOutcome
from lab.core.plan import Options
from lab.core.planner import build_plan
from lab.core.runner import run_plan
from lab.errors import ExitCode, HostUnreachable, RunError
from lab.inventory.hosts import load_inventory
from lab.inventory.model import Host, Inventory
from lab.suite import registry
from lab.transport.base import RankProcess, code_uploads
from lab.transport.reach import transport_for, with_master_address
from lab.transport.ssh.connections import RANKS_PER_CONNECTION
from lab.transport.ssh.settings import SSHSettings
from lab.transport.ssh.transport import SSHTransport

from .conftest import live_pids_with
from .sshd import SSHServer, free_port, keygen, start_sshd

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(120)]

READ_TIMEOUT = 10.0  # seconds a test waits for a process to end once its output is read


@pytest.fixture(autouse=True)
def no_user_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the real ~/.ssh and ssh-agent out of every test."""
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def known_hosts(path: Path, *lines: str) -> str:
    path.write_text("".join(lines))
    return str(path)


def ssh_host(server: SSHServer, known: str | None, name: str = "a", **fields: object) -> Host:
    values: dict[str, object] = {"port": server.port, "user": "root", "key_file": str(server.client_key),
                                 "known_hosts": known, **fields}
    return Host(name, "127.0.0.1", **values)  # type: ignore[arg-type]


def transport(host: Host, tmp_path: Path, **settings: object) -> SSHTransport:
    values: dict[str, object] = {"connect_timeout": 5.0, "ssh_config": str(tmp_path / "no_ssh_config"), **settings}
    return SSHTransport(host, SSHSettings(**values))  # type: ignore[arg-type]


def unreachable(t: SSHTransport) -> HostUnreachable:
    with pytest.raises(HostUnreachable) as caught:
        t.start(["true"], {}, "/")
    t.close()
    return caught.value


def read_all(process: RankProcess) -> tuple[list[bytes], list[bytes], int]:
    """Every stdout and stderr line, then the exit status (bounded by READ_TIMEOUT)."""
    out, err = list(iter(process.stdout.readline, b"")), list(iter(process.stderr.readline, b""))
    deadline = time.monotonic() + READ_TIMEOUT
    while (status := process.poll()) is None:
        assert time.monotonic() < deadline, "the process did not end"
        time.sleep(0.02)
    return out, err, status


def fingerprint(public_line: str) -> str:
    listed = subprocess.run(["ssh-keygen", "-lf", "-"], input=public_line, capture_output=True, text=True,
                            check=True, timeout=30).stdout
    return listed.split()[1]


def wait_until_gone(marker: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := live_pids_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# -- running a command ----------------------------------------------------------------


def test_known_host_runs_a_command_with_env_streams_and_status(server: SSHServer, tmp_path: Path) -> None:
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    value = json.dumps({"plan": "it's \"quoted\"", "cost": "$HOME `id` \\n $(id) *", "é": [1, 2]},
                       ensure_ascii=False)
    script = 'echo hello; echo err >&2; printenv LAB_JSON; ps -o pid=,pgid=,sid= -p $$; sleep 0.2'
    try:
        process = t.start(["sh", "-c", script], {"LAB_JSON": value, "EMPTY": ""}, "/tmp")
        out, err, status = read_all(process)
        process.kill()
    finally:
        t.close()
    assert (out[:2], err, status) == ([b"hello\n", value.encode() + b"\n"], [b"err\n"], 0)
    # The command runs under the lab's reaper, in a process group of its own, the one it signals;
    # the session is the reaper's (sshd starts it in a new one).
    pid, pgid, sid = (int(n) for n in out[2].split())
    assert pid == pgid == process.pgid and sid != pgid  # type: ignore[attr-defined]


# Counts the processes of this machine whose command line holds the value of LAB_SECRET (which no
# command line of this script's holds: it reads the value from its environment).
_COUNT_SECRET_ON_COMMAND_LINES = '''
import glob, os
secret = os.environ["LAB_SECRET"].encode()
found = 0
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        with open(path, "rb") as f:
            found += secret in f.read()
    except OSError:
        pass
print(found)
'''


def test_a_commands_settings_are_on_no_command_line(server: SSHServer, tmp_path: Path) -> None:
    """The settings a process starts with (a rank's token and plan) go on its stdin, never on a
    command line, which every user of the host can read (ps): not on the shell's, the reaper's or the
    program's, here where the host and the controller are one machine."""
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    try:
        process = t.start([sys.executable, "-c", _COUNT_SECRET_ON_COMMAND_LINES], {"LAB_SECRET": secret}, "/tmp")
        out, err, status = read_all(process)
    finally:
        t.close()
    assert (out, status) == ([b"0\n"], 0), err


def test_exit_status_and_a_missing_run_dir(server: SSHServer, tmp_path: Path) -> None:
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    try:
        assert read_all(t.start(["sh", "-c", "exit 7"], {}, "/"))[2] == 7
        with pytest.raises(RunError, match=r"host a: cannot start true in /no/such/dir: .*/no/such/dir"):
            t.start(["true"], {}, "/no/such/dir")
    finally:
        t.close()


def test_module_argv_runs_the_hosts_python() -> None:
    t = SSHTransport(Host("a", "10.0.0.1", python="/opt/py/bin/python3"))
    assert t.module_argv("lab.rank.worker") == ["/opt/py/bin/python3", "-m", "lab.rank.worker"]


# -- host keys ------------------------------------------------------------------------


def test_unknown_host_key_is_refused_then_accepted_and_recorded(server: SSHServer, tmp_path: Path) -> None:
    kh = known_hosts(tmp_path / "kh")
    host = ssh_host(server, kh)
    err = unreachable(transport(host, tmp_path))
    assert str(err) == (f"host a (127.0.0.1:{server.port}): unknown SSH host key (ssh-ed25519 "
                        f"{fingerprint(server.host_public)}); add it to known_hosts or pass "
                        f"--accept-new-host-keys")
    assert err.exit_code == ExitCode.UNREACHABLE
    assert Path(kh).read_text() == ""

    t = transport(host, tmp_path, accept_new_host_keys=True)
    try:
        assert read_all(t.start(["true"], {}, "/"))[2] == 0
    finally:
        t.close()
    assert Path(kh).read_text() == server.known_hosts_line  # as ssh-keygen writes [addr]:port
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.1]:{server.port}", "-f", kh],
                           capture_output=True, text=True, timeout=30)
    assert found.returncode == 0, found.stderr

    t = transport(host, tmp_path)  # known now, without accept-new
    try:
        assert read_all(t.start(["true"], {}, "/"))[2] == 0
    finally:
        t.close()


def test_accepted_key_goes_to_the_settings_file_hashed_when_the_ssh_config_says_so(
        server: SSHServer, tmp_path: Path) -> None:
    (tmp_path / "ssh_config").write_text("Host *\n  HashKnownHosts yes\n")
    kh = tmp_path / "lab_known_hosts"
    t = transport(ssh_host(server, None), tmp_path, accept_new_host_keys=True, known_hosts=str(kh),
                  ssh_config=str(tmp_path / "ssh_config"))
    try:
        assert read_all(t.start(["true"], {}, "/"))[2] == 0
    finally:
        t.close()
    line = kh.read_text()
    assert line.startswith("|1|") and line.endswith(f" {server.host_public}\n")
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.1]:{server.port}", "-f", str(kh)],
                           capture_output=True, text=True, timeout=30)
    assert found.returncode == 0, found.stderr
    assert not (tmp_path / "home" / ".ssh" / "known_hosts").exists()


def test_hosts_own_known_hosts_wins_and_home_known_hosts_is_read(server: SSHServer, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other")
    stale = known_hosts(tmp_path / "stale", f"[127.0.0.1]:{server.port} {other}\n")
    good = known_hosts(tmp_path / "good", server.known_hosts_line)
    t = transport(ssh_host(server, good), tmp_path, known_hosts=stale)
    try:
        assert read_all(t.start(["true"], {}, "/"))[2] == 0
    finally:
        t.close()
    (tmp_path / "home" / ".ssh").mkdir()
    known_hosts(tmp_path / "home" / ".ssh" / "known_hosts", "# mine\n", "garbage line\n", server.known_hosts_line)
    t = transport(ssh_host(server, None), tmp_path)
    try:
        assert read_all(t.start(["true"], {}, "/"))[2] == 0
    finally:
        t.close()


@pytest.mark.parametrize("accept_new", [False, True])
def test_changed_host_key_is_always_refused(server: SSHServer, tmp_path: Path, accept_new: bool) -> None:
    other = keygen(tmp_path / "other")
    kh = known_hosts(tmp_path / "kh", "# lab\n", f"[127.0.0.1]:{server.port} {other}\n")
    err = unreachable(transport(ssh_host(server, kh), tmp_path, accept_new_host_keys=accept_new))
    message = str(err)
    assert message.startswith(f"host a (127.0.0.1:{server.port}): SSH host key CHANGED: the server offers "
                              f"ssh-ed25519 {fingerprint(server.host_public)} but {kh}:2 has ssh-ed25519 "
                              f"{fingerprint(other)}; refusing to connect"), message
    assert f"ssh-keygen -f {kh} -R '[127.0.0.1]:{server.port}'" in message and "\n" not in message
    assert Path(kh).read_text().count("\n") == 2


# -- reaching the host ----------------------------------------------------------------


def test_nothing_listening_is_unreachable_within_the_connect_timeout(server: SSHServer, tmp_path: Path) -> None:
    port = free_port()
    t = transport(ssh_host(server, None, port=port), tmp_path, connect_timeout=2.0)
    started = time.monotonic()
    err = unreachable(t)
    assert time.monotonic() - started < 3.0
    assert str(err) == f"host a (127.0.0.1:{port}): cannot connect: Connection refused"


def test_a_silent_server_times_out_within_the_connect_timeout(server: SSHServer, tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts TCP (the backlog does), never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        t = transport(ssh_host(server, None, port=port), tmp_path, connect_timeout=1.0)
        started = time.monotonic()
        err = unreachable(t)
        assert time.monotonic() - started < 2.0
    assert str(err).startswith(f"host a (127.0.0.1:{port}): cannot connect: no answer within 1s ("), str(err)


def test_unresolvable_name(server: SSHServer, tmp_path: Path) -> None:
    host = Host("a", "no-such-host.invalid", user="root", key_file=str(server.client_key))
    err = unreachable(transport(host, tmp_path))
    assert str(err).startswith("host a (no-such-host.invalid:22): cannot connect: cannot resolve no-such-host")


def test_a_key_the_server_does_not_know_fails_authentication(server: SSHServer, tmp_path: Path) -> None:
    keygen(tmp_path / "stranger")
    host = ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line),
                    key_file=str(tmp_path / "stranger"))
    err = unreachable(transport(host, tmp_path))
    assert str(err) == f"host a: SSH authentication failed for user root (key {tmp_path / 'stranger'})"


def test_construction_and_cleanup_before_prepare_do_no_io(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        host = Host("a", "127.0.0.1", port=listener.getsockname()[1], known_hosts=str(tmp_path / "kh"))
        t = SSHTransport(host, SSHSettings(ssh_config=str(tmp_path / "missing" / "config")))
        t.cleanup()
        t.close()
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected


def test_hosts_on_one_address_prepared_at_once_record_a_new_key_once(server: SSHServer, tmp_path: Path) -> None:
    kh = known_hosts(tmp_path / "kh")
    transports = [transport(ssh_host(server, kh, name=name), tmp_path, accept_new_host_keys=True)
                  for name in "abcd"]
    with ThreadPoolExecutor(len(transports)) as pool:  # as the runner prepares its hosts
        list(pool.map(lambda t: t.prepare(f"run-{t.host.name}", {}), transports))
    for t in transports:
        t.close()
    assert Path(kh).read_text() == server.known_hosts_line


# -- signals and kill -----------------------------------------------------------------


def test_kill_leaves_no_process_of_the_group(server: SSHServer, tmp_path: Path) -> None:
    marker = secrets.token_hex(8)
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    try:
        process = t.start(["sh", "-c", "sleep 300 & sleep 300 & echo started; wait"],
                          {"LAB_TEST_MARKER": marker}, "/")
        assert process.stdout.readline() == b"started\n"
        deadline = time.monotonic() + 5.0  # (a process in the middle of its exec shows no environment for a moment)
        while len(live_pids_with(marker)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(live_pids_with(marker)) == 3  # the shell, two sleeps (the reaper read the settings on stdin)
        process.signal(signal.SIGCONT)  # harmless, and the group exists
        started = time.monotonic()
        process.kill()
        assert wait_until_gone(marker, 5.0) == []
        assert time.monotonic() - started < 5.0
        assert process.poll() is not None
        process.kill()  # twice is fine
        process.signal(signal.SIGUSR1)  # gone: no error
    finally:
        t.close()


def test_nothing_a_command_daemonizes_outlives_it(server: SSHServer, tmp_path: Path) -> None:
    """setsid and a double fork leave the process group the lab kills: the reaper still ends them."""
    marker = secrets.token_hex(8)
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    script = "setsid sleep 300 & (setsid sh -c 'sleep 300 & exit 0' &) ; sleep 0.3; echo started; exit 4"
    try:
        process = t.start(["sh", "-c", script], {"LAB_TEST_MARKER": marker}, "/")
        out, _, status = read_all(process)
        assert (out, status) == ([b"started\n"], 4)
        assert wait_until_gone(marker, 5.0) == []
        process.kill()
    finally:
        t.close()


def test_signal_reaches_the_whole_group(server: SSHServer, tmp_path: Path) -> None:
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    script = 'trap "echo got USR1" USR1; echo ready; sleep 30 & wait; wait'
    try:
        process = t.start(["sh", "-c", script], {}, "/")
        assert process.stdout.readline() == b"ready\n"
        process.signal(signal.SIGUSR1)  # the sleep dies of it, the shell traps it
        out, _, status = read_all(process)
        assert (out, status) == ([b"got USR1\n"], 0)
        process.kill()
    finally:
        t.close()


def test_more_ranks_than_one_connections_sessions(server: SSHServer, tmp_path: Path) -> None:
    marker = secrets.token_hex(8)
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    count = RANKS_PER_CONNECTION + 4  # sshd's MaxSessions is 10
    try:
        processes = [t.start(["sh", "-c", f"echo rank {i}; exec cat"], {"LAB_TEST_MARKER": marker}, "/")
                     for i in range(count)]
        assert [p.stdout.readline() for p in processes] == [f"rank {i}\n".encode() for i in range(count)]
        for p in processes:
            p.kill()
        assert wait_until_gone(marker, 5.0) == []
    finally:
        t.close()


# -- files ----------------------------------------------------------------------------


def test_prepare_uploads_nested_files_and_cleanup_removes_them(server: SSHServer, tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    files = {"code/lab/__init__.py": b"", "code/lab/transport/deep/x.py": b"print('x')\n",
             "solution/mine's.py": bytes(range(256)) * 40}
    uploads = {}
    for relative, data in files.items():
        uploads[relative] = local / relative.replace("/", "_")
        uploads[relative].write_bytes(data)
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    try:
        run_dir = Path(t.prepare("lab-run it's", uploads))
        assert run_dir == server.tmp.resolve() / "lab-run it's"  # in the host's TMPDIR
        assert run_dir.stat().st_mode & 0o777 == 0o700
        assert {relative: (run_dir / relative).read_bytes() for relative in files} == files
        t.cleanup(keep=True)
        assert run_dir.is_dir()
        t.cleanup()
        assert not run_dir.exists() and run_dir.parent.is_dir()
    finally:
        t.close()


def test_prepare_carries_the_labs_code_quickly(server: SSHServer, tmp_path: Path) -> None:
    uploads = code_uploads()
    t = transport(ssh_host(server, known_hosts(tmp_path / "kh", server.known_hosts_line)), tmp_path)
    try:
        started = time.monotonic()
        run_dir = Path(t.prepare("run", uploads))
        seconds = time.monotonic() - started
        assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.py")) == sorted(uploads)
        assert seconds < 5.0, f"{len(uploads)} files took {seconds:.2f}s"
        t.cleanup()
    finally:
        t.close()


# -- ProxyJump ------------------------------------------------------------------------


def test_proxyjump_from_the_ssh_config(server: SSHServer, tmp_path: Path) -> None:
    jump = start_sshd(tmp_path / "jump", client_key=server.client_key, log_level="DEBUG1")
    try:
        config = tmp_path / "ssh_config"
        config.write_text(f"""\
Host target
  HostName 127.0.0.1
  Port {server.port}
  User root
  IdentityFile {server.client_key}
  ProxyJump bastion
Host bastion
  HostName 127.0.0.1
  Port {jump.port}
  User root
  IdentityFile {server.client_key}
""")
        kh = known_hosts(tmp_path / "kh", server.known_hosts_line, jump.known_hosts_line)
        t = SSHTransport(Host("target", "target", known_hosts=kh),
                         SSHSettings(connect_timeout=5.0, ssh_config=str(config)))
        try:
            out, _, status = read_all(t.start(["sh", "-c", "echo through"], {}, "/"))
        finally:
            t.close()
        assert (out, status) == ([b"through\n"], 0)
        assert f"target 127.0.0.1 port {server.port}" in jump.log.read_text()  # the direct-tcpip channel

        # The jump host's key is checked like any other.
        kh_without_jump = known_hosts(tmp_path / "kh2", server.known_hosts_line)
        err = unreachable(SSHTransport(Host("target", "target", known_hosts=kh_without_jump),
                                       SSHSettings(connect_timeout=5.0, ssh_config=str(config))))
        assert str(err).startswith(f"host target: jump host bastion (127.0.0.1:{jump.port}): unknown SSH host key")
    finally:
        jump.stop()


# -- the real runner over SSH ---------------------------------------------------------


@pytest.fixture
def two_ssh_hosts(server: SSHServer, tmp_path: Path) -> Inventory:
    """Hosts a and b, both this machine through sshd."""
    (tmp_path / "inventory").mkdir()
    known_hosts(tmp_path / "inventory" / "known_hosts", server.known_hosts_line)
    path = tmp_path / "inventory" / "inventory.yaml"
    path.write_text(f"""\
all:
  vars:
    ansible_host: 127.0.0.1
    ansible_port: {server.port}
    ansible_user: root
    ansible_ssh_private_key_file: {server.client_key}
    ansible_python_interpreter: {sys.executable}
    ssh_known_hosts_file: known_hosts
    data_address: 127.0.0.1
  hosts:
    a:
    b:
""")
    return load_inventory(path)


def run_over_ssh(inventory: Inventory, options: Options, tmp_path: Path) -> RunOutcome:
    """The real plan through the real runner, which reaches every host with SSHTransport."""
    settings = SSHSettings(connect_timeout=5.0, ssh_config=str(tmp_path / "no_ssh_config"))
    return run_plan(build_plan(inventory, options), ssh=settings)


def test_runner_over_ssh_passes_p2p_and_all_reduce(two_ssh_hosts: Inventory, server: SSHServer,
                                                    tmp_path: Path) -> None:
    assert all(isinstance(transport_for(h), SSHTransport) for h in two_ssh_hosts.hosts)
    outcome = run_over_ssh(two_ssh_hosts, Options(tuple(registry.select(["p2p", "all-reduce"]))), tmp_path)
    reports = judge(outcome)
    assert outcome.status == "completed"
    assert {r.name: (r.status, r.reason) for r in reports} == {"p2p": ("pass", ""), "all-reduce": ("pass", "")}
    assert [s.spec.host for s in outcome.ranks] == ["a", "b"]
    assert len(outcome.ports) == 1 and outcome.master_port == outcome.ports[0]  # held on rank 0's host
    assert not (server.tmp / outcome.plan.run_name).exists()  # made in the hosts' own TMPDIR, and removed
    assert live_pids_with(outcome.plan.token) == []


def test_runner_over_ssh_stops_a_hung_rank_and_leaves_nothing(two_ssh_hosts: Inventory, server: SSHServer,
                                                              tmp_path: Path) -> None:
    hangs = tmp_path / "p2p_hangs.py"  # rank 1 never answers; rank 0 waits for it in the barrier
    hangs.write_text("import time\n\n\ndef run(rank):\n    if rank == 1:\n        time.sleep(600)\n"
                     "    return {}\n")
    options = Options(tuple(registry.select(["p2p"])), timeout=5, solution=str(hangs))
    started = time.monotonic()
    outcome = run_over_ssh(two_ssh_hosts, options, tmp_path)
    assert outcome.status == "timeout" and 1 in outcome.hung
    assert time.monotonic() - started < 30
    # The stack dump (SIGUSR1 over SSH) came back on stderr and located the hang.
    assert outcome.ranks[1].stopped_at == "p2p_hangs.py:6 in run: time.sleep(600)"
    assert wait_until_gone(outcome.plan.token, 5.0) == []
    assert not (server.tmp / outcome.plan.run_name).exists()


def test_the_master_address_is_asked_of_the_host_when_the_inventory_names_it(server: SSHServer,
                                                                            tmp_path: Path) -> None:
    known = known_hosts(tmp_path / "known_hosts", f"[localhost]:{server.port} {server.host_public}\n")
    named = replace(ssh_host(server, known), address="localhost")  # a name, as an ssh alias would be
    settings = SSHSettings(connect_timeout=5.0, ssh_config=str(tmp_path / "no_ssh_config"))
    inventory = with_master_address(Inventory("inv.yaml", (named,)), settings)
    assert inventory.hosts[0].data_address == "127.0.0.1"  # what sshd says this connection reached
    assert inventory.hosts[0].peer_address == "127.0.0.1"
    literal = Inventory("inv.yaml", (ssh_host(server, known),))
    assert with_master_address(literal, settings) is literal  # an address needs no asking
