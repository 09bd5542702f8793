"""What `lab launch` carries of a project (lab.core.workdir): its folder, as git would see it."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lab.core import workcache, workdir
from lab.errors import RunError, UsageError
from lab.inventory.model import Host


def project(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


def test_the_project_is_its_files_less_what_gitignore_and_exclude_leave_out(tmp_path: Path) -> None:
    root = project(tmp_path / "proj", {
        "train.py": "", "helper.py": "", "pkg/__init__.py": "", "pkg/model.py": "", "conf/run.yaml": "",
        ".gitignore": "*.log\noutputs/\n", "run.log": "", "outputs/ckpt.pt": "", "pkg/.gitignore": "scratch.py\n",
        "pkg/scratch.py": "", "scratch.py": "", "data/big.bin": "", ".git/HEAD": "", "pkg/__pycache__/m.pyc": ""})
    (root / "outside").symlink_to(tmp_path)  # (a folder link: not followed)
    (tmp_path / "secret.txt").write_text("x")
    (root / "leak.txt").symlink_to(tmp_path / "secret.txt")  # (a file out of the folder: left out)
    (root / "alias.py").symlink_to(root / "helper.py")  # (inside: carried as the file)
    found = workdir.collect(root, ("data/",))
    assert [r for r, _ in found.files] == [".gitignore", "alias.py", "conf/run.yaml", "helper.py", "pkg/.gitignore",
                                           "pkg/__init__.py", "pkg/model.py", "scratch.py", "train.py"]
    assert sorted(found.skipped) == ["leak.txt", "outside"]
    assert found.relative(root / "pkg" / "model.py") == "pkg/model.py"


def test_a_project_over_the_cap_is_one_line_naming_its_largest_files(tmp_path: Path) -> None:
    root = project(tmp_path / "proj", {"train.py": "x" * 100})
    (root / "data.bin").write_bytes(os.urandom(3 << 20))
    with pytest.raises(UsageError) as caught:
        workdir.collect(root, max_mb=2)
    message = str(caught.value)
    assert "3.0 MiB of files is more than --max-workdir-size 2 MiB (the largest: data.bin (3.0 MiB)" in message
    assert "\n" not in message
    assert workdir.collect(root, ("*.bin",), max_mb=2).size == 100


def test_a_workdir_that_is_no_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a folder"):
        workdir.collect(tmp_path / "nope")


NESTED = {"train.py": "", ".gitignore": "*.bin\n*.pkl\nbuild/\n", "x.bin": "", "data/.gitignore": "!*.bin\n",
          "data/train.bin": "", "data/meta.pkl": "", "build/.gitignore": "!keep.txt\n", "build/keep.txt": ""}


def carried(found: workdir.Workdir) -> list[str]:
    return [r for r, _ in found.files]


def test_ignore_rules_are_gits_the_deepest_file_decides_and_a_folder_left_out_keeps_its_files_out(
        tmp_path: Path) -> None:
    root = project(tmp_path / "proj", NESTED)
    # (no repository: the .gitignore files read as git reads them; data/'s negation brings its .bin back)
    assert carried(workdir.collect(root)) == [".gitignore", "data/.gitignore", "data/train.bin", "train.py"]


def test_in_a_git_work_tree_git_itself_says_what_is_left_out(tmp_path: Path) -> None:
    root = project(tmp_path / "proj", {**NESTED, "notes.md": "", "local.cfg": ""})
    for command in (["init", "-q"], ["add", "-f", "data/meta.pkl"]):  # (a tracked file is carried, whatever its name)
        subprocess.run(["git", "-C", str(root), *command], check=True, capture_output=True, timeout=30)
    (root / ".git" / "info" / "exclude").write_text("local.cfg\n")
    assert carried(workdir.collect(root)) == [".gitignore", "data/.gitignore", "data/meta.pkl", "data/train.bin",
                                              "notes.md", "train.py"]


def test_include_brings_back_what_the_ignore_rules_leave_out_and_the_data_they_leave_out_is_named(
        tmp_path: Path) -> None:
    root = project(tmp_path / "proj", {"train.py": "", ".gitignore": "*.bin\n*.pkl\nout/\n*.log\n",
                                       "data/train.bin": "x" * 10, "data/meta.pkl": "x", "run.log": "", "out/c.pt": ""})
    found = workdir.collect(root)
    assert carried(found) == [".gitignore", "train.py"]
    assert found.ignored_data == (("data/meta.pkl", 1), ("data/train.bin", 10))  # (not run.log, nor out/ whole)
    found = workdir.collect(root, includes=("data/*.bin", "out/"), excludes=("*.pt",))
    assert carried(found) == [".gitignore", "data/train.bin", "train.py"]  # (--exclude wins over --include)
    assert found.ignored_data == (("data/meta.pkl", 1),)


class Sees:
    """A host as check_shared asks it (``stat`` of a path): what it says, and its status."""

    def __init__(self, status: int, said: str) -> None:
        self.host = Host("node2", "10.0.0.2", shared_dir="/nfs")
        self.answer = (status, said)

    def call(self, argv: list[str], timeout: float) -> tuple[int, str]:
        return self.answer


@pytest.mark.parametrize(("status", "said", "seen"), [
    (1, "stat: cannot stat", "is not there"),
    (0, "12 1700000000\n", "is another file there (size and time '12 1700000000', here '{expected}')"),
])
def test_a_host_that_does_not_see_the_shared_project_is_named_with_the_way_out(tmp_path: Path, status: int,
                                                                             said: str, seen: str) -> None:
    probe = tmp_path / "train.py"
    probe.write_text("print('hi')\n")
    expected = f"{probe.stat().st_size} {int(probe.stat().st_mtime)}"
    workcache.check_shared(Sees(0, expected + "\n"), str(tmp_path), probe)  # type: ignore[arg-type]
    with pytest.raises(RunError) as refused:
        workcache.check_shared(Sees(status, said), str(tmp_path), probe)  # type: ignore[arg-type]
    assert str(refused.value) == (
        f"host node2: the project {tmp_path} lies in its shared_dir /nfs, but {probe} {seen.format(expected=expected)}"
        ": the host does not share this machine's folder (mount it there, or launch from a folder outside "
        "shared_dir: the project is then carried)")
