"""A root script's rewrite of a host's file (lab.core.hostfiles), run by sh on real filesystems: a
full disk leaves the file as it was, whether it can be renamed over or is a bind mount (a
container's /etc/hosts), and says so in one line; nothing is left beside it. The scripts the lab
runs as root (the overlay's /etc/hosts, the faults') are made with it."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.containerlab import faults
from lab.core.hostfiles import rewrite
from lab.net import wireguard

HOSTS = "127.0.0.1 localhost\n10.0.0.1 node1-labwg0 # lab-overlay\n"


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs of our own (root: mount), unmounted after."""
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but this test needs root, to mount a tmpfs")
        pytest.skip("mounting a tmpfs takes root")
    where = tmp_path / "tiny"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> None:
    subprocess.run(["dd", "if=/dev/zero", f"of={folder / 'fill'}", "bs=1k", "count=1000"], capture_output=True)


def sh(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30)


def overlay_hosts(path: Path) -> str:
    return wireguard.hosts_script([wireguard.Member("node2", "10.0.0.2", "10.9.0.2", "k")], hosts=str(path))


def test_a_file_is_rewritten_whole_and_a_full_disk_leaves_it_as_it_was(tiny: Path) -> None:
    hosts = tiny / "hosts"
    hosts.write_text(HOSTS)
    hosts.chmod(0o644)
    done = sh(overlay_hosts(hosts))
    assert done.returncode == 0, done.stderr
    assert hosts.read_text() == ("127.0.0.1 localhost\n10.9.0.2 node2-labwg0 # lab-overlay\n"
                                 "::ffff:10.9.0.2 node2-labwg0 # lab-overlay\n")
    assert oct(hosts.stat().st_mode & 0o777) == "0o644"
    before = hosts.read_text()
    fill(tiny)
    failed = sh(overlay_hosts(hosts))
    assert failed.returncode != 0
    assert failed.stderr.splitlines()[-1] == f"cannot make {hosts} anew (is the disk full?): left as it was"
    assert hosts.read_text() == before
    assert sorted(p.name for p in tiny.iterdir()) == ["fill", "hosts"]  # no new file left


def test_a_bind_mounted_file_is_written_in_place_and_a_full_disk_leaves_it_as_it_was(tiny: Path,
                                                                                     tmp_path: Path) -> None:
    """As a container's /etc/hosts: the engine's file bind-mounted over a path that cannot be
    renamed over; the new content made beside that path (here, room enough), written in place
    only once the room for it is taken on the file's own (full) filesystem."""
    source, etc = tiny / "hosts", tmp_path / "etc"
    source.write_text(HOSTS)
    etc.mkdir()
    target = etc / "hosts"
    target.write_text("")
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        done = sh(overlay_hosts(target))
        assert done.returncode == 0, done.stderr
        assert "node2-labwg0" in source.read_text() and "node1-labwg0" not in source.read_text()  # in place
        fill(tiny)
        many = [wireguard.Member(f"node{i}", f"10.0.0.{i}", f"10.9.0.{i}", "k") for i in range(2, 200)]
        before = source.read_text()
        failed = sh(wireguard.hosts_script(many, hosts=str(target)))
        assert failed.returncode != 0
        assert failed.stderr.splitlines()[-1] == f"no room to write {target} (is the disk full?): left as it was"
        assert source.read_text() == before
        assert sorted(p.name for p in etc.iterdir()) == ["hosts"]
        (tiny / "fill").unlink()
        assert sh(wireguard.hosts_script([], hosts=str(target))).returncode == 0  # smaller: it fits
        assert source.read_text() == "127.0.0.1 localhost\n"
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_a_make_that_fails_leaves_the_file() -> None:
    script = rewrite("/nonexistent-dir/file", "echo new")
    done = sh(script)
    assert done.returncode != 0 and done.stderr.splitlines()[-1] == \
        "cannot write beside /nonexistent-dir/file: left as it was"


def test_every_fault_that_rewrites_a_file_does_it_whole() -> None:
    """The faults' /etc/hosts and sshd_config changes go through the rewrite, break and fix alike."""
    for kind in ("loopback-hostname", "wrong-ifname", "slow-dns"):
        for script in faults.FAULTS[kind].in_host:
            assert "lab_rewrite " in script, (kind, script)
