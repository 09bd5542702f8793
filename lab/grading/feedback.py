"""The feedback a student gets back: ``OUT/feedback/<file>.md``, one Markdown page per submission.

What a student needs to fix the work, as `run --solution` would print it: the verdict and score,
each part's verdict and reason, why the run hung or failed across its ranks (the cause, a line of
evidence per rank, the fix), the values that were wrong, what the method check saw (the bytes each
rank sent, whether the ring is bandwidth-optimal), and for each rank the failure is about its
traceback (the program's frames and torch's last, never the lab's) or else its last lines. Pure: text from the
grade and the judged run. Whatever the student controls (names, reasons that quote their output,
their ranks' lines) is shown as text: control characters escaped, every character of theirs that
Markdown reads as syntax backslash-escaped outside code (no link, image, emphasis or block of
theirs is ever one), and their lines in a fence longer than any run of backticks in them.
"""
from __future__ import annotations

import html
import re

from markdown_it import MarkdownIt

from lab.core.judge import ExerciseReport
from lab.core.outcome import RunOutcome
from lab.core.stacks import users_lines, users_traceback
from lab.grading.notebooks import Extracted
from lab.rank.text import printable
from lab.suite.check import distinct

MISMATCHES_SHOWN = 10
TAIL_LINES = 20  # of each failing rank's output


def feedback(student: str, exercise: str, verdict: str, score: float, reason: str,
             report: ExerciseReport | None = None, outcome: RunOutcome | None = None,
             notebook: Extracted | None = None) -> str:
    """The page for one submission (``report`` and ``outcome``: its judged run, when it ran; ``notebook``:
    what was taken of a notebook hand-in, its cells as they ran)."""
    lines = [f"# {_text(exercise)}: {_text(student)}", "",
             f"**{verdict}**, score {score:g}" + (f": {_text(reason)}" if reason else ""), ""]
    seed = outcome.plan.seed if outcome is not None else None
    if seed and verdict != "pass":
        lines += [f"Its inputs were drawn from seed `{seed}`: `python -m lab run {exercise} --solution "
                  f"YOUR_FILE.py --seed {seed}` runs it again with the same values.", ""]  # (the lab's words)
    if report is not None and report.parts:
        lines += ["| part | verdict | why |", "|---|---|---|"]
        lines += [f"| `{part.name}()` | {'pass' if part.passed else 'fail'} | {_text(part.reason)} |"
                  for part in report.parts]
        lines.append("")
    cause = outcome.cause if outcome is not None else None
    if cause is not None:
        lines += ["## Why, across the ranks", "", _text(cause.headline), ""]
        lines += [f"- {_text(e.line())}" for e in cause.evidence]
        lines += ["", f"**Fix:** {_text(cause.fix)}", ""] if cause.fix else [""]
    if report is not None and report.mismatches:
        errors = distinct(report.mismatches)
        lines += ["## What was wrong", ""]
        lines += [f"- {_text(line)}" for line in errors[:MISMATCHES_SHOWN]]
        if len(errors) > MISMATCHES_SHOWN:
            lines.append(f"- ... and {len(errors) - MISMATCHES_SHOWN} more distinct error(s)")
        lines.append("")
    if report is not None and report.notes:
        lines += ["## What the lab saw", ""] + [f"- {_text(note)}" for note in report.notes] + [""]
    if report is not None and outcome is not None:
        for rank in report.ranks:
            raised = report.details.get(rank)
            shown = (users_traceback(raised).rstrip().splitlines() if raised else
                     users_lines(list(outcome.ranks[rank].tail)) if rank < len(outcome.ranks) else [])[-TAIL_LINES:]
            if shown:
                title = f"Rank {rank}'s traceback" if raised else f"The last lines of rank {rank}"
                lines += [f"## {title}", "", *_fenced([printable(line) for line in shown]), ""]
    if notebook is not None:
        lines += ["## The notebook's cells that ran", "", "Its imports, functions, classes and constants; no other "
                  "statement of it runs.", "", *_fenced([printable(line) for line in notebook.source.splitlines()]),
                  ""]
        lines += [f"- {_text(note)}" for note in notebook.notes] + ([""] if notebook.notes else [])
    return "\n".join(lines)


# What makes Markdown of text (CommonMark, and GFM's tables, strikethrough and bare links): a character
# that starts inline syntax (code, emphasis, links and images, autolinks, e-mail links and HTML, entities, a table's
# cells), a block's marker at the start of a line (a heading, a quote, a list item), a bare link. Each is
# backslash-escaped ("any ASCII punctuation character may be backslash-escaped", and is then itself).
_INLINE = re.compile(r"[\\`*\[\]<>&|~@]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # (snake_case is no emphasis)
_BLOCK_START = re.compile(r"^(\s*)(?:([#>+=-])|(\d+)([.)]))")
_BARE_LINK = re.compile(r"(?i)(:)(//)|(www)(\.)")


def _text(value: str) -> str:
    """Untrusted text in Markdown, shown as the characters it holds (printable), however it is read:
    no link, image, emphasis, code, HTML, table cell or block of its own."""
    text = _INLINE.sub(lambda found: "\\" + found.group(), printable(value))
    text = _BARE_LINK.sub(lambda found: f"{found[1]}\\/\\/" if found[1] else f"{found[3]}\\.", text)
    return _BLOCK_START.sub(lambda found: f"{found[1]}\\{found[2]}" if found[2] else
                            f"{found[1]}{found[3]}\\{found[4]}", text, count=1)


def _fenced(lines: list[str]) -> list[str]:
    """Lines in a code fence that none of them can close."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", *lines, fence]


PAGE_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 2em; max-width: 70em; color: #222; }
table { border-collapse: collapse; } th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
"""
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")  # raw HTML shows as text, never as HTML


def feedback_page(markdown: str, title: str) -> str:
    """The feedback page as HTML, to open from the class page: the Markdown rendered (what a student
    controls in it is text already: escaped, fenced), under the class page's policy (nothing fetched,
    no script)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
            f"<title>{html.escape(printable(title))}</title><style>{PAGE_STYLE}</style></head>\n<body>\n"
            f"{_MARKDOWN.render(markdown)}</body></html>\n")
