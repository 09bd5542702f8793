"""`lab grade`: a class's submissions into a gradebook, contained, several at once.

The class (tests/class/ring/) is one student of each kind: correct, wrong, deadlocked, a
memory hog, an output flood, a daemonizer, one that exits mid-exercise, a syntax error, one
that uses the forbidden collective, one missing a function, one with no file at all.
The sandboxed tier needs the Docker engine and the lab image (the docker tier's `lab up`
builds it; under CI=true it must run); the container lab's grading is in test_lab_docker.py.
"""
from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from lab.containerlab import engine, resources, state
from lab.containerlab.topology import DEFAULT_LAB, LABEL, NAME_LABEL, OWNER_LABEL, ROLE
from lab.core.plan import Options
from lab.errors import UsageError
from lab.grading.feedback import feedback
from lab.grading.grade import Grade, Gradebook, Submission, find_submissions, grade_all
from lab.grading.places import Hosts, one_user_hosts, split_inventory
from lab.grading.sandbox import FIRST_USER, IMAGE, LOG_MAX, ROLE_NAME, Limits, Sandbox, ensure_sandbox_image
from lab.inventory.hosts import local_inventory
from lab.inventory.model import Host, Inventory
from lab.rank.reaper import LIVE, STALE_AFTER, is_run_dir_name
from lab.suite import registry

from .conftest import REPO, Lab
from .tutorials import ring_allreduce_fragment

CLASS = REPO / "tests" / "class" / "ring"

# student -> (verdict, words the reason must hold)
EXPECTED = {
    "alice": ("pass", ""),
    "bob": ("fail", "ring_allreduce(tensor), size 1"),
    "carol": ("timeout", "carol.py:11 in ring_allreduce"),
    "dave": ("fail", "out of memory (the limit is 768 MB per rank)"),
    "erin": ("pass", ""),
    "frank": ("pass", ""),
    "grace": ("fail", "rank 1 (sandbox) exited with status 0 during ring-allreduce"),
    "heidi": ("error", "SyntaxError: expected ':' at heidi.py:7"),
    "ivan": ("fail", "called all_reduce: ring-allreduce must be built from point-to-point calls"),
    "judy": ("fail", "called all_reduce: ring-allreduce must be built from point-to-point calls"),  # (one part)
    # had it found the others' inputs its values would be right: they are wrong (and it sent nothing)
    "mallory": ("fail", "rank 0: allreduce(send, recv), size 1 float32: positions [0] (the inputs there: rank 0 ["),
    "olga": ("error", "olga.py defines run(): this exercise asks for allreduce(), ring_allreduce()"),
    "peggy": ("fail", "allreduce(): not written: it uses the reference's allreduce(); "
                      "ring_allreduce(): not written: it uses the reference's ring_allreduce()"),
    "trent": ("fail", "rank 0's call recorder was tampered with during the exercise (switched off 96 time(s))"),
    "victor": ("fail", "also rank 0 sent 0 bytes in allreduce(): it computed the result without communicating"),
    # its records look like a ring's; what its connections carried, measured outside the ranks, does not
    "walter": ("fail", "went by calls the call recorder did not see (measured outside the ranks"),
    "sybil": ("fail", "went by calls the call recorder did not see"),  # (it sums through the rendezvous store)
    # nor can it speak for the launcher that takes that measure: no stream of the launch's is in its reach
    "xavier": ("fail", "went by calls the call recorder did not see"),
    # nor can it stop that measure: its ranks would kill the launcher that takes it, which in a sandbox is another
    # user's (lab.rank.isolation): what is left is an honest ring (with a container a rank, see yolanda's test)
    "zed": ("pass", ""),
    # the answer is nowhere in the process: each function's inputs are drawn apart, so the caller's frame holds
    # the sum of others
    "quentin": ("fail", "rank 0: ring_allreduce(tensor), size 1 float32: positions [0]"),
    # every rank's inputs sent ahead in 2 bytes a value, the sums looked up: fewer bytes than any all-reduce moves
    "rupert": ("fail", "less than ring-allreduce's functions must move to compute their results"),
    # a hidden all_reduce, its records forged to look like two honest rings: they claim more than was carried
    "ursula": ("fail", "records that claim more than went over the wire are no evidence of the method"),
    "nobody": ("error", "no .py file or notebook in nobody/"),
    # alice's ring in a notebook's %%dist cell; its other cells (an os._exit among them) never run when graded
    "nell": ("pass", ""),
}


def read_grades(out: Path) -> dict[str, dict[str, str]]:
    with (out / "grades.csv").open(newline="") as f:
        return {row["student"]: row for row in csv.DictReader(f)}


def class_of(tmp_path: Path, *students: str) -> Path:
    """A submissions folder of these students of the class (tests/class/ring)."""
    submissions = tmp_path / "class"
    submissions.mkdir()
    for student in students:
        (submissions / f"{student}.py").write_text((CLASS / f"{student}.py").read_text())
    return submissions


def graded_then_killed(lab: Lab, args: tuple[str, ...], out: Path,
                       ready: Callable[[], bool] = lambda: True) -> dict[str, dict[str, str]]:
    """Start ``lab grade``, SIGKILL it once two rows are written (and ``ready``): the rows it left,
    whole rows only (nothing of the grader's own runs after a SIGKILL)."""
    grader = lab.popen(*args)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (
                len(read_grades(out) if (out / "grades.csv").exists() else {}) >= 2 and ready()):
            time.sleep(0.1)
    finally:  # (a failing wait leaves no grader to run on into the next test)
        grader.kill()
        grader.communicate(timeout=30)
    return read_grades(out)


def students_in(out: Path) -> list[str]:
    """The students of grades.csv, a row each, as many times as they have rows."""
    with (out / "grades.csv").open(newline="") as f:
        return [row["student"] for row in csv.DictReader(f)]


def assert_graded_as_expected(grades: dict[str, dict[str, str]], expected: dict[str, tuple[str, str]]) -> None:
    assert set(grades) == set(expected)
    for student, (verdict, words) in expected.items():
        row = grades[student]
        assert (row["verdict"], row["score"]) == (verdict, "1" if verdict == "pass" else "0"), row
        assert words in row["reason"], row
        assert row["exercise"] == "ring-allreduce" and float(row["seconds"]) >= 0


# -- without processes --------------------------------------------------------------------


def test_submissions_are_files_or_folders_named_after_their_students(tmp_path: Path) -> None:
    (tmp_path / "ann.py").write_text("")
    for folder, files in {"ben": ["ring_allreduce.py", "helper.py"], "cat": ["solution.py", "x.py"],
                          "dan": ["mine.py"], "eve": [], "fay": ["a.py", "b.py"]}.items():
        (tmp_path / folder).mkdir()
        for name in files:
            (tmp_path / folder / name).write_text("")
    (tmp_path / ".git").mkdir()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "notes.txt").write_text("")
    found = {s.student: s for s in find_submissions(tmp_path, "ring_allreduce")}
    assert found == {
        "ann": Submission("ann", tmp_path / "ann.py"),
        "ben": Submission("ben", tmp_path / "ben" / "ring_allreduce.py"),
        "cat": Submission("cat", tmp_path / "cat" / "solution.py"),
        "dan": Submission("dan", tmp_path / "dan" / "mine.py"),
        "eve": Submission("eve", None, "no .py file or notebook in eve/"),
        "fay": Submission("fay", None, "2 .py files or notebooks in fay/ and none is ring_allreduce.py or "
                                       "solution.py"),
        ".git": Submission(".git", None, "no .py file or notebook in .git/"),  # (every entry is a row: see below)
        "__pycache__": Submission("__pycache__", None, "no .py file or notebook in __pycache__/"),
        "notes.txt": Submission("notes.txt", None, "not graded: notes.txt is not a .py file or a notebook (hand in "
                                                   "NAME.py or NAME.ipynb, or a folder NAME/ holding "
                                                   "ring_allreduce.py)"),
    }
    with pytest.raises(UsageError, match="no submissions"):
        find_submissions(tmp_path / "eve", "ring_allreduce")
    with pytest.raises(UsageError, match="not a directory"):
        find_submissions(tmp_path / "ann.py", "ring_allreduce")


def test_every_entry_of_the_folder_is_one_row_under_a_name_of_its_own_whatever_it_holds(tmp_path: Path) -> None:
    """Nothing handed in vanishes from the gradebook: hidden and underscored files are graded, other
    entries are rows that say why they were not run, a name a file system cannot take whole is cut
    (and stays unique), and a file larger than a submission may be (sparse: 4 KB on disk) is not read."""
    for name in ("visible.py", "_x.py", ".x.py", "x.zip", "x.py.txt", "alice.py", "y" * 252 + ".py"):
        (tmp_path / name).write_text("")
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice" / "solution.py").write_text("")
    os.mkfifo(tmp_path / "pipe.py")
    with (tmp_path / "huge.py").open("wb") as f:
        f.truncate(1 << 40)
    found = {s.student: s for s in find_submissions(tmp_path, "ring_allreduce")}
    assert len(found) == len(list(tmp_path.iterdir())) == 10
    assert {name: s.path.name for name, s in found.items() if s.path} == {
        "visible": "visible.py", "_x": "_x.py", ".x": ".x.py", "alice": "solution.py", "alice.py": "alice.py",
        "y" * 252: "y" * 252 + ".py"}
    assert {name: s.problem for name, s in found.items() if not s.path} == {
        "x.zip": "not graded: x.zip is not a .py file or a notebook (hand in NAME.py or NAME.ipynb, or a folder "
                 "NAME/ holding ring_allreduce.py)",
        "x.py.txt": "not graded: x.py.txt is not a .py file or a notebook (hand in NAME.py or NAME.ipynb, or a "
                    "folder NAME/ holding ring_allreduce.py)",
        "pipe": "not graded: pipe.py is not a regular file",
        "huge": "not graded: huge.py has 1099511627776 bytes, more than a submission may (1 MiB)"}
    book = Gradebook(tmp_path / "book", list(found), {"exercise": "ring-allreduce"})
    for student in found:
        book.write_feedback(student, "# feedback")
        book.record(Grade(student, "ring-allreduce", "error", found[student].problem, 0.0), found[student].digest())
    assert set(read_grades(tmp_path / "book")) == set(found)
    assert len({book.junit_path(s) for s in found}) == 10 and len(book.junit_path("y" * 252).name) <= 255


def test_a_submission_the_lab_fails_on_is_a_row_that_says_so_and_the_class_goes_on(tmp_path: Path) -> None:
    """An exception of the lab's own while one submission is graded (here: its place breaks) is that
    row's "not graded: internal error", not the end of the class: every other row is there."""
    root = tmp_path / "class"
    root.mkdir()
    for student in ("ann", "ben", "cat"):
        (root / f"{student}.py").write_text("")
    submissions = find_submissions(root, "p2p")
    book = Gradebook(tmp_path / "book", [s.student for s in submissions], {})

    class Broken:
        def __enter__(self) -> None:
            raise OverflowError("int too large to convert to float\nand a second line")

        def __exit__(self, *_: object) -> None:
            pass

    options = Options((registry.EXERCISES["p2p"],))
    grade_all(submissions, options, [Broken], book)  # type: ignore[list-item]
    rows = read_grades(tmp_path / "book")
    assert set(rows) == {"ann", "ben", "cat"}
    assert {row["reason"] for row in rows.values()} == {
        "not graded: internal error (OverflowError: int too large to convert to float)"}
    assert not any(g.graded for g in book.grades.values()) and {g.exit_code for g in book.grades.values()} == {5}


@pytest.mark.local
def test_a_place_not_back_to_nothing_takes_no_other_submission_and_the_last_one_out_leaves_rows_that_say_so(
        tmp_path: Path) -> None:
    """Real runs on a local cluster (``--sandbox none``), whose place says what stayed after each
    submission: that place grades no other, the rest go to the places left, a line says why, and
    once none is left every submission not graded is a row that says so."""
    root = tmp_path / "class"
    root.mkdir()
    for student in ("ann", "ben", "cat", "dan"):
        (root / f"{student}.py").write_text((CLASS / "heidi.py").read_text())  # (a syntax error: a quick row)
    submissions = find_submissions(root, "ring_allreduce")
    options = Options((registry.EXERCISES["ring-allreduce"],), timeout=15)
    place = Hosts(local_inventory(2))

    class Stays:
        def __init__(self, what: str) -> None:
            self.what = what

        def __call__(self) -> Stays:
            return self

        def __enter__(self) -> Hosts:
            return replace_unclean(place, self.what)

        def __exit__(self, *_: object) -> None:
            pass

    said: list[str] = []
    book = Gradebook(tmp_path / "one", [s.student for s in submissions], {})
    grade_all(submissions, options, [Stays("node1: its memory group holds 900 MB"), Stays("")], book,  # type: ignore[list-item]
              say=said.append)
    rows = read_grades(tmp_path / "one")
    assert {row["verdict"] for row in rows.values()} == {"error"} and all(g.graded for g in book.grades.values())
    assert len(said) == 1 and said[0].startswith("a place taken out of the class after ")
    assert said[0].endswith("'s submission: node1: its memory group holds 900 MB") and book.notes == said
    book = Gradebook(tmp_path / "none", [s.student for s in submissions], {})
    grade_all(submissions, options, [Stays("node1: 2 file(s) of share1 in /tmp stayed")], book,  # type: ignore[list-item]
              say=print)
    rows = read_grades(tmp_path / "none")
    graded = [g for g in book.grades.values() if g.graded]
    assert len(rows) == 4 and len(graded) == 1
    assert {g.reason for g in book.grades.values() if not g.graded} == {
        f"not graded: every place was taken out of the class (a place taken out of the class after "
        f"{graded[0].student}'s submission: node1: 2 file(s) of share1 in /tmp stayed)"}
    assert {g.exit_code for g in book.grades.values() if not g.graded} == {5}


def replace_unclean(place: Hosts, what: str) -> Hosts:
    """``place``, saying ``what`` stayed after each submission."""
    class Unclean(Hosts):
        def unclean(self) -> str:
            return what

    return Unclean(place.inventory, place.ssh, place.lab)


def test_links_and_files_outside_the_folder_are_refused_never_run_as_the_students(tmp_path: Path) -> None:
    instructor = tmp_path / "instructor"
    instructor.mkdir()
    (instructor / "reference.py").write_text("SECRET = 'the reference'\n")
    root = tmp_path / "class"
    root.mkdir()
    (root / "ann.py").symlink_to(instructor / "reference.py")
    (root / "ben").mkdir()
    (root / "ben" / "solution.py").symlink_to(instructor / "reference.py")
    (root / "cat").symlink_to(instructor)
    (root / "dan").mkdir()
    (root / "dan" / "mine.py").symlink_to(root / "ann.py")
    (root / "eve.py").write_text("")
    found = {s.student: s for s in find_submissions(root, "ring_allreduce")}
    assert found == {
        "ann": Submission("ann", None, "refused: ann.py is a symbolic link (only files handed in are graded)"),
        "ben": Submission("ben", None, "refused: ben/solution.py is a symbolic link (only files handed in are graded)"),
        "cat": Submission("cat", None, "refused: cat is a symbolic link (only files handed in are graded)"),
        "dan": Submission("dan", None, "refused: dan/mine.py is a symbolic link (only files handed in are graded)"),
        "eve": Submission("eve", root / "eve.py"),
    }
    assert not any("reference" in s.problem for s in found.values())


def test_the_gradebook_neutralises_formulas_and_never_shares_a_junit_file(tmp_path: Path) -> None:
    students = ["=HYPERLINK(\"http://x\",\"y\")", "a b", "a_b", "a?b", "+1", "ok"]
    book = Gradebook(tmp_path, students, {})
    for student in students:
        book.record(Grade(student, "p2p", "fail", "-rank 0 raised @home", 1.0), "digest")
    rows = read_grades(tmp_path)
    assert set(rows) == {"'=HYPERLINK(\"http://x\",\"y\")", "a b", "a_b", "a?b", "'+1", "ok"}
    assert all(row["reason"] == "'-rank 0 raised @home" for row in rows.values())
    files = [book.junit_path(s).name for s in students]
    assert len(set(files)) == len(files) and book.junit_path("a_b").name == "a_b.xml"
    assert book.junit_path("ok").name == "ok.xml" and all("/" not in f and not f.startswith(".") for f in files)


def test_rows_and_notes_written_at_once_by_many_threads_all_land_whole(tmp_path: Path) -> None:
    """Each share records its rows from a thread of its own, and one taken out notes why from
    its own: the book's files are written by one of them at a time, and every row and note lands."""
    students = [f"s{i}" for i in range(40)]
    book = Gradebook(tmp_path, students, {})
    start = threading.Barrier(8)

    def write(first: int) -> None:
        start.wait()
        for student in students[first::8]:
            book.record(Grade(student, "p2p", "pass", "", 1.0), "digest")
            book.note(f"{student} noted")

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(read_grades(tmp_path)) == set(students)
    assert set(json.loads((tmp_path / ".gradebook.json").read_text())["grades"]) == set(students)
    assert sorted(book.notes) == sorted(f"{s} noted" for s in students)
    assert not list(tmp_path.glob(".*.part"))


def test_a_grader_started_again_keeps_the_rows_of_unchanged_files_under_the_same_settings(tmp_path: Path) -> None:
    root, out = tmp_path / "class", tmp_path / "book"
    root.mkdir()
    for student in ("ann", "ben", "cat"):
        (root / f"{student}.py").write_text(f"# {student}\n")
    settings = {"exercise": "p2p", "timeout": 60.0}
    submissions = find_submissions(root, "p2p")
    first = Gradebook(out, [s.student for s in submissions], settings)
    assert first.resume(submissions) == submissions
    for submission in submissions[:2]:  # then the grader was killed
        first.feedback_path(submission.student).write_text("# p2p")
        first.record(Grade(submission.student, "p2p", "pass", "", 2.0), submission.digest())
    (root / "ben.py").write_text("# ben, changed\n")
    again = Gradebook(out, [s.student for s in submissions], settings)
    assert [s.student for s in again.resume(submissions)] == ["ben", "cat"]
    assert set(read_grades(out)) == {"ann"}  # (the rest come as they are graded)
    other = Gradebook(out, [s.student for s in submissions], {**settings, "timeout": 30.0})
    assert [s.student for s in other.resume(submissions)] == ["ann", "ben", "cat"]
    named = Gradebook(out, [s.student for s in submissions], settings)  # (--student ann: unchanged, graded again)
    assert [s.student for s in named.resume(submissions, again={"ann"})] == ["ann", "ben", "cat"]


def test_parallel_shares_split_the_slots_in_host_order() -> None:
    hosts = tuple(Host(f"node{i}", f"10.0.0.{i}", slots=s) for i, s in ((1, 1), (2, 3), (3, 2)))
    shares = split_inventory(Inventory("inv.yaml", hosts), 3, 2)
    assert [[(h.name, h.slots) for h in share.hosts] for share in shares] == [
        [("node1", 1), ("node2", 1)], [("node2", 2)], [("node3", 2)]]
    assert all(share.world_size == 2 for share in shares)
    with pytest.raises(UsageError, match="6 slot.s. cannot make 4 share.s. of at least 2"):
        split_inventory(Inventory("inv.yaml", hosts), 4, 2)


def test_each_share_logs_in_as_its_own_grade_user() -> None:
    users = ("share1", "share2", "share3")
    hosts = (Host("node1", "10.0.0.1", user="lab", slots=3, grade_users=users),
             Host("node2", "10.0.0.2", user="lab", slots=3),
             Host("local", "127.0.0.1", connection="local", slots=3, grade_users=users))
    shares = split_inventory(Inventory("inv.yaml", hosts), 3, 3)
    assert [[(h.name, h.user) for h in share.hosts] for share in shares] == [
        [("node1", "share1")], [("node2", "lab")], [("local", None)]]
    assert one_user_hosts(Inventory("inv.yaml", hosts)) == ["node2"]
    with pytest.raises(UsageError, match="inv.yaml:4: host node1 has 3 grade_users for 4 share"):
        split_inventory(Inventory("inv.yaml", (replace(hosts[0], slots=4, source="inv.yaml:4"),)), 4, 1)


@pytest.mark.local
def test_bad_grading_input_is_one_line_and_exit_2(lab: Lab, tmp_path: Path) -> None:
    for args, words in ((["grade", str(CLASS), "--exercise", "nope"], "unknown exercise 'nope'"),
                        (["grade", str(tmp_path / "none"), "--exercise", "p2p"], "not a directory"),
                        (["grade", str(CLASS), "--exercise", "p2p", "--parallel", "0"], "--parallel"),
                        (["grade", str(CLASS), "--exercise", "p2p", "--memory", "10"], "--memory must be"),
                        (["grade", str(CLASS), "--exercise", "p2p", "--hosts", "inventory.yaml",
                          "--sandbox", "container"], "--sandbox container is for the local cluster")):
        result = lab(*args)
        assert result.code == 2, result.text
        assert result.err.count("\n") == 1 and words in result.err, result.err


# -- local processes (--sandbox none) -------------------------------------------------------


@pytest.mark.local
def test_grading_without_a_sandbox_on_local_clusters_side_by_side(lab: Lab, tmp_path: Path) -> None:
    """Two local clusters at once, each submission its own run: the rows, the JUnit files."""
    submissions = class_of(tmp_path, "alice", "bob", "heidi", "ivan")
    out = tmp_path / "book"
    result = lab("grade", str(submissions), "--exercise", "ring-allreduce", "--nproc", "3", "--sandbox", "none",
                 "--parallel", "2", "--out", str(out), "-v", timeout=300)
    assert result.code == 0, result.text
    assert_graded_as_expected(read_grades(out), {s: EXPECTED[s] for s in ("alice", "bob", "heidi", "ivan")})
    # -v: the lab's steps with their times, none of a library's (the feedback's Markdown parser logs each rule)
    assert "lab [+" in result.err and "StateBlock" not in result.err, result.err[-3000:]
    assert "4 graded: 1 pass, 2 fail, 1 error" in result.out
    suite = ET.parse(out / "junit" / "bob.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "bob" and suite.get("failures") == "1"
    assert lab.leftovers() == []


@pytest.mark.local
def test_a_grader_killed_mid_class_and_run_again_grades_each_student_exactly_once(lab: Lab, tmp_path: Path) -> None:
    students = ("alice", "bob", "erin", "frank", "heidi", "ivan")
    out = tmp_path / "book"
    args = ("grade", str(class_of(tmp_path, *students)), "--exercise", "ring-allreduce", "--nproc", "3",
            "--sandbox", "none", "--out", str(out))
    temp = Path(tempfile.mkdtemp(prefix="lab-t-"))  # (the runs' temp directory: short, for their sockets)
    lab.env["TMPDIR"] = str(temp)
    before = graded_then_killed(lab, args, out, ready=lambda: any(temp.glob(f"lab-run-*/{LIVE}")))
    assert 2 <= len(before) < len(students), before
    deadline = time.monotonic() + 30
    while lab.leftovers() and time.monotonic() < deadline:  # (its ranks stop when their controller is gone)
        time.sleep(0.2)
    left = list(temp.iterdir())  # the killed grader's run directory, killed mid-run: nothing of it could clean up
    assert left and all(is_run_dir_name(run_dir.name) for run_dir in left), left  # (and nothing else of it)
    for run_dir in left:  # (a day on, nothing of it having lived there since)
        then = time.time() - STALE_AFTER - 60
        os.utime(run_dir, (then, then))
    result = lab(*args, timeout=300)
    assert result.code == 0, result.text
    assert f"{len(before)} submission(s) already graded in {out}" in " ".join(result.out.split())
    assert sorted(students_in(out)) == sorted(students)  # each exactly once
    after = read_grades(out)
    assert all(after[student] == row for student, row in before.items())  # kept, not graded again
    assert_graded_as_expected(after, {s: EXPECTED[s] for s in students})
    assert lab.leftovers() == []
    assert list(temp.iterdir()) == []  # the next grader's first run swept it
    temp.rmdir()


@pytest.mark.local
def test_feedback_says_what_run_would_the_cause_and_fix_of_a_hang_and_a_crashs_own_traceback(
        lab: Lab, tmp_path: Path) -> None:
    """carol's ring deadlocks (every rank receives first), rita's raises on rank 1: their pages say
    why across the ranks, with the fix, and rita's traceback in her frames, never the lab's."""
    submissions = class_of(tmp_path, "carol")
    (submissions / "rita.py").write_text(
        "import torch.distributed as dist\n"
        "from lab.suite.exercises.ring_allreduce import allreduce  # noqa: F401\n\n\n"
        "def ring_allreduce(tensor):\n"
        "    if dist.get_rank() == 1:\n"
        "        raise RuntimeError('rita gives up')\n"
        "    dist.all_reduce(tensor)\n")
    out = tmp_path / "book"
    result = lab("grade", str(submissions), "--exercise", "ring-allreduce", "--nproc", "3", "--sandbox", "none",
                 "--timeout", "20", "--out", str(out), timeout=300)
    assert result.code == 0, result.text
    carol = (out / "feedback" / "carol.md").read_text()
    assert "## Why, across the ranks" in carol and "**Fix:** " in carol, carol
    assert "every rank receives first" in carol and "carol.py:11" in carol, carol
    assert "/lab/" not in carol.split("## The last lines of rank")[1], carol  # its stack, not the lab's frames
    rita = (out / "feedback" / "rita.md").read_text()
    assert "Rank 1 (local) failed first: it raised RuntimeError: rita gives up at rita.py:7" in rita, rita
    assert "## Rank 1's traceback" in rita and 'rita.py", line 7, in ring_allreduce' in rita, rita
    assert "/lab/" not in rita.split("## Rank 1's traceback")[1], rita
    # each page as a student opens it, from the class page, in a real browser
    page = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom",
                           (out / "index.html").as_uri()], capture_output=True, text=True, timeout=120)
    for student, shown in (("carol", "<strong>Fix:</strong> Let one side send first"),
                           ("rita", "rita gives up at rita.py:7")):
        link = re.search(rf'<a href="(feedback/{student}\.html)">{student}</a>', page.stdout)
        assert link is not None, page.stdout[-3000:]
        dom = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom",
                              (out / link[1]).as_uri()], capture_output=True, text=True, timeout=120).stdout
        assert "<h2>Why, across the ranks</h2>" in dom and shown in dom, dom
    assert lab.leftovers() == []


@pytest.mark.local
def test_a_graded_run_is_replayed_exactly_from_the_seed_its_row_shows(lab: Lab, tmp_path: Path) -> None:
    out = tmp_path / "book"
    result = lab("grade", str(class_of(tmp_path, "bob")), "--exercise", "ring-allreduce", "--nproc", "3",
                 "--sandbox", "none", "--out", str(out), timeout=300)
    assert result.code == 0, result.text
    row = read_grades(out)["bob"]
    assert row["verdict"] == "fail" and re.fullmatch(r"[0-9a-f]{32}", row["seed"]), row
    page = (out / "feedback" / "bob.md").read_text()
    assert f"--seed {row['seed']}` runs it again with the same values" in page, page
    replayed = lab("run", "ring-allreduce", "--nproc", "3", "--solution", str(CLASS / "bob.py"), "--seed",
                   row["seed"], "--json", timeout=300)
    entry = json.loads(replayed.out)["exercises"][0]
    assert entry["reason"] == row["reason"], (entry["reason"], row["reason"])  # the same values, wrong the same way
    bad = lab("run", "p2p", "--seed", row["seed"])
    assert bad.code == 2 and bad.err.strip() == "lab: error: --seed: p2p draw(s) no inputs", bad.err
    # --student bob grades him again though his file did not change (a new run: a new draw)
    args = ("grade", str(tmp_path / "class"), "--exercise", "ring-allreduce", "--nproc", "3", "--sandbox", "none",
            "--out", str(out))
    assert lab(*args, "--student", "bob", timeout=300).code == 0 and read_grades(out)["bob"]["seed"] != row["seed"]
    unknown = lab(*args, "--student", "nobody")
    assert unknown.code == 2 and unknown.err.strip() == \
        f"lab: error: --student nobody: no submission of that name in {tmp_path / 'class'}", unknown.err


@pytest.mark.local
def test_the_tutorials_ring_earns_its_part_and_passes_graded_as_that_part_alone(lab: Lab, tmp_path: Path) -> None:
    submissions = tmp_path / "class"
    submissions.mkdir()
    (submissions / "tutorial.py").write_text(ring_allreduce_fragment())
    (submissions / "alice.py").write_text((CLASS / "alice.py").read_text())
    args = ("grade", str(submissions), "--exercise", "ring-allreduce", "--nproc", "3", "--sandbox", "none")
    result = lab(*args, "--out", str(tmp_path / "whole"), timeout=300)
    assert result.code == 0, result.text
    row = read_grades(tmp_path / "whole")["tutorial"]
    assert (row["verdict"], row["score"]) == ("fail", "0.5"), row
    assert row["reason"] == "ring_allreduce(): not written (the solution does not define it)", row
    assert (row["part allreduce"], row["part ring_allreduce"]) == ("pass", "fail"), row  # a column per part
    part = ET.parse(tmp_path / "whole" / "junit" / "tutorial.xml").getroot().find("testsuite/testcase/properties")
    assert part is not None and {p.get("name"): p.get("value") for p in part} == {
        "score": "0.5", "part allreduce": "pass",
        "part ring_allreduce": "fail: ring_allreduce(): not written (the solution does not define it)"}
    page = (tmp_path / "whole" / "feedback" / "tutorial.md").read_text()
    assert page.startswith("# ring-allreduce: tutorial\n\n**fail**, score 0.5: ring_allreduce(): not written")
    assert "| `allreduce()` | pass |  |" in page
    assert "| `ring_allreduce()` | fail | ring_allreduce(): not written" in page
    assert "allreduce(send, recv): each rank sent 2.00x the bytes of its tensor" in page  # the method, seen
    result = lab(*args, "--part", "allreduce", "--out", str(tmp_path / "part"), timeout=300)
    assert result.code == 0, result.text
    grades = read_grades(tmp_path / "part")
    assert [(grades[s]["verdict"], grades[s]["score"]) for s in ("alice", "tutorial")] == [("pass", "1")] * 2
    # --part runs that part's function alone: hank's allreduce deadlocks, his ring_allreduce is right
    hank = (CLASS / "alice.py").read_text().replace(
        "def allreduce(send, recv):\n", "def allreduce(send, recv):\n    dist.recv(send, (dist.get_rank() - 1) % "
        "dist.get_world_size())  # deadlocks\n", 1)
    (submissions / "hank.py").write_text(hank)
    result = lab(*args, "--part", "ring_allreduce", "--timeout", "20", "--out", str(tmp_path / "ring"), timeout=300)
    assert result.code == 0, result.text
    assert (read_grades(tmp_path / "ring")["hank"]["verdict"], read_grades(tmp_path / "ring")["hank"]["score"]) == \
        ("pass", "1")
    bad = lab(*args, "--part", "ring", "--out", str(tmp_path / "bad"))
    assert bad.code == 2 and "--part ring: ring-allreduce has no such part (its parts are allreduce, " \
                              "ring_allreduce)" in bad.err, bad.text
    assert lab.leftovers() == []


@pytest.mark.local
def test_grading_that_cannot_reach_its_hosts_says_so_and_fails(lab: Lab, tmp_path: Path) -> None:
    """The students are not to blame: the rows say "not graded" and the exit code is the lab's."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("all:\n  vars: {ansible_port: 9, ansible_user: nobody}\n  hosts:\n"
                         "    h1: {ansible_host: 127.0.0.1}\n    h2: {ansible_host: 127.0.0.1}\n")
    submissions = tmp_path / "class"
    submissions.mkdir()
    (submissions / "alice.py").write_text((CLASS / "alice.py").read_text())
    out = tmp_path / "book"
    result = lab("grade", str(submissions), "--exercise", "ring-allreduce", "--hosts", str(inventory),
                 "--out", str(out), timeout=120)
    assert result.code == 3, result.text  # unreachable
    row = read_grades(out)["alice"]
    assert row["verdict"] == "error" and row["reason"].startswith("not graded: host h1"), row


# -- sandboxes (Docker) ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def docker_client():  # type: ignore[no-untyped-def]
    try:
        if os.environ.get("CI") == "true":  # (the image made here, as lab grade makes it, or waited for while
            client = engine.ensure_engine(print)  # another worker's lab up makes it)
            ensure_sandbox_image(client, state.home(), print, lambda line: None)
        else:
            client = engine.client()
        client.images.get(IMAGE)
    except Exception as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"no Docker engine with the lab image ({exc}): `make lab-up` builds it")
    return client


def sandboxes(client, lab: Lab | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    """The sandboxes of this test's graders (this process's, or those ``lab`` ran) now: the other lane's
    tests grade in sandboxes of their own meanwhile (one removed while listed is not one)."""
    owners = {f"{socket.gethostname()}:{pid}" for pid in [os.getpid(), *(lab.started if lab else [])]}
    return [c.name for c in client.containers.list(all=True, ignore_removed=True,
                                                   filters={"label": f"{ROLE}={ROLE_NAME}"})
            if c.labels.get(OWNER_LABEL) in owners]


@pytest.mark.docker
def test_a_class_graded_in_sandboxes_two_at_a_time(lab: Lab, tmp_path: Path, docker_client) -> None:  # type: ignore[no-untyped-def]
    """Every row right, the controller small, nothing left: no sandbox, no daemon, no rank."""
    out = tmp_path / "book"
    result, peak_mb = lab.measured("grade", str(CLASS), "--exercise", "ring-allreduce", "--nproc", "3",
                                   "--parallel", "2", "--timeout", "15", "--memory", "768", "--out", str(out),
                                   timeout=600)
    assert result.code == 0, result.text[-5000:]
    assert_graded_as_expected(read_grades(out), EXPECTED)
    assert sorted(p.name for p in (out / "junit").iterdir()) == sorted(f"{s}.xml" for s in EXPECTED if s != "nobody")
    assert peak_mb < 300, f"the grader grew to {peak_mb} MB"
    assert sandboxes(docker_client, lab) == []
    assert _sleepers(docker_client) == []  # frank's daemons went with his sandbox
    assert lab.leftovers() == []


@pytest.mark.docker
@pytest.mark.default_lab
def test_a_sandboxed_grader_killed_mid_class_leaves_a_sandbox_the_next_one_removes_first(
        lab: Lab, tmp_path: Path, docker_client) -> None:  # type: ignore[no-untyped-def]
    students = ("alice", "bob", "erin", "heidi", "ivan", "walter")
    out = tmp_path / "book"
    args = ("grade", str(class_of(tmp_path, *students)), "--exercise", "ring-allreduce", "--nproc", "3",
            "--timeout", "15", "--out", str(out))
    before = graded_then_killed(lab, args, out, ready=lambda: bool(sandboxes(docker_client, lab)))  # (it stays)
    assert 2 <= len(before) < len(students), before
    assert sandboxes(docker_client, lab), "the killed grader's sandbox is gone already: nothing was tested"
    result = lab(*args, timeout=300)
    assert result.code == 0, result.text
    assert sorted(students_in(out)) == sorted(students)  # each exactly once
    assert_graded_as_expected(read_grades(out), {s: EXPECTED[s] for s in students})
    assert sandboxes(docker_client, lab) == []  # the killed one's too
    assert lab.leftovers() == []


@pytest.mark.docker
def test_a_submission_cannot_reach_the_network_or_write_outside_its_scratch(lab: Lab, tmp_path: Path,
                                                                             docker_client) -> None:  # type: ignore[no-untyped-def]
    """What the sandbox lets a submission see: a user of its own, no route out, a read-only root, no
    lab key, a clean environment; and its processes are bounded."""
    probe = tmp_path / "class" / "mallory.py"
    probe.parent.mkdir()
    probe.write_text('''"""Looks around, and reports what it found as its result."""
import os
import socket
import subprocess
import time


def run(rank, size):
    found = {"uid": os.getuid(), "env": sorted(os.environ)}
    try:
        socket.create_connection(("1.1.1.1", 53), timeout=2)
        found["net"] = "connected"
    except OSError as exc:
        found["net"] = type(exc).__name__
    try:
        open("/etc/owned", "w")
        found["root"] = "writable"
    except OSError:
        found["root"] = "read-only"
    found["keys"] = os.path.exists(os.path.expanduser("~/.ssh")) or os.path.exists("/work")
    children = []
    try:
        for _ in range(200):
            children.append(subprocess.Popen(["sleep", "30"]))
    except OSError as exc:
        found["fork"] = f"{len(children)} then {type(exc).__name__}"
    for child in children:
        child.kill()
    raise RuntimeError(repr(found))
''')
    out = tmp_path / "book"
    result = lab("grade", str(probe.parent), "--exercise", "p2p", "--nproc", "2", "--pids", "32",
                 "--out", str(out), timeout=300)
    assert result.code == 0, result.text
    reason = read_grades(out)["mallory"]["reason"]
    uid = re.search(r"'uid': (\d+)", reason)
    assert uid is not None and int(uid[1]) >= FIRST_USER and "'net': 'OSError'" in reason, reason
    assert "'root': 'read-only'" in reason and "'keys': False" in reason, reason
    assert "LAB_TEST_MARKER" not in reason and "SSH_AUTH_SOCK" not in reason, reason
    assert "'fork': '" in reason and "then BlockingIOError" in reason, reason
    assert sandboxes(docker_client, lab) == []


@pytest.mark.docker
def test_ranks_of_a_container_each_meet_only_where_the_lab_measures_and_in_a_file_where_they_must(
        lab: Lab, tmp_path: Path, docker_client) -> None:  # type: ignore[no-untyped-def]
    """yolanda hands every rank's inputs round through /dev/shm: with a container a rank (--sandbox
    ranks) the others' inputs never come, nor in one container (each rank has a /dev/shm of its own:
    lab.rank.isolation), while alice's ring passes; zed's ranks, as nobody in containers of their
    own, can kill the launcher that measures them, and that fails; and an exercise whose ranks meet
    in a file gets a folder they all mount, gone with the sandbox."""
    submissions = tmp_path / "class"
    submissions.mkdir()
    for student in ("alice", "zed"):
        (submissions / f"{student}.py").write_text((CLASS / f"{student}.py").read_text())
    (submissions / "yolanda.py").write_text((CLASS.parent / "sandbox" / "yolanda.py").read_text())
    apart = lab("grade", str(submissions), "--exercise", "ring-allreduce", "--nproc", "3", "--sandbox", "ranks",
                "--parallel", "2", "--out", str(tmp_path / "apart"), timeout=300)
    assert apart.code == 0, apart.text[-3000:]
    grades = read_grades(tmp_path / "apart")
    assert grades["alice"]["verdict"] == "pass" and "connections carried 17." in (
        tmp_path / "apart" / "feedback" / "alice.md").read_text()  # (its namespace counted once, not three times)
    yolanda = grades["yolanda"]
    assert yolanda["verdict"] == "fail" and "inputs never came through /dev/shm" in yolanda["reason"], yolanda
    zed = grades["zed"]
    assert zed["verdict"] == "fail" and "sandbox-r2 ended before they said what the connections carried" in \
        zed["reason"], zed  # (every rank's launcher, killed by its rank)
    together = lab("grade", str(submissions), "--exercise", "ring-allreduce", "--nproc", "3", "--student", "yolanda",
                   "--out", str(tmp_path / "together"), timeout=300)
    yolanda = read_grades(tmp_path / "together")["yolanda"]
    assert together.code == 0 and yolanda["verdict"] == "fail", together.text
    assert "inputs never came through /dev/shm" in yolanda["reason"], yolanda
    files = tmp_path / "files"
    files.mkdir()
    (files / "fay.py").write_text((REPO / "lab" / "suite" / "exercises" / "init_file.py").read_text())
    met = lab("grade", str(files), "--exercise", "init-file", "--nproc", "2", "--sandbox", "ranks", "--out",
              str(tmp_path / "met"), timeout=300)
    assert met.code == 0 and read_grades(tmp_path / "met")["fay"]["verdict"] == "pass", met.text[-3000:]
    assert sandboxes(docker_client, lab) == []
    assert docker_client.volumes.list(filters={"label": f"{ROLE}={ROLE_NAME}"}) == []


@pytest.mark.docker
def test_the_ranks_of_one_sandbox_container_are_users_of_their_own_with_their_own_files_and_ipc(
        lab: Lab, tmp_path: Path, docker_client) -> None:  # type: ignore[no-untyped-def]
    """wendy's two ranks each leave a file in /tmp, /dev/shm and /dev/mqueue and a System V segment,
    and look for the other's; look into the other rank through /proc, signal it and their launcher,
    make a user namespace and a UDP socket: in one sandbox container none of it reaches
    (lab.rank.isolation)."""
    submissions = tmp_path / "class"
    submissions.mkdir()
    (submissions / "wendy.py").write_text((CLASS.parent / "sandbox" / "wendy.py").read_text())
    out = tmp_path / "book"
    result = lab("grade", str(submissions), "--exercise", "p2p", "--nproc", "2", "--out", str(out), timeout=300)
    assert result.code == 0, result.text
    reason = read_grades(out)["wendy"]["reason"]
    assert "'made': True, 'seen': {'/tmp': False, '/dev/shm': False, '/dev/mqueue': False, 'sysv': False}" in reason, \
        reason
    assert "'peer': True, 'root': 'EACCES', 'mem': 'EACCES', 'signal': 'EPERM', 'launcher': 'EPERM'" in reason, reason
    assert "'userns': 'EPERM', 'udp': 'EPERM'" in reason, reason
    uid = re.search(r"'uid': (\d+), 'user': 'rank(\d+)'", reason)
    assert uid is not None and int(uid[1]) == int(uid[2]) >= FIRST_USER, reason
    assert sandboxes(docker_client, lab) == []


def _sleepers(client) -> list[str]:  # type: ignore[no-untyped-def]
    """frank's daemons (``sleep 900``) on this machine, but those in another test's containers (a lab's
    hosts, where the container lane grades him too): in a sandbox, or in none."""
    others = [c.id for c in client.containers.list(ignore_removed=True) if c.labels.get(ROLE) != ROLE_NAME]
    done = subprocess.run(["pgrep", "-af", "sleep 900"], capture_output=True, text=True)
    found = [(line, _cgroups_of(int(line.split()[0]))) for line in done.stdout.splitlines() if line.strip()]
    return [line for line, groups in found if groups is not None and not any(c in groups for c in others)]


def _cgroups_of(pid: int) -> str | None:
    """The process's control groups (where it runs: a container's id is in its paths); None once it ended."""
    try:
        return Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None


def test_sandboxes_that_could_take_more_memory_than_the_machine_are_refused_before_they_start() -> None:
    limits = Limits(memory_mb=1024)
    limits.check_room(2, 3, 8192)  # 2 x (3 x 1024 + 256) MB fit in 8 GB
    with pytest.raises(ValueError, match=r"4 sandbox\(es\) of 3 rank\(s\) at 1024 MB each .* may take 13312 MB, "
                       r"more than the 8192 MB of the engine's machine: lower --parallel or --memory"):
        limits.check_room(4, 3, 8192)
    with pytest.raises(ValueError, match=r"may take 15360 MB"):  # (a container a rank: 4 x 3 x (1024 + 256))
        limits.check_room(4, 3, 8192, per_rank=True)
    assert Limits.cpus_for(1) == 1.0 and Limits.cpus_for(10_000) == float(os.cpu_count() or 1)


@pytest.mark.docker
def test_a_sandbox_keeps_a_bounded_log_and_a_cpu_a_rank(docker_client) -> None:  # type: ignore[no-untyped-def]
    with Sandbox(docker_client, 2, Limits()) as box:
        config = docker_client.api.inspect_container(box.name)["HostConfig"]
        assert config["LogConfig"] == {"Type": "json-file", "Config": {"max-size": LOG_MAX, "max-file": "1"}}
        assert config["NanoCpus"] == int(Limits.cpus_for(2) * 1e9)
        # PID 1's output, flooded (by root: the ranks, users of their own, cannot write there at all)
        flood = "{ head -c 5000000 /dev/zero | tr '\\0' x; echo; echo end-of-flood; } > /proc/1/fd/1"
        docker_client.containers.get(box.name).exec_run(["/bin/sh", "-c", flood])
        log = Path(docker_client.api.inspect_container(box.name)["LogPath"])

        def log_end() -> bytes:  # (the engine renames and makes the file anew as it rotates: none for a moment)
            try:
                return log.read_bytes()[-300:]
            except FileNotFoundError:
                return b""

        deadline = time.monotonic() + 60  # (the engine copies the output to the log as it can: a busy one lags)
        while b"end-of-flood" not in log_end() and time.monotonic() < deadline:
            time.sleep(0.2)
        # The newest output kept, at most the 1 MiB of one file (in JSON lines) of the 5 MB written: how
        # much of it is there depends on where the last rotation fell (max-file 1: it starts afresh).
        assert b"end-of-flood" in log_end()
        assert log.stat().st_size <= 2 << 20
        refused = docker_client.containers.get(box.name).exec_run(["/bin/sh", "-c", "echo x > /proc/1/fd/1"],
                                                                  user=f"{box.rank_users}")
        assert refused.exit_code != 0 and b"Permission denied" in refused.output
    assert sandboxes(docker_client) == []


@pytest.mark.docker
def test_a_sandbox_is_a_container_a_rank_with_its_own_files_and_processes_on_one_loopback(
        docker_client) -> None:  # type: ignore[no-untyped-def]
    """--sandbox ranks: each rank's container has a bounded log, a CPU, user nobody, its own /tmp,
    /dev/shm, IPC and processes; the ranks have one loopback, on which one's listener is the other's."""
    with Sandbox(docker_client, 2, Limits(), per_rank=True) as box:
        ranks = [docker_client.containers.get(name) for name in box.containers]
        for container in ranks:
            config = docker_client.api.inspect_container(container.id)["HostConfig"]
            assert config["LogConfig"] == {"Type": "json-file", "Config": {"max-size": LOG_MAX, "max-file": "1"}}
            assert config["NanoCpus"] == 10**9
        joined = docker_client.api.inspect_container(ranks[1].id)["HostConfig"]["NetworkMode"]
        assert joined == f"container:{ranks[0].id}"
        flood = "head -c 5000000 /dev/zero | tr '\\0' x > /proc/1/fd/1"  # a rank writing to PID 1's output
        ranks[0].exec_run(["/bin/sh", "-c", flood])
        assert Path(docker_client.api.inspect_container(ranks[0].id)["LogPath"]).stat().st_size <= 2 << 20

        def sh(k: int, command: str) -> str:
            code, out = ranks[k].exec_run(["/bin/sh", "-c", command])
            return f"{code}:{bytes(out).decode().strip()}"

        assert sh(0, "echo x > /tmp/left && echo y > /dev/shm/left && id -u") == "0:65534"
        assert sh(1, "ls /tmp/left /dev/shm/left 2>&1 | grep -c 'No such file'") == "0:2"
        spaces = "readlink /proc/self/ns/ipc /proc/self/ns/mnt /proc/self/ns/pid /proc/self/ns/net"
        (ipc0, mnt0, pid0, net0), (ipc1, mnt1, pid1, net1) = (sh(k, spaces).split("\n") for k in range(2))
        assert ipc0 != ipc1 and mnt0 != mnt1 and pid0 != pid1 and net0 == net1
        listen = "python3 -c \"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 29511)); s.listen(); " \
                 "time.sleep(5)\" >/dev/null 2>&1 &"
        sh(0, listen)
        reach = "python3 -c \"import socket, time; time.sleep(1); socket.create_connection(('127.0.0.1', 29511), 2); " \
                "print('reached')\""
        assert sh(1, reach) == "0:reached"
    assert sandboxes(docker_client) == []


def test_feedback_shows_what_a_student_controls_as_text() -> None:
    from lab.core.judge import ExerciseReport
    from lab.grading.feedback import feedback

    report = ExerciseReport("p2p", "fail", 1.0, "rank 0 raised <b>x</b>", (0,), notes=("a | b",))
    page = feedback("<script>alert(1)</script>", "p2p", "fail", 0.0, "rank 0 raised <b>x</b>\x1b[2J", report)
    assert page.startswith("# p2p: \\<script\\>alert(1)\\</script\\>\n")
    assert "rank 0 raised \\<b\\>x\\</b\\>\\\\x1b\\[2J" in page and "<" not in page.replace("\\<", "")


def chromium() -> str:
    """Debian's chromium (tests/setup-host.sh installs it as root); skips elsewhere, fails under CI."""
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("no chromium: tests/setup-host.sh installs it (Debian's package)")
        pytest.skip("no chromium (Debian: apt-get install chromium)")
    return found


HOSTILE = '<img src=x onerror="document.title=1">'
# Markdown that would be a link, an image and a forged verdict where it not shown as text
PHISHING = "see [your regrade](http://evil.example/login) ![](http://evil.example/t.png) **regraded: pass, score 1**"


def test_the_class_page_renders_in_a_real_browser_sorts_and_shows_what_students_control_as_text(
        tmp_path: Path) -> None:
    students = {"alice": ("pass", ""), HOSTILE: ("fail", f"</td><script>document.title=2</script>{HOSTILE}"),
                "bob": ("fail", "ring_allreduce(): not written"), "carol": ("timeout", f"hung; {PHISHING}")}
    book = Gradebook(tmp_path, list(students), {"exercise": "ring-allreduce"})
    for i, (student, (verdict, reason)) in enumerate(students.items()):
        book.write_feedback(student, feedback(student, "ring-allreduce", verdict, 0.0, reason))
        partial = 0.5 if student == "bob" else None
        book.record(Grade(student, "ring-allreduce", verdict, reason, float(i), partial=partial,
                          parts=(("allreduce", True), ("ring_allreduce", student == "alice"))), "digest")
    page = tmp_path / "index.html"
    done = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", f"{page.as_uri()}#sort=score"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    dom = done.stdout
    assert "CONSOLE" not in done.stderr and "Uncaught" not in done.stderr, done.stderr[-3000:]  # nothing logged
    assert '<table id="grades" data-sorted="score">' in dom  # the script ran, and sorted
    order = re.findall(r'<tr><td data-value="([^"]*)">', dom)
    assert order[:2] == ["alice", "bob"] and set(order[2:]) == {"carol", html.escape(HOSTILE)}, order
    assert "<img" not in dom and "<script>document.title" not in dom  # a student's text stays text
    assert "&lt;img src=x onerror=" in dom and '<a href="feedback/alice.html">alice</a>' in dom
    assert 'id="histogram"' in dom and "<title>ring-allreduce: 4 submission(s)</title>" in dom
    # how many of the class passed each part
    assert "<tr><td>allreduce()</td><td>4</td><td>4</td></tr><tr><td>ring_allreduce()</td><td>1</td><td>4</td></tr>" \
        in dom
    # a feedback page, opened from the class page's link: HTML, a student's text still text
    link = re.search(r'<a href="(feedback/[^"]+\.html)">&lt;img', dom)
    assert link is not None, dom[-3000:]
    shown = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom",
                            (tmp_path / html.unescape(link[1])).as_uri()], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "<h1>ring-allreduce: " in shown.stdout and "<strong>fail</strong>" in shown.stdout, shown.stdout
    assert "<img" not in shown.stdout and "<script>" not in shown.stdout
    # carol's: her program's Markdown shows as the characters it holds; the only emphasis is the lab's verdict
    carol = re.search(r'<a href="(feedback/carol\.html)">', dom)
    assert carol is not None
    shown = subprocess.run([chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--dump-dom",
                            (tmp_path / carol[1]).as_uri()], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-3000:]
    body = shown.stdout.split("<body>", 1)[1]
    assert "<a " not in body and "<img" not in body and re.findall(r"<strong>[^<]*</strong>", body) == [
        "<strong>timeout</strong>"], body
    assert "[your regrade](http://evil.example/login) ![](http://evil.example/t.png) **regraded: pass, score 1**" \
        in html.unescape(body)


@pytest.mark.docker
@pytest.mark.default_lab
def test_a_live_graders_sandbox_is_no_labs_but_a_killed_graders_is(docker_client) -> None:  # type: ignore[no-untyped-def]
    """`lab down` and `lab up` of the default lab leave the sandboxes of a grader that still runs (it
    grades in them), and take those a killed grader left (the owner label says whose)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    made = [docker_client.containers.create(IMAGE, ["true"], name=f"lab-sandbox-test-{n}", network_mode="none",
                                            labels={**labels, OWNER_LABEL: f"{socket.gethostname()}:{pid}"})
            for n, pid in (("live", os.getpid()), ("dead", dead.pid))
            for labels in [{LABEL: "1", NAME_LABEL: DEFAULT_LAB, ROLE: ROLE_NAME}]]
    try:
        names = [c.name for c in resources.lab_containers(docker_client)]
        assert "lab-sandbox-test-dead" in names and "lab-sandbox-test-live" not in names
    finally:
        for container in made:
            container.remove(force=True)


# -- notebooks handed in -----------------------------------------------------------------------

P2P_RUN = (REPO / "lab" / "suite" / "exercises" / "p2p.py").read_text().split('"""', 2)[2]  # (imports and run())


def notebook(path: Path, *cells: str | tuple[str, dict[str, object]]) -> Path:
    """A notebook of code cells (a cell with metadata: (source, metadata)), written as Jupyter writes one."""
    import nbformat

    made = nbformat.v4.new_notebook()
    made.cells = [nbformat.v4.new_code_cell(c) if isinstance(c, str) else
                  nbformat.v4.new_code_cell(c[0], metadata=c[1]) for c in cells]
    nbformat.write(made, path)
    return path


@pytest.mark.local
def test_notebooks_handed_in_are_graded_from_the_cells_that_define_the_functions_and_nothing_else_runs(
        lab: Lab, tmp_path: Path) -> None:
    submissions = tmp_path / "class"
    submissions.mkdir()
    # nora: every cell taken, and a statement that would end the run if any but the definitions ran
    notebook(submissions / "nora.ipynb", "%load_ext lab.notebook\n%lab start --nproc 2",
             "import os\nos._exit(7)", f"%%dist\n{P2P_RUN}", "%%dist\nprint(run(rank, world_size, 'cpu'))")
    # otto: his answer tagged (otter's tag, nbgrader's mark); a draft above it, untagged, is not his answer
    notebook(submissions / "otto.ipynb", "def run(rank, size, device):\n    return {}",
             (P2P_RUN.replace("import torch.distributed as dist\n", ""), {"tags": ["otter_answer_cell"]}),
             ("import torch.distributed as dist", {"nbgrader": {"solution": True, "grade_id": "imports"}}))
    # pia: a wrong ring (every rank receives its own rank)
    notebook(submissions / "pia.ipynb", P2P_RUN.replace("return {\"pair\": tensor.item(), \"ring\": received.item()}",
                                                        "return {\"pair\": tensor.item(), \"ring\": float(rank)}"))
    (submissions / "quinn.ipynb").write_text("{not json")
    (submissions / "rosa").mkdir()
    notebook(submissions / "rosa" / "solution.ipynb", P2P_RUN)
    out = tmp_path / "book"
    result = lab("grade", str(submissions), "--exercise", "p2p", "--nproc", "2", "--sandbox", "none",
                 "--out", str(out), timeout=300)
    grades = read_grades(out)
    assert {s: row["verdict"] for s, row in grades.items()} == {
        "nora": "pass", "otto": "pass", "pia": "fail", "quinn": "error", "rosa": "pass"}, (grades, result.text)
    assert "ring" in grades["pia"]["reason"], grades["pia"]
    assert grades["quinn"]["reason"].startswith("not graded: quinn.ipynb: not a notebook (not JSON: "), grades
    assert result.code == 0 and "5 graded: 3 pass, 1 fail, 1 error" in result.out, result.text  # (it did its job)
    ran = (out / "notebooks" / "nora" / "solution.py").read_text()
    assert "os._exit" not in ran and "# cell 3\ndef run(rank, size, device):" in ran, ran
    page = (out / "feedback" / "otto.md").read_text()
    assert "## The notebook's cells that ran" in page and "return {}" not in page, page
    assert lab.leftovers() == []
