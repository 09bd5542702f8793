"""What a host sends back of a launch's project (lab.core.bringback) is taken as a hostile host could
send it: this machine's own processes as the hosts, one of them sending a tar of its own making."""
from __future__ import annotations

import io
import os
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from lab.core import bringback
from lab.core.workcache import MARK
from lab.inventory.model import Host
from lab.transport.base import RankProcess
from lab.transport.local import LocalTransport

pytestmark = pytest.mark.local


class Sends(LocalTransport):
    """A host whose tar stream of what its ranks wrote is ``archive``; its other commands are its own."""

    def __init__(self, name: str, archive: bytes, run_dir: Path) -> None:
        super().__init__(Host(name, "127.0.0.1", connection="local"))
        self.archive, self.run_dir = archive, str(run_dir)

    def start(self, argv: Sequence[str], env: object, cwd: str) -> RankProcess:  # type: ignore[override]
        if bringback.SEND not in argv:
            return super().start(argv, {}, cwd)
        sent = Path(self.run_dir, "sent.tar")
        sent.write_bytes(self.archive)
        return super().start([sys.executable, "-c", f"import sys; sys.stdout.buffer.write(open({str(sent)!r}, "
                                                    "'rb').read())"], {}, "/")


def archive(*members: tuple[str, bytes, bytes]) -> bytes:
    """A tar of (name, type, bytes) members: a file's type is tarfile.REGTYPE, a link's SYMTYPE
    (its bytes the target)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE:
                info.linkname = data.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("evil", [("../outside.txt", tarfile.REGTYPE, b"x"),
                                  ("/tmp/lab-abs.txt", tarfile.REGTYPE, b"x"),
                                  ("out/link", tarfile.SYMTYPE, b"/etc/passwd")])
def test_a_host_that_sends_a_path_outside_its_copy_lands_nothing_and_is_named(tmp_path: Path,
                                                                               evil: tuple[str, bytes, bytes]) -> None:
    project, run_dir = tmp_path / "proj", tmp_path / "run"
    project.mkdir()
    run_dir.mkdir()
    host = Sends("node2", archive(("out/ok.txt", tarfile.REGTYPE, b"fine"), evil), run_dir)
    brought, keep = bringback.bring_back({"node2": host}, project, "node2", since=0.0)
    assert keep == {"node2"} and brought.files == []
    [line] = brought.lines()
    assert line.startswith("not brought back: node2: could not send what its ranks wrote (it sent "), line
    assert line.endswith(f"); it stays in {run_dir}/work on node2"), line
    assert sorted(p.name for p in project.rglob("*")) == [] and not (tmp_path / "outside.txt").exists()
    assert not Path("/tmp/lab-abs.txt").exists()
    assert f"(it sent {evil[0]!r}, {'not a file' if evil[1] == tarfile.SYMTYPE else 'not a path in its copy'});" \
        in line, line


def test_what_hosts_send_past_the_bound_lands_nothing_and_each_says_how_much(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    hosts = {}
    for name in ("node1", "node2"):
        (tmp_path / name / "work").mkdir(parents=True)
        (tmp_path / name / MARK).touch()
        os.utime(tmp_path / name / MARK, (1e9, 1e9))  # (the project's copy, whole long ago)
        (tmp_path / name / "work" / "ckpt.pt").write_bytes(b"\0" * 3000)
        hosts[name] = Sends(name, archive(("ckpt.pt", tarfile.REGTYPE, b"\0" * 3000)), tmp_path / name)
    brought, keep = bringback.bring_back(hosts, project, "node1", since=0.0, max_bytes=5000)
    assert keep == {"node1", "node2"} and not (project / "ckpt.pt").exists() and list(project.iterdir()) == []
    assert brought.lines() == [f"not brought back: {n}: 2.9 KiB in 1 file(s), more than --bring-back-max 4.9 KiB "
                               f"in all; they stay in {tmp_path / n}/work on {n}" for n in ("node1", "node2")]


def test_what_hosts_agree_on_comes_once_and_what_they_do_not_comes_from_each(tmp_path: Path) -> None:
    """Two hosts (this machine's, each its own copy, their own find, sha256sum and tar): a checkpoint
    both wrote alike comes from rank 0's host alone, to its place; a log each wrote its own way, rank
    0's host's to its place and the other's under .lab/hosts/; a file only the other wrote, to its place."""
    project = tmp_path / "proj"
    project.mkdir()
    hosts = {}
    for name, log in (("node1", "rank 0"), ("node2", "rank 1")):
        copy = tmp_path / name / "work"
        (copy / "out").mkdir(parents=True)
        (tmp_path / name / MARK).touch()
        os.utime(tmp_path / name / MARK, (1e9, 1e9))
        (copy / "out" / "ckpt.pt").write_bytes(b"step 10" * 10000)
        (copy / "out" / "log.txt").write_text(log)
        hosts[name] = LocalTransport(Host(name, "127.0.0.1", connection="local"))
        hosts[name].run_dir = str(tmp_path / name)
    (tmp_path / "node2" / "work" / "out" / "eval.json").write_text("{}")
    (tmp_path / "node2" / "work" / "__pycache__").mkdir()
    (tmp_path / "node2" / "work" / "__pycache__" / "x.pyc").write_text("never the job's")
    sent: list[tuple[str, tuple[str, ...]]] = []
    fetch = bringback._fetch

    def fetched(transport: LocalTransport, into: Path, budget: object, paths: Sequence[str] = ()) -> dict[str, bytes]:
        sent.append((transport.host.name, tuple(paths)))
        return fetch(transport, into, budget, paths)  # type: ignore[arg-type]

    bringback._fetch = fetched  # type: ignore[assignment]
    try:
        brought, keep = bringback.bring_back(hosts, project, "node1", since=0.0)
    finally:
        bringback._fetch = fetch
    assert keep == set() and sorted((name, sorted(paths)) for name, paths in sent) == [
        ("node1", []), ("node2", ["out/eval.json", "out/log.txt"])], sent  # (node1: all it wrote; node2: its own)
    assert sorted(brought.files) == ["out/ckpt.pt", "out/eval.json", "out/log.txt"]
    assert brought.aside == [".lab/hosts/node2/out/log.txt"]
    assert (project / "out" / "ckpt.pt").read_bytes() == b"step 10" * 10000
    assert (project / "out" / "log.txt").read_text() == "rank 0"
    assert (project / ".lab" / "hosts" / "node2" / "out" / "log.txt").read_text() == "rank 1"
    assert not (project / "__pycache__").exists() and sorted(os.listdir(project / ".lab")) == ["hosts"]


def test_thousands_of_files_only_another_host_wrote_all_come_back(tmp_path: Path) -> None:
    """A host's list of what it alone wrote, longer than a pipe holds, goes to its tar while its
    stream comes back: every file lands (the two never wait on each other)."""
    project = tmp_path / "proj"
    project.mkdir()
    hosts = {}
    for name in ("node1", "node2"):
        (tmp_path / name / "work" / "logs").mkdir(parents=True)
        (tmp_path / name / MARK).touch()
        os.utime(tmp_path / name / MARK, (1e9, 1e9))
        hosts[name] = LocalTransport(Host(name, "127.0.0.1", connection="local"))
        hosts[name].run_dir = str(tmp_path / name)
    for i in range(3000):
        (tmp_path / "node2" / "work" / "logs" / f"rank-1-step-{i:05d}-of-a-long-job.txt").write_text(f"step {i}")
    brought, keep = bringback.bring_back(hosts, project, "node1", since=0.0)
    assert keep == set() and len(brought.files) == 3000, brought.lines()
    assert (project / "logs" / "rank-1-step-02999-of-a-long-job.txt").read_text() == "step 2999"
