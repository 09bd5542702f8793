"""``grade``: a class's submissions, each run and checked, into a gradebook (lab.grading decides
where each runs; this parses, calls and shows)."""
from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from lab.cli.common import (
    DEFAULT_NPROC,
    Commands,
    add_command,
    cluster_options,
    exercise_names,
    ssh_settings,
    unknown_exercise,
)
from lab.cli.views import grades as views
from lab.cli.views import screen
from lab.core.plan import BACKENDS, DEFAULT_TIMEOUT
from lab.errors import ExitCode, UsageError
from lab.grading.grade import Gradebook, find_submissions, grade_all
from lab.grading.places import DEFAULT_WALL, SANDBOXES, GradeRequest, places_for
from lab.grading.sandbox import Limits
from lab.suite import registry

# What grade's exit code says: whether grading worked, not whether the students passed.
GRADE_EXIT_CODES = "exit codes (whether grading worked, not whether the students passed):\n" + "\n".join(
    f"  {int(code):<4} {meaning}" for code, meaning in (
        (ExitCode.OK, "every submission was graded (pass, fail, timeout or error: see the gradebook)"),
        (ExitCode.BAD_INPUT, "bad usage or bad input (command line, inventory, submissions folder)"),
        (ExitCode.UNREACHABLE, "a host could not be reached: the submissions it was to run are not graded"),
        (ExitCode.RUN_ERROR, "grading itself broke for a submission (not the student's doing): not graded"),
        (ExitCode.INTERRUPTED, "interrupted (Ctrl-C or SIGTERM); started again, it grades only what is missing")))


def add_grade(commands: Commands) -> None:
    grading = add_command(
        commands, "grade", help="grade a class: run one exercise with every student's file, write a gradebook",
        description="Run EXERCISE with each submission in SUBMISSIONS (a NAME.py file or a NAME/ folder "
                    "per student) exactly as `run EXERCISE --solution FILE` would, check it, and write "
                    "OUT/grades.csv (student, exercise, verdict, score, reason, seconds) as each one ends, "
                    "a JUnit file and a feedback page per student, and OUT/index.html (the class on one page); "
                    "started again with the same arguments, it grades only what is missing. On the local "
                    "cluster each submission runs in a throwaway "
                    "container (no network, read-only, each rank a user of its own, the limits below); the exit code "
                    "says whether grading worked, not whether the students passed.", exit_codes=GRADE_EXIT_CODES)
    grading.add_argument("submissions", metavar="SUBMISSIONS", help="a folder with one .py file or folder per student")
    exercise_names(grading.add_argument("--exercise", required=True, metavar="NAME",
                                        help="the exercise to grade (see 'list')"))
    cluster_options(grading, shaped=False)
    grading.add_argument("--parallel", type=int, default=1, metavar="K",
                         help="grade K submissions at once, each on its own share of the cluster (default 1)")
    grading.add_argument("--out", default="grades", metavar="DIR", help="where the gradebook goes (default grades)")
    grading.add_argument("--sandbox", choices=SANDBOXES,
                         help="local cluster: container (default) runs each submission in a throwaway "
                              "container; ranks gives each rank a container of its own (its files, /dev/shm, "
                              "IPC and processes apart from the others': a torch import a rank, about twice "
                              "the CPU); none runs it as you, like `run --solution` (with --hosts: none)")
    grading.add_argument("--memory", type=int, default=Limits.memory_mb, metavar="MB",
                         help=f"data memory per rank (RLIMIT_DATA, on every kind of host; default {Limits.memory_mb})")
    grading.add_argument("--pids", type=int, default=Limits.pids, metavar="N",
                         help=f"processes (and threads) per rank: the sandbox's, and on --hosts whose shares log in "
                         f"as grade_users, each share user's (RLIMIT_NPROC; default {Limits.pids})")
    grading.add_argument("--wall", type=float, default=DEFAULT_WALL, metavar="SECONDS",
                         help=f"the longest one submission may run in all (default {DEFAULT_WALL:g})")
    grading.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                         help=f"the longest any rank may spend on one step (default {DEFAULT_TIMEOUT:g})")
    grading.add_argument("--backend", choices=BACKENDS, help="default: as for run")
    again = grading.add_mutually_exclusive_group()
    again.add_argument("--student", action="append", metavar="NAME",
                       help="grade this student again (repeat for more), whether or not their file changed; the "
                            "others' rows stay as they are")
    again.add_argument("--force", action="store_true", help="grade every submission again, as if none had been")
    grading.add_argument("--part", metavar="NAME", help="grade only this part of the exercise: one of the "
                         "functions it asks for (ring-allreduce: allreduce, the tutorial's ring, or ring_allreduce)")
    grading.set_defaults(handler=cmd_grade)


def cmd_grade(args: argparse.Namespace) -> int:
    request = GradeRequest(_one_exercise(args.exercise), args.parallel, args.timeout, args.wall, args.hosts,
                           args.nproc or DEFAULT_NPROC, args.sandbox, Limits(args.memory, args.pids), args.backend,
                           args.part)
    request.check()
    submissions = find_submissions(Path(args.submissions), request.exercise.program.rsplit(".", 1)[-1])
    settings = ssh_settings(args)
    students = [s.student for s in submissions]
    unknown = [name for name in args.student or () if name not in students]
    if unknown:
        raise UsageError(f"--student {unknown[0]}: no submission of that name in {args.submissions}")
    book = Gradebook(Path(args.out), students, request.settings())
    todo = book.resume(submissions, again=students if args.force else args.student or ())
    if args.student:  # (the others as they were: kept where they were graded, else left for a later run)
        todo = [s for s in todo if s.student in args.student]
    console = screen.console()
    if len(todo) < len(submissions):
        views.print_resumed(console, book.out, len(submissions) - len(todo), len(todo))
    if todo:
        with places_for(request, settings, screen.sayer(console), partial(screen.working, console)) as places:
            if places.one_user_hosts:
                views.print_one_user_hosts(console, places.one_user_hosts, places.at_once)
            for note in ([views.one_share_at_a_time(places.unisolated)] if places.unisolated else []) + \
                    ([views.sharing_a_host(places.crowded)] if places.crowded else []) + \
                    ([views.sharing_ports(places.shared_ports)] if places.shared_ports else []):
                book.note(note)
                console.print(f"note: {note}", style="yellow")
            with views.grading_progress(console, request.exercise.name, len(todo)) as graded:
                grade_all(todo, request.options(), places.makers, book, settings, request.wall, on_graded=graded,
                          say=lambda line: console.print(f"note: {line}", style="yellow"))
    grades = list(book.grades.values())
    views.print_gradebook(console, grades)
    views.print_written(console, book.csv_path, len(grades), book.out / "junit")
    failed = [g for g in grades if not g.graded]
    return failed[0].exit_code if failed else ExitCode.OK


def _one_exercise(name: str) -> registry.Exercise:
    if name not in registry.EXERCISES:
        raise unknown_exercise(name)
    return registry.EXERCISES[name]
