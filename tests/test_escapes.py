"""Terminal escapes and rich markup from untrusted text: a solution that prints ESC[2J and a green
"PASS" (or "[bold green]PASS") neither clears the grader's screen nor forges a result there, and
the JUnit XML and grades.csv it leads to stay valid. Each control character shows as its escape."""
from __future__ import annotations

import csv
import io
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from rich.console import Console

from lab.cli.views.doctor import print_diagnosis
from lab.cli.views.grades import print_gradebook
from lab.errors import ExitCode
from lab.grading.grade import Grade, Gradebook
from lab.netcheck.model import Diagnosis
from lab.rank.text import printable

from .conftest import WRONG, Lab
from .test_doctor import MASTER, link, report

HOSTILE = WRONG / "p2p_prints_escapes.py"
ESC = "\x1b"
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what no output of the lab may hold (tab, newline aside)
FORGED = "\x1b[2J\x1b[H\x1b[32mPASS\x1b[0m p2p"


def plain_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=300, force_terminal=False, highlight=False), out


# -- the one function ----------------------------------------------------------------------


@pytest.mark.parametrize("text, shown", [
    ("\x1b[2Jclear", "\\x1b[2Jclear"),
    ("FAIL\rPASS", "FAIL\\rPASS"),
    ("bell\x07nul\x00del\x7f", "bell\\x07nul\\x00del\\x7f"),
    ("c1\x9b31m\x85", "c1\\x9b31m\\x85"),
    ("bidi \u202egnp.exe", "bidi \\u202egnp.exe"),
    ("line\u2028separator", "line\\u2028separator"),
    ("not xml \ufffe \ud800", "not xml \\ufffe \\ud800"),
    ("tab\tkept, and unicode é ✓ 漢字", "tab\tkept, and unicode é ✓ 漢字"),
    ("two\nlines", "two\\nlines"),
    ("[bold green]PASS", "[bold green]PASS"),  # (markup is for the printing to leave alone)
])
def test_printable_shows_each_control_character_as_its_escape(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_printable_keeps_line_breaks_where_asked() -> None:
    assert printable("a\n\x1b[2Jb\r\n", newlines=True) == "a\n\\x1b[2Jb\\r\n"


# -- each place that shows untrusted text, without processes ---------------------------------


def test_the_gradebook_table_and_csv_show_escapes_and_markup_as_text(tmp_path: Path) -> None:
    grades = [Grade("mallory\x1b[2J[red]", "p2p", "fail", f"rank 0 raised ValueError: {FORGED} [bold green]PASS",
                    1.0),
              Grade("[bold green]eve", "p2p", "error", "SyntaxError\x00 at\rline 1\n[link=x]y[/link]", 0.5)]
    console, out = plain_console()
    print_gradebook(console, grades)
    text = out.getvalue()
    assert not CONTROL.search(text.replace("\n", "")), repr(text)
    assert "[bold green]PASS" in text and "[bold green]eve" in text and "mallory\\x1b[2J[red]" in text
    assert "\\x1b[2J\\x1b[H\\x1b[32mPASS" in text
    book = Gradebook(tmp_path, [g.student for g in grades], {})
    for grade in grades:
        book.record(grade, "digest")
    raw = book.csv_path.read_text(encoding="utf-8")
    assert not CONTROL.search(raw.replace("\r\n", "").replace("\n", "")), repr(raw)
    rows = {row["student"]: row for row in csv.DictReader(io.StringIO(raw))}
    assert rows["mallory\\x1b[2J[red]"]["reason"].endswith("\\x1b[32mPASS\\x1b[0m p2p [bold green]PASS")
    assert rows["[bold green]eve"]["reason"] == "SyntaxError\\x00 at\\rline 1\\n[link=x]y[/link]"


def test_the_doctor_shows_what_hosts_report_as_text() -> None:
    hostile = "3.11\x1b[2J[bold red]x"
    reports = (report("a", "10.0.0.1", python=hostile, torch="2.1\x1b[31m[green]ok",
                      links=(link("mesh", "b", "10.0.0.2", failure="refused"),)),
               report("b", "10.0.0.2", torch="b\x1b]0;title\x07"))
    console, out = plain_console()
    print_diagnosis(console, Diagnosis(reports, MASTER, ()))
    text = out.getvalue()
    assert ESC not in text and "\x07" not in text, repr(text)
    assert "3.11\\x1b[2J[bold red]x" in text and "2.1\\x1b[31m[green]ok" in text and "b\\x1b]0;title\\x07" in text


# -- a hostile solution, through the command line --------------------------------------------


def assert_clean_junit(path: Path) -> str:
    """The JUnit file parses, holds no control character, and shows what was printed."""
    data = path.read_bytes().decode("utf-8")
    assert not CONTROL.search(data.replace("\n", "")), repr(data)
    ET.parse(path)  # would stop at the first escape
    return data


@pytest.mark.local
def test_a_solution_that_prints_escapes_cannot_forge_the_report(lab: Lab, tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    result = lab("run", "p2p", "--nproc", "2", "--solution", str(HOSTILE), "--junit", str(junit), timeout=120)
    assert result.code == ExitCode.CHECK_FAILED, result.text
    assert ESC not in result.out and ESC not in result.err, repr(result.text[-3000:])
    assert not CONTROL.search(result.out.replace("\n", "") + result.err.replace("\n", ""))
    # what it printed, visible as such: the rank's lines, the reason, the tail
    assert "[local r0] \\x1b[2J\\x1b[H\\x1b[32mPASS\\x1b[0m p2p" in result.out
    assert "[local r1] [bold green]PASS[/bold green] p2p\\rPASS" in result.out  # markup left as text
    assert re.search(r"^FAIL +p2p .*raised ValueError: \\x1b\[2J\\x1b\[H\\x1b\[32mPASS", result.out, re.MULTILINE)
    assert not re.search(r"^PASS", result.out, re.MULTILINE)
    data = assert_clean_junit(junit)
    assert "ValueError: \\x1b[2J\\x1b[H\\x1b[32mPASS\\x1b[0m p2p [bold green]PASS\\x07\\x00" in data
    failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
    assert failure is not None and failure.get("message", "").startswith("ranks 0, 1 raised ValueError: \\x1b[2J")
    assert lab.leftovers() == []


@pytest.mark.local
def test_grading_a_solution_that_prints_escapes_writes_a_clean_gradebook(lab: Lab, tmp_path: Path) -> None:
    submissions = tmp_path / "class"
    submissions.mkdir()
    shutil.copyfile(HOSTILE, submissions / "mallory.py")
    shutil.copyfile(HOSTILE, submissions / "eve\x1b[2J[bold green]PASS.py")  # a name is untrusted too
    out = tmp_path / "book"
    result = lab("grade", str(submissions), "--exercise", "p2p", "--nproc", "2", "--sandbox", "none",
                 "--out", str(out), timeout=300)
    assert result.code == ExitCode.OK, result.text  # grading worked; the students failed
    assert ESC not in result.out and ESC not in result.err, repr(result.text[-3000:])
    assert "eve\\x1b[2J[bold green]PASS" in result.out and "2 graded: 2 fail" in result.out
    raw = (out / "grades.csv").read_text(encoding="utf-8")
    assert not CONTROL.search(raw.replace("\r\n", "").replace("\n", "")), repr(raw)
    rows = {row["student"]: row for row in csv.DictReader(io.StringIO(raw))}
    assert set(rows) == {"mallory", "eve\\x1b[2J[bold green]PASS"}
    for row in rows.values():
        assert row["verdict"] == "fail" and "raised ValueError: \\x1b[2J\\x1b[H\\x1b[32mPASS" in row["reason"], row
    files = sorted((out / "junit").iterdir())
    assert len(files) == 2
    for path in files:
        suite = ET.fromstring(assert_clean_junit(path)).find("testsuite")
        assert suite is not None and suite.get("failures") == "1"
    assert lab.leftovers() == []
