"""The feedback a student gets back: ``OUT/feedback/<file>.md``, one Markdown page per submission.

What a student needs to fix the work: the verdict and score, each part's verdict and reason, the
values that were wrong, what the method check saw (the bytes each rank sent, whether the ring is
bandwidth-optimal), and the last lines of each rank the failure is about. Pure: text from the
grade and the judged run. Whatever the student controls (names, reasons that quote their output,
their ranks' lines) is shown as text: control characters escaped, HTML's specials as entities
outside code, and their lines in a fence longer than any run of backticks in them.
"""
from __future__ import annotations

import html
import re

from lab.core.judge import ExerciseReport
from lab.core.outcome import RunOutcome
from lab.core.text import printable

MISMATCHES_SHOWN = 10
TAIL_LINES = 20  # of each failing rank's output


def feedback(student: str, exercise: str, verdict: str, score: float, reason: str,
             report: ExerciseReport | None = None, outcome: RunOutcome | None = None) -> str:
    """The page for one submission (``report`` and ``outcome``: its judged run, when it ran)."""
    lines = [f"# {_text(exercise)}: {_text(student)}", "",
             f"**{verdict}**, score {score:g}" + (f": {_text(reason)}" if reason else ""), ""]
    if report is not None and report.parts:
        lines += ["| part | verdict | why |", "|---|---|---|"]
        lines += [f"| `{part.name}()` | {'pass' if part.passed else 'fail'} | {_cell(part.reason)} |"
                  for part in report.parts]
        lines.append("")
    if report is not None and report.mismatches:
        lines += ["## What was wrong", ""]
        lines += [f"- {_text(str(m))}" for m in report.mismatches[:MISMATCHES_SHOWN]]
        if len(report.mismatches) > MISMATCHES_SHOWN:
            lines.append(f"- ... and {len(report.mismatches) - MISMATCHES_SHOWN} more")
        lines.append("")
    if report is not None and report.notes:
        lines += ["## What the lab saw", ""] + [f"- {_text(note)}" for note in report.notes] + [""]
    if report is not None and outcome is not None:
        for rank in report.ranks:
            tail = outcome.ranks[rank].tail if rank < len(outcome.ranks) else []
            if tail:
                shown = [printable(line) for line in list(tail)[-TAIL_LINES:]]
                lines += [f"## The last lines of rank {rank}", "", *_fenced(shown), ""]
    return "\n".join(lines)


def _text(value: str) -> str:
    """Untrusted text in Markdown: printable, and HTML's specials as entities."""
    return html.escape(printable(value), quote=False)


def _cell(value: str) -> str:
    return _text(value).replace("|", "\\|")


def _fenced(lines: list[str]) -> list[str]:
    """Lines in a code fence that none of them can close."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", *lines, fence]
