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
import queue
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from lab.core.judge import ExerciseReport, judge
from lab.core.outcome import RunOutcome
from lab.core.plan import Options, build_plan
from lab.core.report import to_junit
from lab.core.runner import run_plan
from lab.core.text import printable
from lab.errors import ExitCode, LabError, UsageError
from lab.grading.places import PlaceMaker
from lab.transport.ssh import SSHSettings

GradeVerdict = Literal["pass", "fail", "timeout", "error"]
OUT_OF_MEMORY = ("MemoryError", "can't allocate memory", "Cannot allocate memory")
CSV_FIELDS = ("student", "exercise", "verdict", "score", "reason", "seconds")
# an error of these kinds means the file could not be loaded (a missing function is an ImportError)
LOAD_ERRORS = ("SyntaxError", "IndentationError", "TabError", "ImportError", "ModuleNotFoundError")


@dataclass(frozen=True)
class Submission:
    student: str
    path: Path | None  # the .py file to run; None when there is none to run
    problem: str = ""  # why there is none


@dataclass(frozen=True)
class Grade:
    student: str
    exercise: str
    verdict: GradeVerdict
    reason: str
    seconds: float
    graded: bool = True  # False: the lab failed here, not the student
    exit_code: int = ExitCode.OK  # when not graded: what the failure was (lab.errors.ExitCode)

    @property
    def score(self) -> float:
        return 1.0 if self.verdict == "pass" else 0.0

    def row(self) -> dict[str, str]:
        return {"student": self.student, "exercise": self.exercise, "verdict": self.verdict,
                "score": f"{self.score:g}", "reason": self.reason, "seconds": f"{self.seconds:.1f}"}


# -- submissions ------------------------------------------------------------------------------


def find_submissions(root: Path, program: str) -> list[Submission]:
    """The submissions in ``root``: each ``NAME.py`` is student NAME's; each folder NAME holds
    student NAME's file: ``<program>.py`` (the exercise's own file name), else ``solution.py``,
    else its only ``.py`` file. Hidden entries and caches are not submissions."""
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory of submissions")
    found = []
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_file() and entry.suffix == ".py":
            found.append(Submission(entry.stem, entry))
        elif entry.is_dir():
            found.append(_in_folder(entry, program))
    if not found:
        raise UsageError(f"{root}: no submissions (a NAME.py file or a NAME/ folder per student)")
    return found


def _in_folder(folder: Path, program: str) -> Submission:
    files = sorted(p for p in folder.glob("*.py") if p.is_file())
    for wanted in (f"{program}.py", "solution.py"):
        if (folder / wanted).is_file():
            return Submission(folder.name, folder / wanted)
    if len(files) == 1:
        return Submission(folder.name, files[0])
    if not files:
        return Submission(folder.name, None, f"no .py file in {folder.name}/")
    return Submission(folder.name, None, f"{len(files)} .py files in {folder.name}/ and none is "
                                         f"{program}.py or solution.py")


# -- grading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gradebook:
    """What ``lab grade`` writes: ``grades.csv`` and ``junit/<student>.xml`` in ``out``."""

    out: Path

    def __post_init__(self) -> None:
        (self.out / "junit").mkdir(parents=True, exist_ok=True)

    def junit_path(self, student: str) -> Path:
        return self.out / "junit" / f"{_file_name(student)}.xml"

    def write_csv(self, grades: Sequence[Grade]) -> Path:
        path = self.out / "grades.csv"
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            for grade in sorted(grades, key=lambda g: g.student):  # (a reason may quote a student's output)
                writer.writerow({key: printable(value) for key, value in grade.row().items()})
        return path


def grade_all(submissions: Sequence[Submission], options: Options, places: Sequence[PlaceMaker],
              book: Gradebook, ssh: SSHSettings | None = None, wall: float | None = None,
              on_graded: Callable[[Grade], None] = lambda _: None) -> list[Grade]:
    """Grade every submission, one at a time on each place, all places at once; the grades in
    the order they finished. Ctrl-C (KeyboardInterrupt in the calling thread) stops every run."""
    todo: queue.Queue[Submission] = queue.Queue()
    for submission in submissions:
        todo.put(submission)
    grades: list[Grade] = []
    stop = threading.Event()
    lock = threading.Lock()

    def work(make_place: PlaceMaker) -> None:
        while not stop.is_set():
            try:
                submission = todo.get_nowait()
            except queue.Empty:
                return
            grade = grade_one(submission, options, make_place, book, ssh, wall, stop)
            if stop.is_set():
                return
            with lock:
                grades.append(grade)
            on_graded(grade)

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
    return grades


def grade_one(submission: Submission, options: Options, make_place: PlaceMaker, book: Gradebook,
              ssh: SSHSettings | None, wall: float | None, stop: threading.Event) -> Grade:
    exercise = options.exercises[0].name
    started = time.monotonic()
    if submission.path is None:
        return Grade(submission.student, exercise, "error", submission.problem, 0.0)
    try:
        with make_place() as place:
            plan = build_plan(place.inventory, replace(options, solution=str(submission.path.resolve())))
            outcome = run_plan(plan, ssh=ssh, wall=wall, stop=stop)
            kills = place.memory_kills()
    except LabError as exc:
        return Grade(submission.student, exercise, "error", f"not graded: {exc}".splitlines()[0],
                     time.monotonic() - started, graded=False, exit_code=exc.exit_code)
    reports = judge(outcome)
    book.junit_path(submission.student).write_bytes(to_junit(outcome, reports, suite_name=submission.student))
    verdict, reason = _verdict(outcome, reports)
    if kills and verdict != "pass":
        reason = f"out of memory: the kernel killed {kills} process(es) at the sandbox's limit; {reason}"
    elif options.memory_mb and verdict != "pass" and any(s in reason for s in OUT_OF_MEMORY):
        reason = f"out of memory (the limit is {options.memory_mb} MB per rank): {reason}"
    return Grade(submission.student, exercise, verdict, reason, time.monotonic() - started)


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
    return re.sub(r"[^A-Za-z0-9_.-]", "_", student).lstrip(".") or "_"

