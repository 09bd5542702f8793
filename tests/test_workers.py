"""The suite on several workers (make test): the tests of one group run in one worker, one after
another, as tests/conftest.py asks; a pytest or pytest-xdist that stopped grouping would let two
tests of the default lab change it at once."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os, time
import pytest

@pytest.mark.xdist_group("one-lab")
@pytest.mark.parametrize("n", range(4))
def test_grouped(n):
    with open("workers.log", "a") as log:
        log.write(f"grouped {os.environ['PYTEST_XDIST_WORKER']}\\n")
    time.sleep(0.2)

@pytest.mark.parametrize("n", range(4))
def test_free(n):
    time.sleep(0.2)
'''


def test_a_group_runs_in_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "--no-loadscope-reorder", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTEST_ADDOPTS": ""})  # (its own options alone, not the outer run's)
    assert done.returncode == 0 and "8 passed" in done.stdout, done.stdout + done.stderr
    workers = (tmp_path / "workers.log").read_text().split()
    assert workers.count("grouped") == 4 and len(set(workers) - {"grouped"}) == 1, workers

