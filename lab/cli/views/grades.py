"""What ``lab grade`` shows: a line per submission as it is graded (under a progress bar), the
gradebook as a table, where it was written.

Students' names and reasons are untrusted: shown through :func:`lab.rank.text.printable` and as
``Text`` (a str cell would be read as rich markup)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from lab.grading.grade import Grade
from lab.rank.text import printable

GRADE_STYLES = {"pass": "bold green", "fail": "bold red", "timeout": "bold red", "error": "yellow"}


def print_one_user_hosts(console: Console, hosts: list[str], at_once: bool) -> None:
    also = "; graded at once, they can read each other's run files" if at_once else ""
    console.print(f"note: {', '.join(hosts)} name no grade_users: the submissions run there as one user, whose "
                  f"connections are not measured (a collective hidden from the call recorder is not caught){also}",
                  style="yellow")


def one_share_at_a_time(hosts: list[str]) -> str:
    return (f"{', '.join(hosts)} cannot keep shares apart (no packet filter of the lab's: their users could reach "
            "each other's sockets), so the submissions are graded one share at a time")


def sharing_a_host(hosts: list[str]) -> str:
    return (f"the shares graded at once on {', '.join(hosts)} share its CPU and memory: each rank has its own "
            "limits (data memory, processes), but no share has a CPU or memory share of its own (no cgroup per "
            "share on these hosts), so one share's load can slow another's run")


def sharing_ports(hosts: list[str]) -> str:
    return (f"the shares graded at once on {', '.join(hosts)} share its ports: a submission that holds them all "
            "leaves another share's ranks none to listen or connect on (only the hosts of a plain lab of this "
            "machine's engine give each share a network of its own)")


@contextlib.contextmanager
def grading_progress(console: Console, exercise: str, submissions: int) -> Iterator[Callable[[Grade], None]]:
    """A progress bar while the block grades; the callable it gives prints a grade above the bar
    and moves the bar on (the bar goes when the block ends)."""
    columns = (SpinnerColumn(), TextColumn("grading {task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(exercise, total=submissions)

        def graded(g: Grade) -> None:
            progress.console.print(Text(f"{g.verdict.upper():8}", style=GRADE_STYLES[g.verdict])
                                   + Text(printable(f"{g.student}  {g.seconds:.1f}s  {g.reason}")), soft_wrap=True)
            progress.advance(task)

        yield graded


def print_gradebook(console: Console, grades: list[Grade]) -> None:
    """The grades as a table, by student, and the count of each verdict (names and reasons as
    Text: a str cell would be read as rich markup)."""
    table = Table("student", "verdict", "score", "seconds", "reason (whole in grades.csv)")
    rows = [(Text(printable(g.student)), Text(g.verdict, style=GRADE_STYLES[g.verdict]), Text(f"{g.score:g}"),
             Text(f"{g.seconds:.1f}"), Text(printable(g.reason))) for g in sorted(grades, key=lambda g: g.student)]
    # the reason takes what the other columns leave (unbounded, a long one would squeeze them out)
    widths = [max([len(str(column.header)), *(row[i].cell_len for row in rows)])
              for i, column in enumerate(table.columns[:-1])]
    reason = table.columns[-1]
    reason.no_wrap, reason.overflow = True, "ellipsis"
    reason.max_width = max(20, console.width - sum(widths) - 3 * len(table.columns) - 1)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    graded = [g for g in grades if g.graded]
    counts = {v: sum(g.verdict == v for g in graded) for v in GRADE_STYLES}
    not_graded = len(grades) - len(graded)
    console.print(f"{len(graded)} graded: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
                  + (f"; {not_graded} not graded (the lab failed there, not the student: see each reason)"
                     if not_graded else ""))


def print_written(console: Console, csv_path: Path, grades: int, junit: Path) -> None:
    console.print(Text(f"wrote {csv_path} and {grades} JUnit file(s) in {junit}"))


def print_resumed(console: Console, out: Path, kept: int, todo: int) -> None:
    console.print(Text(f"lab: {kept} submission(s) already graded in {out} (the same files, the same settings): "
                       f"kept; grading the other {todo}"), soft_wrap=True, highlight=False)
