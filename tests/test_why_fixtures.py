"""The hang and crash fixtures (tests/why/, described in its README.md): broken and healthy
torch.distributed programs, each with the cause the lab's report must name, as a line of its
docstring. Their expectations parse and cover every kind of cause (unit); each one run through
``lab launch --hang-after`` gets the report its expectation says, in seconds for a hang (local)."""
from __future__ import annotations

import ast
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from .conftest import Lab, Result, shared_warm_server

WHY = Path(__file__).resolve().parent / "why"
FIXTURES = sorted(WHY.glob("*.py"))
KINDS = ("collective-mismatch", "missing-rank", "uneven-counts", "p2p-cycle", "p2p-unmatched", "crash",
         "rendezvous", "healthy")
EXITS = (0, 1, 4)  # the lab's exit codes a fixture may expect: passed, crashed (a rank failed), stopped
HANG_AFTER = 5
TIMEOUT = 150  # the --timeout of a fixture that names none: its hang must be found long before
# Seconds from the launch to a found hang: start-up (2 s alone, far more on a machine the suite's other
# workers keep busy), --hang-after, the 3 s. Well short of TIMEOUT: a hang the hang finder missed
# is stopped at the timeout, too late to pass. (The time to a verdict is measured where it can be, from
# the run's own trace: benchmarks/lab_speed.py hang-training.)
FOUND_WITHIN = 60
CLAUSE = re.compile(r'(?P<key>kind|nproc|exit|timeout)=(?P<value>\S+)'
                    r'|(?P<part>headline|report) contains "(?P<text>[^"]+)"')
WHERE = re.compile(r"\b(?P<file>\w+\.py):(?P<line>\d+)\b")
# What a line named in a report may be: a call of torch.distributed's, a raise, an exit, a wait, a sleep;
# in a training program, a step that DDP's reducer issues collectives in (backward, the model, DDP itself),
# a loop over a DataLoader (where a worker's exception is raised again), or a save or load of a file.
CALL = re.compile(r"\bdist\.|\braise\b|exit\(|\.wait\(\)|sleep\(|\.backward\(|\bmodel\(|\btrain_step\(|\bDDP\("
                  r"|torch\.(save|load)\(|^\s*for .+ in \w*loader\w*:")
RANK_LINE = re.compile(r"^\[\S+ r\d+\] ")  # a line a rank printed, tagged by the lab, not the lab's own


@dataclass(frozen=True)
class Expectation:
    """What the report of one fixture must say: its ``expect:`` line, read."""

    name: str  # the fixture's file name, without .py
    kind: str  # one of KINDS
    nproc: int
    exit: int  # the lab's exit code
    timeout: float | None  # a verdict that comes at this --timeout (a straggler, not a hang)
    headline: tuple[str, ...]  # phrases one line of the report holds together (the cause's first line)
    report: tuple[str, ...]  # phrases anywhere in the lab's report


def expectation_text(source: str) -> str:
    """The ``expect:`` line of a module's docstring with the indented lines that continue it."""
    docstring = ast.get_docstring(ast.parse(source)) or ""
    lines = docstring.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("expect:")), None)
    if start is None:
        raise ValueError("no 'expect:' line in the module's docstring")
    text = [lines[start].removeprefix("expect:")]
    text += _continuation(lines[start + 1:])
    return " ".join(part.strip() for part in text)


def _continuation(lines: list[str]) -> list[str]:
    taken = []
    for line in lines:
        if not line[:1].isspace() or not line.strip():
            break
        taken.append(line)
    return taken


def parse(name: str, text: str) -> Expectation:
    """An expectation from its text (``kind=...; nproc=...; ...``); ValueError saying what is wrong."""
    fields: dict[str, str] = {}
    phrases: dict[str, list[str]] = {"headline": [], "report": []}
    for clause in filter(None, (c.strip() for c in text.split(";"))):
        found = CLAUSE.fullmatch(clause)
        if found is None:
            raise ValueError(f"cannot read {clause!r}")
        if found["key"]:
            if found["key"] in fields:
                raise ValueError(f"{found['key']} given twice")
            fields[found["key"]] = found["value"]
        else:
            phrases[found["part"]].append(found["text"])
    missing = {"kind", "nproc", "exit"} - set(fields)
    if missing:
        raise ValueError(f"no {', '.join(sorted(missing))}")
    expect = Expectation(name, fields["kind"], _number(fields, "nproc"), _number(fields, "exit"),
                         float(_number(fields, "timeout")) if "timeout" in fields else None,
                         tuple(phrases["headline"]), tuple(phrases["report"]))
    _check(expect)
    return expect


def _number(fields: dict[str, str], key: str) -> int:
    if not fields[key].isdigit():
        raise ValueError(f"{key} is not a number: {fields[key]!r}")
    return int(fields[key])


def _check(expect: Expectation) -> None:
    if expect.kind not in KINDS:
        raise ValueError(f"unknown kind {expect.kind!r} (one of {', '.join(KINDS)})")
    if not 2 <= expect.nproc <= 4:
        raise ValueError(f"nproc {expect.nproc}: a fixture runs 2 to 4 ranks")
    if expect.exit not in EXITS or (expect.exit == 0) != (expect.kind == "healthy"):
        raise ValueError(f"exit {expect.exit}: 0 for a healthy fixture, 1 (crashed) or 4 (stopped) for the others")
    if expect.kind != "healthy" and not expect.headline:
        raise ValueError("a broken fixture names at least one phrase of the headline")
    if expect.timeout is not None and expect.exit != 4:
        raise ValueError("a timeout is for a fixture the lab stops at its --timeout (exit 4)")


def lines_named(expect: Expectation, source: str) -> list[str]:
    """What is wrong with the ``FILE.py:LINE`` phrases of an expectation: each names this fixture
    and a line of it that calls torch.distributed, raises, exits, saves or loads (so an edit that moves the
    call shows here, not as a report that misses it)."""
    lines = source.splitlines()
    wrong = []
    for phrase in expect.headline + expect.report:
        for where in WHERE.finditer(phrase):
            number = int(where["line"])
            line = lines[number - 1] if 0 < number <= len(lines) else ""
            if where["file"] != f"{expect.name}.py" or not CALL.search(line):
                wrong.append(f"{where[0]} is {line.strip()!r}")
    return wrong


def report_misses(expect: Expectation, output: str) -> list[str]:
    """The phrases the lab's report lacks: the headline's phrases must share one line (in any case:
    the headline is a sentence, and "rank 3" may start it), the others may be anywhere, as written;
    what the ranks printed themselves does not count."""
    report = [line for line in output.splitlines() if not RANK_LINE.match(line)]
    misses = [f"report contains {p!r}" for p in expect.report if not any(p in line for line in report)]
    if expect.headline and not any(all(p.lower() in line.lower() for p in expect.headline) for line in report):
        misses.append(f"one line contains {' and '.join(map(repr, expect.headline))}")
    return misses


def expectation(path: Path) -> Expectation:
    return parse(path.stem, expectation_text(path.read_text()))


# -- unit: the expectations -------------------------------------------------------------------

@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_fixture_has_a_valid_expectation(path: Path) -> None:
    source = path.read_text()
    assert lines_named(expectation(path), source) == []
    assert 'init_process_group("gloo")' in source  # CPU only, the rendezvous from the environment


def test_every_kind_is_covered() -> None:
    found = [expectation(path) for path in FIXTURES]
    assert {e.kind for e in found} == set(KINDS)
    assert sum(e.kind != "healthy" for e in found) >= 14
    assert len({e.name for e in found}) == len(found)


@pytest.mark.parametrize("text, error", [
    ("nproc=2; exit=4", "no kind"),
    ("kind=p2p-loop; nproc=2; exit=4; headline contains \"x\"", "unknown kind 'p2p-loop'"),
    ("kind=crash; nproc=8; exit=1; headline contains \"x\"", "nproc 8"),
    ("kind=crash; nproc=two; exit=1", "nproc is not a number"),
    ("kind=crash; nproc=2; exit=0; headline contains \"x\"", "exit 0"),
    ("kind=healthy; nproc=2; exit=4", "exit 4"),
    ("kind=crash; nproc=2; exit=1", "at least one phrase"),
    ("kind=crash; nproc=2; exit=1; headline has \"x\"", "cannot read 'headline has \"x\"'"),
    ("kind=crash; kind=crash; nproc=2; exit=1", "kind given twice"),
    ("kind=crash; nproc=2; exit=1; timeout=20; headline contains \"x\"", "a timeout is for"),
])
def test_a_malformed_expectation_is_refused_with_its_fault(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        parse("x", text)


def test_an_expectation_continues_on_indented_lines() -> None:
    source = ('"""A ring.\n\nexpect: kind=p2p-cycle; nproc=4; exit=4;\n        headline contains "0 waits for 3"\n'
              'Not the expectation.\n"""\n')
    assert parse("ring", expectation_text(source)) == Expectation(
        "ring", "p2p-cycle", 4, 4, None, ("0 waits for 3",), ())


def test_a_line_named_must_be_the_fixture_s_call() -> None:
    source = "import torch.distributed as dist\nx = 1\ndist.recv(t, src=0)\n"
    expect = Expectation("ring", "p2p-cycle", 4, 4, None, ("ring.py:3",), ("ring.py:2", "other.py:3"))
    assert lines_named(expect, source) == ["ring.py:2 is 'x = 1'", "other.py:3 is 'dist.recv(t, src=0)'"]


def test_the_headline_s_phrases_share_one_line_of_the_lab_s_own() -> None:
    expect = Expectation("ring", "p2p-cycle", 4, 4, None, ("0 waits for 3", "receives first"), ("ring.py:17",))
    good = "[local r0] 0 waits for 3\nlab: 0 waits for 3, 3 for 2: every rank receives first\n  rank 0 at ring.py:17\n"
    assert report_misses(expect, good) == []
    split = "lab: 0 waits for 3\nevery rank receives first\n[local r1] ring.py:17\n"
    assert report_misses(expect, split) == [
        "report contains 'ring.py:17'", "one line contains '0 waits for 3' and 'receives first'"]



# -- local: each fixture through the lab -------------------------------------------------------

def assert_report_names_the_cause(lab: Lab, path: Path, *cluster: str, found_within: float = FOUND_WITHIN) -> None:
    """Run a fixture through ``lab launch CLUSTER --hang-after HANG_AFTER`` (default ``--nproc N``) and
    check what its expectation says (:func:`assert_launched_as_expected`)."""
    assert_launched_as_expected(launched(lab, path, *cluster), found_within)


@dataclass(frozen=True)
class Launched:
    expect: Expectation
    result: Result
    seconds: float
    leftovers: list[str]


def launched(lab: Lab, path: Path, *cluster: str, alone: bool = True) -> Launched:
    """A fixture run through ``lab launch CLUSTER --hang-after HANG_AFTER`` (default ``--nproc N``);
    not ``alone`` (other labs run beside it), its leftovers are only those that carry its marker."""
    expect = expectation(path)
    timeout = expect.timeout or TIMEOUT
    started = time.monotonic()
    result = lab("launch", *(cluster or ("--nproc", str(expect.nproc))), "--timeout", f"{timeout:g}",
                 "--hang-after", str(HANG_AFTER), str(path), timeout=timeout + 120)
    return Launched(expect, result, time.monotonic() - started, lab.leftovers() if alone else lab.marked())


def assert_launched_as_expected(run: Launched, found_within: float = FOUND_WITHIN) -> None:
    """What a fixture's expectation says of its run: the exit code, the report's phrases, a hang stopped
    within ``found_within`` seconds of the start (a straggler at its timeout), nothing left running."""
    expect, result, seconds = run.expect, run.result, run.seconds
    assert result.code == expect.exit, result.text
    assert report_misses(expect, result.text) == [], result.text
    if expect.exit == 4:  # found by the hang finder within seconds, or (a straggler) at the timeout
        timeout = expect.timeout or TIMEOUT
        assert seconds >= timeout if expect.timeout else seconds < found_within, (seconds, result.out)
    assert run.leftovers == []


AT_ONCE = 2  # fixtures run at a time here: each also runs on a machine another job keeps busy


def launched_at_once(paths: list[Path]) -> dict[Path, Launched]:
    """Each fixture through ``lab launch --hang-after``, AT_ONCE at a time (each with a lab of its own:
    what one leaves running with its marker is its own; what is left below the warm server once
    they have all ended counts against each)."""
    with ThreadPoolExecutor(AT_ONCE) as pool:
        runs = dict(zip(paths, pool.map(lambda path: launched(Lab(), path, alone=False), paths)))
    left = shared_warm_server().left_below()
    return {path: replace(run, leftovers=run.leftovers + left) for path, run in runs.items()}


@pytest.fixture(scope="module")
def launches() -> dict[Path, Launched]:
    return launched_at_once(FIXTURES)


@pytest.mark.local
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_the_report_names_the_cause(launches: dict[Path, Launched], path: Path) -> None:
    assert_launched_as_expected(launches[path])


# The same under torchrun (its ranks import torch each, and it numbers them itself): a hang, a
# crash (with tests/train/'s mismatch against DDP, and gloo's abort: OTHER_LAUNCHERS); the other
# launchers and transports are in their tiers (test_lab_docker.py: over SSH across the container
# lab; test_slurm.py: srun).
UNDER_OTHER_LAUNCHERS = ("recv_cycle", "nan_at_step_5")


@pytest.mark.local
@pytest.mark.parametrize("name", UNDER_OTHER_LAUNCHERS)
def test_the_report_names_the_cause_under_torchrun(lab: Lab, name: str) -> None:
    expect = expectation(WHY / f"{name}.py")
    assert_report_names_the_cause(lab, WHY / f"{name}.py", "--nproc", str(expect.nproc), "--launcher", "torchrun")
