"""docs/extending.md cannot drift from the code: every `path::name` it points at is a file of the
repository that defines (or assigns) that name, and every `path` alone exists; and its recipes work:
each is followed in a copy of the repository, whose unit tier then passes."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from .conftest import REPO

PAGE = REPO / "docs" / "extending.md"


def test_every_file_and_name_the_extending_page_points_at_exists() -> None:
    text = PAGE.read_text()
    named = re.findall(r"`((?:lab|tests)/[\w/.]+?)::(\w+)`", text)
    paths = re.findall(r"`((?:lab|tests)/[\w/.]+)`", text)
    assert len(named) >= 20, named  # (the page names what to write, not only where)
    missing = [path for path in paths if not (REPO / path).exists()]
    assert missing == []
    for path, name in named:
        source = (REPO / path).read_text()
        defined = re.search(rf"^\s*(?:def|class) {name}\b|^{name}\b.*=", source, re.MULTILINE)
        assert defined is not None, f"{path} defines no {name}"


# -- each recipe followed, in a copy of the repository: the unit tier accepts what it makes ---------


def copy_of_the_repository(into: Path) -> Path:
    """The repository's tracked files (as a clone has them), in ``into``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60)
    for name in filter(None, listed.stdout.decode().split("\0")):
        source, copy = REPO / name, into / name
        if source.is_file():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
    return into


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, (path, old)  # (the recipe's place is where the page says it is)
    path.write_text(text.replace(old, new))


def the_pages_code(section: str) -> str:
    """The Python block of a section of the page."""
    part = PAGE.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return textwrap.dedent(part.split("```python\n", 1)[1].split("```", 1)[0].replace("\n   ", "\n"))


def unit_tier(copy: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """The unit tier run in ``copy``: how it ended, and the names of the tests that passed (with its own
    options alone: not those the outer run was given in PYTEST_ADDOPTS)."""
    report = copy / "unit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "--ignore=tests/test_extending.py", f"--junitxml={report}", "-m",
                           "not local and not sshd and not docker and not machines"], cwd=copy, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(copy), "PYTEST_ADDOPTS": ""})
    passed = {case.get("name", "") for case in ET.parse(report).iter("testcase") if not len(case)} \
        if report.exists() else set()
    return done, passed


@pytest.fixture(scope="module")
def followed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str], set[str]]:
    """A copy of the repository with both recipes followed (a launcher, a cause), and its unit tier run once."""
    copy = copy_of_the_repository(tmp_path_factory.mktemp("recipes") / "repo")
    add_a_launcher(copy)
    add_a_cause(copy)
    return (copy, *unit_tier(copy))


def test_the_launcher_recipe_makes_a_launcher_the_unit_tier_accepts(
        followed: tuple[Path, subprocess.CompletedProcess[str], set[str]]) -> None:
    copy, done, passed = followed
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert {"test_every_launcher_makes_its_launches_as_data", "test_the_reference_is_up_to_date"} <= passed
    assert "relay (one process per host that mp.spawns its ranks)" in (copy / "docs/reference.md").read_text()


def test_the_cause_recipe_makes_a_cause_the_unit_tier_accepts(
        followed: tuple[Path, subprocess.CompletedProcess[str], set[str]]) -> None:
    _, done, passed = followed
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert {"test_ranks_on_islands_are_said_to_be", "test_every_kind_is_covered",
            "test_every_fixture_has_a_valid_expectation[islands]"} <= passed


def add_a_launcher(copy: Path) -> None:
    """docs/extending.md's launcher recipe, step by step."""
    # 1. the module: the page's own example, as another launcher
    code = the_pages_code("A launcher").replace("class Spawn", "class Relay").replace('"spawn"', '"relay"', 1)
    (copy / "lab/core/launchers/relay.py").write_text(
        '"""``--launcher relay``: the page\'s example."""\nfrom __future__ import annotations\n\n'
        "from typing import ClassVar\n\nfrom lab.core.launchers.base import Launcher, rendezvous_env\n"
        "from lab.suite.check import Launched\n\n\n" + code)
    # 2. the register
    registry = copy / "lab/core/launchers/__init__.py"
    edit(registry, "from lab.core.launchers.torchrun import Torchrun\n",
         "from lab.core.launchers.relay import Relay\nfrom lab.core.launchers.torchrun import Torchrun\n")
    edit(registry, "OwnLauncher(), Torchrun(), Spawn(), Srun(), SrunTorchrun())",
         "OwnLauncher(), Torchrun(), Spawn(), Srun(), SrunTorchrun(), Relay())")
    # 4. the reference, and 5. what it starts, in the plan's table
    subprocess.run([sys.executable, "-m", "docs.reference"], cwd=copy, check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(copy)})
    last = '    "srun-torchrun": [("a", "srun", (0, 1, 2, 3))],\n'
    edit(copy / "tests/test_plan.py", last, last + '    "relay": [("a", "spawn", (0, 1)), ("b", "spawn", (2, 3))],\n')


def add_a_cause(copy: Path) -> None:
    """docs/extending.md's cause recipe, step by step."""
    # 1. the kind
    edit(copy / "lab/core/outcome.py", '"uneven-counts", ', '"uneven-counts", "islands", ')
    # 2. the rule, and its place in explain's order
    why = copy / "lab/core/why.py"
    nothing = "def _nothing(ranks: dict[int, Rank]) -> Finding | None:"
    edit(why, nothing, '''def _islands(ranks: dict[int, Rank]) -> Finding | None:
    """Every rank on an island (the recipe's example)."""
    if not ranks or not all(r.host.startswith("island") for r in ranks.values()):
        return None
    return Finding("islands", f"{len(ranks)} ranks on islands", "build a bridge")


''' + nothing)
    edit(why, "        _straggler, _nothing)", "        _straggler, _islands, _nothing)")
    # 3. the fixtures' kinds, and a fixture program of that kind
    edit(copy / "tests/test_why_fixtures.py", '"rendezvous", "healthy")', '"rendezvous", "healthy", "islands")')
    program = ('"""Two ranks on islands.\n\nexpect: kind=islands; nproc=2; exit=1; headline contains "2 ranks on '
               'islands"\n"""\nimport torch.distributed as dist\n\ndist.init_process_group("gloo")\n'
               'raise SystemExit(1)\n')
    (copy / "tests/why/islands.py").write_text(program)
    (copy / "tests/train/ddp_islands.py").write_text(program)  # (a training program of the kind too)
    # 4. a unit test on synthetic records
    edit(copy / "tests/test_why.py", "from __future__ import annotations\n",
         "from __future__ import annotations\n\nfrom dataclasses import replace\n")
    with (copy / "tests/test_why.py").open("a") as tests:
        tests.write('''

def test_ranks_on_islands_are_said_to_be() -> None:
    cause = explain([replace(rank(r, records=loop(2)), host=f"island{r}") for r in range(2)])
    assert (cause.kind, cause.headline, cause.fix) == ("islands", "2 ranks on islands.", "build a bridge")
''')
