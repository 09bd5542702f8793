"""What a launch's requirements file says to the lab (lab.core.requirements), and the wheels this
machine gets for a host (lab.core.hostenv): pip's format read as pip reads it, one line naming
the file and line for what cannot go to a host, and a host of another Python given wheels for it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lab.core import hostenv
from lab.core.requirements import read
from lab.errors import RunError, UsageError

from .wheels import LABTOK, make_wheel


def test_the_file_is_read_as_pip_reads_it(tmp_path: Path) -> None:
    """Comments, a line continued by a backslash, a nested -r and a -c file, index options (a
    local --find-links made absolute) and a wheel file (its name and version, its folder found)."""
    (tmp_path / "base.txt").write_text("numpy>=1.26  # torch's\n")
    (tmp_path / "pins.txt").write_text("numpy<3\n")
    make_wheel(tmp_path / "wheels", "labtok", "1.2", LABTOK)
    (tmp_path / "requirements.txt").write_text(
        "# the project's\n-r base.txt\n--constraint pins.txt\n--find-links wheels\n--index-url=https://pypi.org/simple\n"
        "tqdm \\\n  >=4.0\nwheels/labtok-1.2-py3-none-any.whl\n\nregex ; python_version >= '3.8'\n")
    found = read(tmp_path / "requirements.txt")
    assert found.lines == ("numpy>=1.26", "tqdm>=4.0", "labtok==1.2", 'regex; python_version >= "3.8"')
    assert found.index == ("--constraint", str(tmp_path / "pins.txt"), "--find-links", str(tmp_path / "wheels"),
                           "--index-url", "https://pypi.org/simple", "--find-links", str(tmp_path / "wheels"))
    assert found.text == "numpy>=1.26\ntqdm>=4.0\nlabtok==1.2\nregex; python_version >= \"3.8\"\n"


def test_the_key_follows_what_the_hosts_install_and_how(tmp_path: Path) -> None:
    file = tmp_path / "requirements.txt"
    file.write_text("tqdm>=4.0\n")
    first = read(file).key
    file.write_text("# a comment changes nothing\ntqdm >= 4.0\n")
    assert read(file).key == first
    file.write_text("tqdm>=4.1\n")
    assert read(file).key != first
    file.write_text("--index-url https://example.invalid/simple\ntqdm>=4.0\n")
    assert read(file).key != first


@pytest.mark.parametrize(("text", "fault"), [
    ("numpy\n-e ./tokenizer\n", "2: -e: not what the lab can install on the hosts (it installs wheels: build one "
                                "and name its file)"),
    ("./tokenizer\n", "1: ./tokenizer: a folder; the lab installs wheels on the hosts (build one and name its file)"),
    ("labtok @ https://example.invalid/labtok.tar.gz\n", "1: labtok @ a URL: name its wheel file, or a version"),
    ("numpy==\n", "1: not a requirement: Expected"),
    ("wheels/labtok-2.0-py3-none-any.whl\n", "1: {dir}/wheels/labtok-2.0-py3-none-any.whl: no such wheel"),
    ("labtok.whl\n", "1: labtok.whl: not a wheel's file name"),
    ("-r loop.txt\n", " reads {dir}/requirements.txt, which reads it: a loop"),
])
def test_what_cannot_go_to_a_host_is_one_line_naming_the_file_and_line(tmp_path: Path, text: str, fault: str) -> None:
    (tmp_path / "loop.txt").write_text("-r requirements.txt\n")
    (tmp_path / "requirements.txt").write_text(text)
    with pytest.raises(UsageError) as refused:
        read(tmp_path / "requirements.txt")
    said = str(refused.value)
    assert "\n" not in said
    where = tmp_path / ("loop.txt" if "loop" in text else "requirements.txt")
    assert said.startswith(f"{where}:{fault.format(dir=tmp_path)}"), said


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--requirements .*none\.txt: cannot read it \(No such file or directory\)"):
        read(tmp_path / "none.txt")


@pytest.mark.local
def test_a_host_of_another_python_gets_wheels_for_its_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip downloads the wheels for the host's Python (binary wheels for it alone): a wheel made
    for another Python is not taken, and none at all is one line naming the host."""
    other = f"{sys.version_info[0]}.{sys.version_info[1] + 1}"
    make_wheel(tmp_path / "wheels", "labtok", "1.0", LABTOK)
    (tmp_path / "requirements.txt").write_text("--no-index\n--find-links wheels\nlabtok==1.0\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wheels = hostenv.wheels_for(read(tmp_path / "requirements.txt"), other, "x86_64", "node1")
    assert [w.name for w in wheels] == ["labtok-1.0-py3-none-any.whl"]
    assert wheels[0].parent.parent == tmp_path / "cache" / "lab" / "wheels"
    make_wheel(tmp_path / "own", "ownpy", "1.0", {"ownpy/__init__.py": ""}).rename(
        tmp_path / "own" / f"ownpy-1.0-cp{sys.version_info[0]}{sys.version_info[1]}-none-any.whl")
    (tmp_path / "own.txt").write_text("--no-index\n--find-links own\nownpy==1.0\n")
    with pytest.raises(RunError, match=rf"^host node1: cannot get the packages of .*own\.txt for its "
                                               rf"Python {other} on x86_64: No matching distribution found for "
                                               r"ownpy==1\.0$"):
        hostenv.wheels_for(read(tmp_path / "own.txt"), other, "x86_64", "node1")
