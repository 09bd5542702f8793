"""``lab grade``: a class's submissions, each run and checked exactly as ``run EX --solution FILE``
would, several at once, into a gradebook.

The nouns: a :class:`Submission` (one student's file), a *place* to run it (lab.grading.places:
the hosts of an inventory's share, the local cluster, or a throwaway sandbox the grader makes for
each submission: see lab.grading.sandbox), and a :class:`Grade` (the row of the gradebook).
``--parallel K`` makes K places (K shares of the inventory's slots, K local clusters side by side,
or K sandboxes at a time), and K threads each take the next submission until none is left; each
run has its own token, run directory (0700) and ports (lab.core.runner), so they never meet.

A grade's verdict is the student's: ``pass``, ``fail`` (a check failed, a rank died or raised,
the method was not the exercise's), ``timeout`` (a step hung), ``error`` (the submission could
not be run: no file, a syntax error, a missing function). When the lab itself failed (a host
unreachable, a sandbox that did not start) the row says so and the grade is not ``graded``:
``lab grade`` then exits non-zero, whatever the students did.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from lab.core.judge import ExerciseReport, judge
from lab.core.outcome import RunOutcome
from lab.core.plan import Options
from lab.core.planner import build_plan
from lab.core.report import to_junit
from lab.core.runner import run_plan
from lab.errors import ExitCode, LabError, UsageError
from lab.grading import notebooks
from lab.grading.feedback import feedback, feedback_page
from lab.grading.page import Row, class_page
from lab.grading.places import PlaceMaker
from lab.rank.text import exception_line, printable
from lab.transport.ssh.settings import SSHSettings

GradeVerdict = Literal["pass", "fail", "timeout", "error"]
LEFTOVERS_SHOWN = 10  # processes a submission left running, named in its row
OUT_OF_MEMORY = ("MemoryError", "can't allocate memory", "Cannot allocate memory")
CSV_FIELDS = ("student", "exercise", "verdict", "score", "reason", "seconds", "seed")
# an error of these kinds means the file could not be loaded (a missing function is an ImportError)
LOAD_ERRORS = ("SyntaxError", "IndentationError", "TabError", "ImportError", "ModuleNotFoundError")


SUBMISSION_MAX = 1 << 20  # bytes a submission's file may have (a solution is a few KB): a larger one is not run
# (a notebook's may have notebooks.NOTEBOOK_MAX: its outputs, plots too, are in it)
DIGEST_CHUNK = 1 << 16  # bytes read at a time as a submission's file is digested


@dataclass(frozen=True)
class Submission:
    student: str
    path: Path | None  # the .py file to run; None when there is none to run
    problem: str = ""  # why there is none

    def digest(self) -> str:
        """What the submission is, for a grader started again: its file's SHA-256 (or its problem), read
        in chunks and no further than its most bytes (the file was found no larger)."""
        if self.path is None:
            return f"none: {self.problem}"
        sha = hashlib.sha256()
        try:
            with self.path.open("rb") as f:
                for chunk in iter(lambda: f.read(DIGEST_CHUNK), b""):
                    sha.update(chunk)
                    if f.tell() > most_bytes(self.path):
                        return f"grown past {most_bytes(self.path)} bytes"
        except OSError as exc:
            return f"unreadable: {exc.strerror}"
        return sha.hexdigest()


@dataclass(frozen=True)
class Grade:
    student: str
    exercise: str
    verdict: GradeVerdict
    reason: str
    seconds: float
    graded: bool = True  # False: the lab failed here, not the student
    exit_code: int = ExitCode.OK  # when not graded: what the failure was (lab.errors.ExitCode)
    partial: float | None = None  # the fraction of the exercise's parts passed, where it has parts
    parts: tuple[tuple[str, bool], ...] = ()  # (part, passed) for each, where it has parts
    seed: str | None = None  # its run's inputs' seed, where it drew some (`lab run --seed` replays the run)

    @property
    def score(self) -> float:
        if self.verdict == "pass":
            return 1.0
        return self.partial if self.verdict == "fail" and self.partial is not None else 0.0

    def row(self) -> dict[str, str]:
        """Its line of grades.csv: the fields, then a ``part NAME`` column (pass or fail) per part."""
        return {"student": self.student, "exercise": self.exercise, "verdict": self.verdict,
                "score": f"{self.score:g}", "reason": self.reason, "seconds": f"{self.seconds:.1f}",
                "seed": self.seed or "",
                **{f"part {part}": "pass" if passed else "fail" for part, passed in self.parts}}


# -- submissions ------------------------------------------------------------------------------


def find_submissions(root: Path, program: str) -> list[Submission]:
    """One submission for every entry of ``root``, whatever it holds: each ``NAME.py`` file (or
    ``NAME.ipynb``, a notebook: lab.grading.notebooks) is student NAME's; each folder NAME holds student
    NAME's file: ``<program>.py`` (the exercise's own file name), else ``solution.py``, else the same
    as notebooks, else its only ``.py`` or ``.ipynb`` file. Any other entry (a .zip, a file of another
    kind, a link) is a submission that is not run, and says why, as are a folder without such a file
    and a file over SUBMISSION_MAX bytes: none is left out of the gradebook. A symbolic link, or a path
    that resolves outside ``root``, is refused: only what the students handed in is run as theirs,
    never a file of someone else's it points to. Each student's name is unique: where ``NAME.py`` and
    a folder NAME are both there, the file's student is ``NAME.py``."""
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory of submissions")
    entries = sorted(root.iterdir(), key=lambda p: p.name)
    if not entries:
        raise UsageError(f"{root}: no submissions (a NAME.py file or a NAME/ folder per student)")
    full = {entry: entry.name for entry in entries}
    names = {entry: entry.stem if _named_as_hand_in(entry) else entry.name for entry in entries}
    while True:  # (an entry's full name is unique in its folder: moving to it ends every clash)
        seen: dict[str, int] = {}
        for name in names.values():
            seen[name] = seen.get(name, 0) + 1
        clashing = [e for e, name in names.items() if seen[name] > 1 and name != full[e]]
        if not clashing:
            break
        for entry in clashing:
            names[entry] = full[entry]
    return [_submission(entry, names[entry], program, root) for entry in entries]


HAND_INS = (".py", ".ipynb")  # the files a student hands in: a program, or a notebook


def most_bytes(path: Path) -> int:
    """The most bytes a hand-in may have: a notebook's hold its outputs too."""
    return notebooks.NOTEBOOK_MAX if path.suffix == ".ipynb" else SUBMISSION_MAX


def _named_as_hand_in(entry: Path) -> bool:
    """Whether an entry is named as a student's file, NAME.py or NAME.ipynb, and is no folder: its student
    is NAME."""
    return entry.suffix in HAND_INS and not entry.is_dir()


def _submission(entry: Path, student: str, program: str, root: Path) -> Submission:
    shown = entry.relative_to(root)
    refused = _refused(entry, root)
    if refused:
        return Submission(student, None, refused)
    if entry.is_dir():
        return _in_folder(entry, student, program, root)
    if not entry.is_file():
        return Submission(student, None, f"not graded: {shown} is not a regular file")
    if entry.suffix not in HAND_INS:
        return Submission(student, None, f"not graded: {shown} is not a .py file or a notebook (hand in NAME.py "
                                         f"or NAME.ipynb, or a folder NAME/ holding {program}.py)")
    return _sized(Submission(student, entry), shown)


def _sized(submission: Submission, shown: Path) -> Submission:
    """The submission, or, where its file is larger than it may be (most_bytes), why it is not run."""
    assert submission.path is not None
    try:
        size = submission.path.stat().st_size
    except OSError as exc:
        return Submission(submission.student, None, f"not graded: {shown} cannot be read ({exc.strerror})")
    if size > most_bytes(submission.path):
        return Submission(submission.student, None, f"not graded: {shown} has {size} bytes, more than a "
                                                    f"submission may ({most_bytes(submission.path) >> 20} MiB)")
    return submission


def _refused(path: Path, root: Path) -> str | None:
    """Why ``path`` is not taken as a student's: a symbolic link, or outside ``root``."""
    shown = path.relative_to(root)
    if path.is_symlink():
        return f"refused: {shown} is a symbolic link (only files handed in are graded)"
    try:
        path.resolve(strict=True).relative_to(root.resolve(strict=True))
    except (OSError, ValueError):
        return f"refused: {shown} is outside the submissions folder"
    return None


def _in_folder(folder: Path, student: str, program: str, root: Path) -> Submission:
    wanted = [folder / f"{name}{suffix}" for suffix in HAND_INS for name in (program, "solution")]
    chosen = next((p for p in wanted if p.is_symlink() or p.is_file()), None)
    if chosen is None:
        files = sorted(p for p in folder.iterdir() if p.suffix in HAND_INS and (p.is_symlink() or p.is_file()))
        if not files:
            return Submission(student, None, f"no .py file or notebook in {folder.name}/")
        if len(files) > 1:
            return Submission(student, None, f"{len(files)} .py files or notebooks in {folder.name}/ and none is "
                                             f"{program}.py or solution.py")
        chosen = files[0]
    refused = _refused(chosen, root)
    return Submission(student, None, refused) if refused else _sized(Submission(student, chosen),
                                                                       chosen.relative_to(root))


# -- grading ----------------------------------------------------------------------------------


SPREADSHEET_FORMULA = ("=", "+", "-", "@", "\t", "\r")  # a cell starting so is a formula to a spreadsheet
FILE_NAME_MAX = 200  # characters of a student's file names in the book (a file system takes 255 bytes)
JOURNAL = ".gradebook.json"  # what a grader started again reads: the settings, each row and its file's digest


class Gradebook:
    """What ``lab grade`` writes in ``out``: ``grades.csv``, rewritten whole (a new file renamed over
    the old) as each submission ends, so a reader never sees half a row and a grader killed mid-class
    leaves every row it finished; ``junit/<file>.xml`` and ``feedback/<file>.md``, one per student
    and never shared (names a file system cannot take are made safe, and kept apart); ``index.html``,
    the class page (lab.grading.page); and ``.gradebook.json``, from which a grader started again
    with the same ``settings`` keeps each row whose file did not change."""

    def __init__(self, out: Path, students: Sequence[str], settings: dict[str, object]) -> None:
        self.out, self.settings = out, settings
        for folder in ("junit", "feedback"):
            (out / folder).mkdir(parents=True, exist_ok=True)
        self.files = junit_names(students)
        self.grades: dict[str, Grade] = {}
        self.digests: dict[str, str] = {}
        self.notes: list[str] = []  # how the class was graded, for its page (lab.grading.page)
        self.earlier = self._read_journal()  # student -> (its file's digest, its grade) from a grader before
        self._lock = threading.Lock()  # held by whoever writes the book: one writer of its files at a time

    @property
    def csv_path(self) -> Path:
        return self.out / "grades.csv"

    def junit_path(self, student: str) -> Path:
        return self.out / "junit" / f"{self.files[student]}.xml"

    def feedback_path(self, student: str) -> Path:
        return self.out / "feedback" / f"{self.files[student]}.md"

    def notebook_folder(self, student: str) -> Path:
        """Where a student's notebook's solution is written (what ran of it, for whoever looks)."""
        return self.out / "notebooks" / self.files[student]

    def note(self, text: str) -> None:
        """Something the class page says of how the class was graded (one share at a time, and why)."""
        with self._lock:  # a share is taken out by its own thread while others record rows
            self.notes.append(text)
            self._write()

    def write_feedback(self, student: str, markdown: str) -> None:
        """The student's feedback, as Markdown (``feedback_path``) and as the HTML page the class page
        links to, beside it."""
        path = self.feedback_path(student)
        path.write_text(markdown, encoding="utf-8")
        path.with_suffix(".html").write_text(feedback_page(markdown, f"{self.settings.get('exercise', '')}: "
                                                                     f"{student}"), encoding="utf-8")

    def resume(self, submissions: Sequence[Submission], again: Collection[str] = ()) -> list[Submission]:
        """Keep the rows a grader before left for the same files under the same settings (graded,
        with their JUnit file), but those of the students ``again`` names; the submissions still to
        grade."""
        todo = []
        for submission in submissions:
            digest = submission.digest()
            digest_before, grade = self.earlier.get(submission.student, ("", None))
            if submission.student not in again and grade is not None and grade.graded and digest_before == digest and \
                    self.feedback_path(submission.student).is_file():
                self.grades[submission.student], self.digests[submission.student] = grade, digest
            else:
                todo.append(submission)
        self._write()
        return todo

    def record(self, grade: Grade, digest: str) -> None:
        """One more row, on disk at once."""
        with self._lock:
            self.grades[grade.student], self.digests[grade.student] = grade, digest
            self._write()

    def _write(self) -> None:
        # the journal first: a row a reader of grades.csv sees is one a grader started again keeps
        _replace(self.out / JOURNAL, json.dumps({"settings": self.settings, "grades": {
            student: {"digest": self.digests[student], **asdict(grade)} for student, grade in self.grades.items()}}))
        rows = [grade.row() for _, grade in sorted(self.grades.items())]
        _replace(self.csv_path, _csv_text([{key: _cell(value) for key, value in row.items()} for row in rows]))
        exercise = next((g.exercise for g in self.grades.values()), str(self.settings.get("exercise", "")))
        _replace(self.out / "index.html", class_page(exercise, self.notes, [
            Row(g.student, g.verdict, g.score, g.seconds, g.reason, g.parts,
                f"feedback/{self.files[g.student]}.html" if self.feedback_path(g.student).is_file() else None)
            for _, g in sorted(self.grades.items())]))

    def _read_journal(self) -> dict[str, tuple[str, Grade]]:
        try:
            journal = json.loads((self.out / JOURNAL).read_text(encoding="utf-8"))
            if journal.get("settings") != self.settings:
                return {}
            return {student: (str(row.pop("digest")), Grade(**{**row, "parts": tuple(map(tuple, row["parts"]))}))
                    for student, row in journal["grades"].items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError):  # none, or not one of ours: start over
            return {}


def junit_names(students: Sequence[str]) -> dict[str, str]:
    """Each student's JUnit file name: the name itself where it is safe in a path, else a safe form
    of it that no other student's name or safe form takes (``-2``, ``-3``... in name order)."""
    safe = {student: _file_name(student) for student in students}
    taken = {name for student, name in safe.items() if name == student}
    names = {}
    for student in sorted(students):
        name = safe[student]
        if name != student:
            base, n = name, 1
            while name in taken:
                n += 1
                name = f"{base}-{n}"
            taken.add(name)
        names[student] = name
    return names


def _cell(value: str) -> str:
    """A CSV cell as printed, that no spreadsheet reads as a formula (a leading ' makes it text)."""
    shown = printable(value)
    return f"'{shown}" if shown.startswith(SPREADSHEET_FORMULA) else shown


def _csv_text(rows: list[dict[str, str]]) -> str:
    """The gradebook: CSV_FIELDS, then each part's column in the order the rows name them."""
    parts = list(dict.fromkeys(key for row in rows for key in row if key not in CSV_FIELDS))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=[*CSV_FIELDS, *parts], restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _replace(path: Path, text: str) -> None:
    """Write ``path`` whole: a new file, flushed to disk, renamed over the old one."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    with part.open("w", encoding="utf-8", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


def grade_all(submissions: Sequence[Submission], options: Options, places: Sequence[PlaceMaker],
              book: Gradebook, ssh: SSHSettings | None = None, wall: float | None = None,
              on_graded: Callable[[Grade], None] = lambda _: None, say: Callable[[str], None] = lambda _: None) -> None:
    """Grade every submission, one at a time on each place, all places at once, each grade into
    ``book`` as it ends. A place that is not back to nothing after a submission (``Place.unclean``)
    takes no other: the book notes it and ``say`` says it, and where none is left, every submission
    not yet graded is a row saying so. Ctrl-C (KeyboardInterrupt in the calling thread) stops every
    run; the book keeps what was graded."""
    todo: queue.Queue[Submission] = queue.Queue()
    for submission in submissions:
        todo.put(submission)
    stop = threading.Event()

    broke: list[BaseException] = []  # what kept a row from the book: the class stops, and it is raised here

    def work(make_place: PlaceMaker) -> None:
        while not stop.is_set():
            try:
                submission = todo.get_nowait()
            except queue.Empty:
                return
            started = time.monotonic()
            digest = submission.digest()  # (before the run: the file as it was graded)
            unclean = ""
            try:
                grade, unclean = grade_one(submission, options, make_place, book, ssh, wall, stop)
            except KeyboardInterrupt:
                stop.set()
                return
            except Exception as exc:  # (the lab's own failure on one submission: its row says so)
                grade = internal_error(submission, options.exercises[0].name, exc, time.monotonic() - started)
            if stop.is_set():
                return
            try:
                book.record(grade, digest)
                on_graded(grade)
                if unclean:  # (what stayed would be the next submission's: no other runs there)
                    take_out(f"a place taken out of the class after {submission.student}'s submission: {unclean}")
                    return
            except BaseException as exc:
                broke.append(exc)
                stop.set()
                return

    out: list[str] = []  # the places taken out, one line each
    taking_out = threading.Lock()

    def take_out(line: str) -> None:
        book.note(line)
        say(line)
        with taking_out:
            out.append(line)
            if len(out) < len(places):
                return
        while not stop.is_set():  # (the last place is out: every submission left is a row that says why)
            try:
                left = todo.get_nowait()
            except queue.Empty:
                return
            book.record(Grade(left.student, options.exercises[0].name, "error",
                              f"not graded: every place was taken out of the class ({line})", 0.0, graded=False,
                              exit_code=ExitCode.RUN_ERROR), left.digest())
            on_graded(book.grades[left.student])

    threads = [threading.Thread(target=work, args=(p,), name=f"lab-grade-{i}", daemon=True)
               for i, p in enumerate(places)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except BaseException:
        stop.set()
        for t in threads:
            t.join()
        raise
    if broke:
        raise broke[0]


def internal_error(submission: Submission, exercise: str, exc: Exception, seconds: float) -> Grade:
    """The row of a submission the lab failed to grade by a fault of its own (not the student's):
    the exception in one line; the class goes on, and ``lab grade`` exits RUN_ERROR."""
    return Grade(submission.student, exercise, "error", f"not graded: internal error ({exception_line(exc)})", seconds,
                 graded=False, exit_code=ExitCode.RUN_ERROR)


def grade_one(submission: Submission, options: Options, make_place: PlaceMaker, book: Gradebook,
              ssh: SSHSettings | None, wall: float | None, stop: threading.Event) -> tuple[Grade, str]:
    """One submission's grade, and why its place is not back to nothing after it ("" when it is)."""
    exercise = options.exercises[0].name
    started = time.monotonic()
    if submission.path is None:
        book.write_feedback(submission.student, feedback(submission.student, exercise, "error", 0.0,
                                                         submission.problem))
        return Grade(submission.student, exercise, "error", submission.problem, 0.0), ""
    program, taken = submission.path.resolve(), None
    if program.suffix == ".ipynb":  # (the functions its cells define, as a .py file kept beside the book)
        try:
            taken = notebooks.extract(notebooks.read_cells(program), submission.path.name)
        except UsageError as exc:
            reason = f"not graded: {exc}"
            book.write_feedback(submission.student, feedback(submission.student, exercise, "error", 0.0, reason))
            return Grade(submission.student, exercise, "error", reason, 0.0), ""
        program = notebooks.written(taken, "solution", book.notebook_folder(submission.student))
    try:
        with make_place() as place:
            plan = build_plan(place.inventory, replace(options, solution=str(program),
                                                       pids=options.pids if place.own_users else None,
                                                       wire=place.wire, rank_users=place.rank_users))
            outcome = run_plan(plan, ssh=ssh, wall=wall, stop=stop)
            kills, left = place.memory_kills(), place.leftovers()
            unclean = place.unclean()
    except LabError as exc:
        return Grade(submission.student, exercise, "error", f"not graded: {exc}".splitlines()[0],
                     time.monotonic() - started, graded=False, exit_code=exc.exit_code), ""
    reports = judge(outcome)
    book.junit_path(submission.student).write_bytes(to_junit(outcome, reports, suite_name=submission.student))
    verdict, reason = _verdict(outcome, reports)
    partial = min((r.score for r in reports if r.parts), default=None)
    if kills and verdict != "pass":
        reason = f"out of memory: the kernel killed {kills} process(es) at the sandbox's limit; {reason}"
    elif options.memory_mb and verdict != "pass" and any(s in reason for s in OUT_OF_MEMORY):
        reason = f"out of memory (the limit is {options.memory_mb} MB per rank): {reason}"
    if left:  # (named, and stopped before the next submission of its share; a fork bomb's, not one by one)
        more = f" and {len(left) - LEFTOVERS_SHOWN} more" if len(left) > LEFTOVERS_SHOWN else ""
        shown = ", ".join(left[:LEFTOVERS_SHOWN]) + more
        reason = "; ".join(filter(None, [reason, f"left running after its run, stopped: {shown}"]))
    report = next((r for r in reports if not r.passed), reports[0] if reports else None)
    grade = Grade(submission.student, exercise, verdict, reason, time.monotonic() - started, partial=partial,
                  parts=tuple((p.name, p.passed) for p in report.parts) if report else (), seed=outcome.plan.seed)
    book.write_feedback(submission.student, feedback(submission.student, exercise, verdict, grade.score, reason,
                                                     report, outcome, taken))
    return grade, unclean


def _verdict(outcome: RunOutcome, reports: list[ExerciseReport]) -> tuple[GradeVerdict, str]:
    if outcome.status == "interrupted":
        raise KeyboardInterrupt
    failed = next((r for r in reports if not r.passed), None)
    if failed is None:
        return "pass", ""
    if failed.status == "timeout" or outcome.stopped:
        return "timeout", failed.reason or f"stopped after {outcome.plan.timeout:g}s"
    if failed.status == "not run" or any(kind in failed.reason for kind in LOAD_ERRORS):
        return "error", failed.reason
    return "fail", failed.reason


def _file_name(student: str) -> str:
    """A name safe in a path and short enough for any file system (with the suffixes the book adds)."""
    return (re.sub(r"[^A-Za-z0-9_.-]", "_", student).lstrip(".") or "_")[:FILE_NAME_MAX]

