"""The warm start (lab.rank.warm): a launch forked from a server that imported torch once runs as the
cold start runs it (the same verdicts, nothing left behind), and only the user's own server, only
for a launch it can take as it would have started, is ever used."""
from __future__ import annotations

import os
import pwd
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.core.plan import Options
from lab.core.planner import build_plan
from lab.inventory.model import Host, Inventory
from lab.rank import warm
from lab.suite import registry

from .conftest import REPO, Lab, WarmServer

WHY = REPO / "tests" / "why"


def request(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"argv": ["fork", "--nprocs", "2", "--first-rank", "0", "-m", "lab.rank.worker"],
                               "env": {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/run/code", "LAB_TOKEN": "t"},
                               "cwd": "/tmp", "umask": 0o077, "executable": os.path.realpath(sys.executable),
                               "limits": warm.own_limits()}
    return {**base, **overrides}


SERVER = {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/opt/lab", "HOME": "/home/lab"}


def opts(*names: str, **kw: object) -> Options:
    return Options(tuple(registry.select(list(names))), **kw)  # type: ignore[arg-type]


def test_a_launch_as_the_server_would_start_it_is_taken_whatever_its_own_settings() -> None:
    assert warm.cold_reason(request(), SERVER, warm.own_limits()) is None


@pytest.mark.parametrize("change, reason", [
    ({"argv": ["torchrun", "--nproc-per-node", "2"]}, "only --launcher lab's zygote starts warm"),
    ({"env": {"PYTHONPATH": "/run/code"}}, "OMP_NUM_THREADS is not the server's"),  # (unset: libgomp's own)
    ({"env": {"OMP_NUM_THREADS": "1", "TORCH_SHOW_CPP_STACKTRACES": "1"}}, "TORCH_SHOW_CPP_STACKTRACES is not"),
    ({"env": {"OMP_NUM_THREADS": "1", "LD_PRELOAD": "/x.so"}}, "LD_PRELOAD is not the server's"),
    ({"env": {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}}, "PYTHONHASHSEED is not the server's"),
    ({"executable": "/usr/bin/python2"}, "another Python"),
    ({"env": {"OMP_NUM_THREADS": 1}}, "no environment"),
    ({"umask": "077"}, "no folder or umask"),
    ({"limits": {}}, "no RLIMIT_"),
])
def test_a_launch_the_server_would_not_start_as_it_would_have_started_goes_cold(change: dict[str, object],
                                                                                 reason: str) -> None:
    said = warm.cold_reason(request(**change), SERVER, warm.own_limits())
    assert said is not None and said.startswith(reason)


def test_the_server_starts_with_what_the_lab_gives_every_launch_on_a_host() -> None:
    """What the plan gives a container host's launch, and what the server starts with, agree wherever
    it matters as torch loads (else no launch on the lab would start warm)."""
    host = Host("node1", "10.0.0.9", slots=2, connection="ssh")
    for options in (opts("p2p"), opts("all", trace=True)):
        launch = build_plan(Inventory("inventory.yaml", (host,)), options, "t0k3n").launches[0]
        server_env = {"PATH": "/usr/bin:/bin", "HOME": "/home/lab", "PYTHONPATH": "/opt/lab", **warm.LAUNCH_ENV}
        assert warm.cold_reason(request(env=dict(launch.env)), server_env, warm.own_limits()) is None


def test_limits_the_server_cannot_give_go_cold_and_lower_ones_are_taken() -> None:
    limits = {"RLIMIT_NOFILE": [1024, 4096]}
    lower = {"RLIMIT_NOFILE": [256, 1024]}
    assert warm.cold_reason(request(limits=lower), SERVER, limits) is None
    said = warm.cold_reason(request(limits={"RLIMIT_NOFILE": [1024, 8192]}), SERVER, limits)
    assert said == "RLIMIT_NOFILE beyond the server's"
    infinite = resource.RLIM_INFINITY
    assert warm.cold_reason(request(limits={"RLIMIT_NOFILE": [1024, infinite]}), SERVER, limits) is not None
    assert warm.cold_reason(request(limits={"RLIMIT_NOFILE": [infinite, infinite]}),
                            SERVER, {"RLIMIT_NOFILE": [infinite, infinite]}) is None


def test_frames_carry_json_and_a_peer_that_closes_early_is_no_frame() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(warm.frame({"pid": 7}) + warm.frame({"go": True})[:3])
        ours.shutdown(socket.SHUT_WR)
        assert warm.read_frame(theirs) == {"pid": 7}
        with pytest.raises(ValueError):
            warm.read_frame(theirs)


# -- on this machine: a real server, real launches ------------------------------------------------------


@pytest.fixture
def server() -> Iterator[WarmServer]:
    with tempfile.TemporaryDirectory() as root:
        started = WarmServer(Path(root))
        yield started
        started.stop()


def warm_lab(server: WarmServer) -> Lab:
    """A lab whose runs are forked from this test's own server (not the tests' shared one)."""
    lab = Lab(cold=True)
    lab.env[warm.WARM_DIR_VAR] = str(server.root)
    return lab


@pytest.mark.local
def test_a_run_is_forked_from_the_warm_server_passes_and_leaves_nothing(server: WarmServer) -> None:
    result = warm_lab(server)("run", "p2p", "all-reduce", "--nproc", "4")
    assert result.code == 0, result.text
    assert "2 passed, 0 failed" in result.out
    assert server.served == 1  # (a run's exercises are one launch a host)
    assert server.left_below() == []


@pytest.mark.local
def test_a_hang_through_the_warm_start_is_named_as_the_cold_start_names_it(server: WarmServer) -> None:
    lab = warm_lab(server)
    result = lab("launch", "--nproc", "4", "--hang-after", "3", str(WHY / "recv_cycle.py"))
    assert result.code == 4, result.text
    assert "every rank receives first" in result.out and "recv_cycle.py:17" in result.out, result.text
    assert server.served == 1
    assert server.left_below() == []


DAEMON = """\
import os, sys, time
if os.environ["RANK"] == "1" and os.fork() == 0:  # a daemon that means to outlive the run
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
print("rank", os.environ["RANK"], "done", flush=True)
"""


@pytest.mark.local
def test_a_daemon_a_rank_leaves_is_swept_and_ctrl_c_leaves_nothing(server: WarmServer, tmp_path: Path) -> None:
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    lab = warm_lab(server)
    result = lab("launch", "--nproc", "2", str(script))
    assert result.code == 0, result.text
    assert server.left_below() == []
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(600)\n")
    proc = lab.popen("launch", "--nproc", "3", str(sleeper))
    deadline = time.monotonic() + 60
    while len(server.below()) < 5 and time.monotonic() < deadline:  # (its keeper, its zygote, 3 ranks)
        time.sleep(0.2)
    proc.send_signal(2)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert server.served == 2
    assert server.left_below() == []


@pytest.mark.local
def test_a_launch_writes_its_temporary_files_where_its_own_tmpdir_says(tmp_path: Path) -> None:
    """Python reads TMPDIR once: a server that had asked (here its site's customization did) must not
    hand its folder on to the launches it forks."""
    site, theirs, ours, root = (tmp_path / name for name in ("site", "server-tmp", "launch-tmp", "warm"))
    for folder in (site, theirs, ours, root):
        folder.mkdir()
    (site / "sitecustomize.py").write_text("import tempfile\ntempfile.gettempdir()\n")
    program = tmp_path / "where.py"
    program.write_text("import tempfile\nprint('temp:', tempfile.gettempdir(), flush=True)\n")
    server = WarmServer(root, {"PYTHONPATH": f"{REPO}:{site}", "TMPDIR": str(theirs)})
    try:
        lab = warm_lab(server)
        lab.env["TMPDIR"] = str(ours)
        result = lab("launch", "--nproc", "1", str(program))
    finally:
        server.stop()
    assert result.code == 0, result.text
    assert server.served == 1
    assert f"temp: {ours}" in result.out, result.out


@pytest.mark.local
def test_a_launch_the_server_cannot_take_starts_cold_and_says_why_in_its_log(server: WarmServer) -> None:
    result = warm_lab(server)("launch", "--nproc", "2", "--env", "TORCH_SHOW_CPP_STACKTRACES=1",
                              str(WHY / "healthy_loop.py"))
    assert result.code == 0, result.text
    assert server.served == 0
    assert "a launch starts cold: TORCH_SHOW_CPP_STACKTRACES is not the server's" in server.log


@pytest.mark.local
@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to be another user")
def test_only_the_users_own_server_in_a_folder_of_its_own_is_ever_used(server: WarmServer) -> None:
    nobody = pwd.getpwnam("nobody")
    os.chown(server.folder, nobody.pw_uid, -1)  # (a folder of another user's where this user looks)
    result = warm_lab(server)("run", "p2p", "--nproc", "2")
    assert result.code == 0, result.text
    assert server.served == 0
    os.chown(server.folder, os.getuid(), -1)
    for folder in (server.root, server.folder):  # (let another user reach the socket: the server must refuse it)
        os.chmod(folder, 0o711)
    os.chmod(server.folder / warm.SOCKET, 0o777)
    child = os.fork()
    if child == 0:  # another user's process offers a launch, its streams with it
        code = 2
        try:
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(str(server.folder / warm.SOCKET))
                try:
                    socket.send_fds(conn, [warm.frame(request())], [0, 1, 2])
                    code = 0 if conn.recv(100) == b"" else 1  # (closed unanswered)
                except (BrokenPipeError, ConnectionResetError):  # (closed before it could even ask)
                    code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
    assert server.served == 0
    assert "a launch starts cold: a peer of another user" in server.log
