"""What a run leaves in a host's temp directory, and who sweeps it: a run's controller killed
(SIGKILL: nothing of it cleans up) leaves its run directory; the next run of that user on the host
removes it, once nothing of the killed run has lived there for a day, but never a run's that lives,
one the user kept (--keep) or anything not a run directory of the user's own (lab.rank.reaper)."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.rank.reaper import KEPT, LIVE, STALE_AFTER
from lab.transport.base import keep_command, supervised

from .conftest import Lab

DAY_AND_MORE = STALE_AFTER + 3600


def backdated(path: Path) -> Path:
    """``path`` as a directory nothing touched for over STALE_AFTER seconds."""
    then = time.time() - DAY_AND_MORE
    os.utime(path, (then, then), follow_symlinks=False)
    return path


def left_run_dir(parent: Path, digits: str, kept: bool = False) -> Path:
    path = parent / f"lab-run-{digits}"
    (path / "solution").mkdir(parents=True)
    (path / "solution" / "alice.py").write_text("print('hi')\n")
    if kept:
        (path / KEPT).touch()
    return backdated(path)


@pytest.fixture
def temp_dir() -> Iterator[Path]:
    """A temp directory of the test's own (short: a run keeps its sockets there)."""
    path = Path(tempfile.mkdtemp(prefix="lab-t-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_first_process_of_a_run_sweeps_only_its_users_stale_unkept_unheld_run_dirs(temp_dir: Path) -> None:
    stale = left_run_dir(temp_dir, "a" * 12)
    kept = left_run_dir(temp_dir, "b" * 12, kept=True)
    held = left_run_dir(temp_dir, "c" * 12)
    fresh = temp_dir / f"lab-run-{'d' * 12}"
    fresh.mkdir()
    not_a_run = [left_run_dir(temp_dir, "e" * 11), left_run_dir(temp_dir, "E" * 12)]
    elsewhere = left_run_dir(temp_dir, "elsewhere")
    link = temp_dir / f"lab-run-{'f' * 12}"
    link.symlink_to(elsewhere)
    backdated(link)
    holder = os.open(held / LIVE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_SH)  # (a live process of that run)
    mine = temp_dir / f"lab-run-{'0' * 12}"
    mine.mkdir()
    backdated(mine)
    try:
        done = subprocess.run(supervised(sys.executable, ["true"]), cwd=mine, capture_output=True, timeout=60)
    finally:
        os.close(holder)
    assert done.returncode == 0, done.stderr
    assert not stale.exists()
    assert all(p.exists() for p in (kept, held, fresh, *not_a_run, elsewhere / "solution" / "alice.py", link))
    assert (mine / LIVE).exists() and time.time() - mine.stat().st_mtime < 60  # held, and marked used as it ended

    # the next process of a run that has begun sweeps nothing: only a run's first does
    stale = left_run_dir(temp_dir, "9" * 12)
    subprocess.run(supervised(sys.executable, ["true"]), cwd=mine, check=True, timeout=60)
    assert stale.exists()
    # nor does a process started outside any run directory
    subprocess.run(supervised(sys.executable, ["true"]), cwd=temp_dir, check=True, timeout=60)
    assert stale.exists()


@pytest.mark.local
def test_a_run_removes_a_killed_runs_directory_and_a_kept_one_stays_for_the_next(lab: Lab, temp_dir: Path) -> None:
    lab.env["TMPDIR"] = str(temp_dir)
    left = left_run_dir(temp_dir, "a" * 12)
    result = lab("run", "p2p", "--nproc", "2")
    assert result.code == 0, result.text
    assert list(temp_dir.iterdir()) == []  # the killed run's swept, the run's own removed as it ended

    result = lab("run", "p2p", "--nproc", "2", "--keep")
    assert result.code == 0, result.text
    [kept] = temp_dir.iterdir()
    assert (kept / KEPT).exists()
    backdated(kept)
    left = left_run_dir(temp_dir, "a" * 12)
    result = lab("run", "p2p", "--nproc", "2")
    assert result.code == 0, result.text
    assert list(temp_dir.iterdir()) == [kept]  # the killed one's gone, the kept one stays
    assert not left.exists()


def test_the_command_a_remote_host_marks_a_kept_run_dir_with_leaves_the_mark_a_sweep_passes_by(temp_dir: Path) -> None:
    kept = temp_dir / "lab-run-it's kept"  # (a path the shell must be given quoted)
    kept.mkdir()
    subprocess.run(keep_command(str(kept)), shell=True, check=True, timeout=30)
    assert (kept / KEPT).is_file()
