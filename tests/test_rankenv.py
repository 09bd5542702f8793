"""What the user adds to every rank's environment (lab.core.rankenv): read, checked, forwarded."""
from __future__ import annotations

from pathlib import Path

import pytest

from lab.core import rankenv
from lab.errors import UsageError


def test_an_env_file_is_key_value_lines_with_comments_exports_and_quotes(tmp_path: Path) -> None:
    path = tmp_path / "job.env"
    path.write_text("# settings\n\nexport A=1\nB='two words'\nC=\"x=y\"\nD=\n")
    assert rankenv.read_env_file(str(path)) == {"A": "1", "B": "two words", "C": "x=y", "D": ""}


@pytest.mark.parametrize("line", ["NOEQUALS", "1A=x", "A B=x", "=x"])
def test_a_bad_line_is_one_error_naming_the_file_and_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "job.env"
    path.write_text(f"OK=1\n{line}\n")
    with pytest.raises(UsageError, match=rf"^{path}:2: .* is not KEY=VALUE"):
        rankenv.read_env_file(str(path))


def test_a_missing_env_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--env-file .*nope: No such file"):
        rankenv.read_env_file(str(tmp_path / "nope"))


def test_the_conventional_names_and_the_patterns_are_forwarded() -> None:
    environ = {"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0", "TORCH_SHOW_CPP_STACKTRACES": "1",
               "OMP_NUM_THREADS": "2", "HOME": "/root", "MY_A": "1", "MYB": "2", "SECRET": "x"}
    assert rankenv.forwarded(environ, ["MY_*"]) == {
        "NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": "eth0", "TORCH_SHOW_CPP_STACKTRACES": "1",
        "OMP_NUM_THREADS": "2", "MY_A": "1"}


def test_the_runs_own_settings_are_left_out_and_named() -> None:
    kept, left_out = rankenv.without_reserved({"RANK": "3", "LAB_TOKEN": "x", "FOO": "1", "MASTER_ADDR": "h"})
    assert kept == {"FOO": "1"} and left_out == ["LAB_TOKEN", "MASTER_ADDR", "RANK"]


def test_the_callers_python_path_goes_as_far_as_it_lies_in_the_project(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    given = f"{project / 'src'}::{project}:{tmp_path / 'other'}:relative"
    kept, left_out = rankenv.project_python_path(given, project.resolve(), "${run_dir}/work")
    assert kept == "${run_dir}/work/src:${run_dir}/work"
    assert left_out == [str(tmp_path / "other"), "relative"]  # (relative: to the caller's folder, not the project)
