"""The class page: ``OUT/index.html``, one static page to look at a gradebook with.

The class table (sortable: click a column's head, or open the page with ``#sort=COLUMN``), the
histogram of the scores, how many passed each part, and each student's parts and reason, with a
link to their feedback page (HTML: ``lab.grading.feedback.feedback_page``).
No server and nothing fetched from elsewhere: its style and its one small script are in the page.
Everything a student controls (names, reasons that quote their output) goes through
``html.escape``; the script only reorders the rows that are there, and never reads text as HTML.
"""
from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from lab.rank.text import printable

BINS = 5  # histogram bars: scores 0-0.2, ..., 0.8-1

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: left; vertical-align: top; }
th { cursor: pointer; background: #f4f4f4; user-select: none; }
td.reason { max-width: 60em; font-family: monospace; font-size: 12px; white-space: pre-wrap; word-break: break-word; }
.pass { color: #16794c; } .fail { color: #b3261e; } .timeout, .error { color: #9a6700; }
.bars { display: flex; align-items: flex-end; gap: 6px; height: 120px; }
.bar { width: 48px; background: #4a78c2; color: #fff; text-align: center; font-size: 12px; }
.labels { display: flex; gap: 6px; } .labels span { width: 48px; text-align: center; font-size: 12px; }
"""

# Sorts the table's rows by a column: numbers as numbers (data-value), the rest as text.
SCRIPT = """
(function () {
  var table = document.getElementById("grades");
  var heads = table.tHead.rows[0].cells;
  function sortBy(column) {
    var index = -1;
    for (var i = 0; i < heads.length; i++) { if (heads[i].dataset.column === column) { index = i; } }
    if (index < 0) { return; }
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var descending = heads[index].dataset.order !== "ascending" && column !== "student";
    rows.sort(function (a, b) {
      var x = a.cells[index].dataset.value, y = b.cells[index].dataset.value;
      var nx = parseFloat(x), ny = parseFloat(y);
      var order = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
      return descending ? -order : order;
    });
    rows.forEach(function (row) { body.appendChild(row); });
    for (var j = 0; j < heads.length; j++) { heads[j].removeAttribute("aria-sort"); }
    heads[index].setAttribute("aria-sort", descending ? "descending" : "ascending");
    heads[index].dataset.order = descending ? "descending" : "ascending";
    table.dataset.sorted = column;
  }
  for (var i = 0; i < heads.length; i++) {
    heads[i].addEventListener("click", function (event) { sortBy(event.currentTarget.dataset.column); });
  }
  var wanted = /^#sort=([a-z]+)$/.exec(window.location.hash);
  if (wanted) { sortBy(wanted[1]); }
})();
"""


@dataclass(frozen=True)
class Row:
    """One student's line of the page (the gradebook's row, and where its feedback is)."""

    student: str
    verdict: str
    score: float
    seconds: float
    reason: str
    parts: tuple[tuple[str, bool], ...]  # (part, passed)
    feedback: str | None  # the feedback page, relative to the class page


def class_page(exercise: str, notes: Sequence[str], rows: Sequence[Row]) -> str:
    """The whole page, for ``rows`` (in the gradebook's order), with ``notes`` on how it was graded."""
    heads = [("student", "student"), ("verdict", "verdict"), ("score", "score"), ("seconds", "seconds"),
             ("parts", "parts"), ("reason", "reason")]
    body = "\n".join(_row(row) for row in rows)
    table = ('<table id="grades"><thead><tr>'
             + "".join(f'<th data-column="{key}">{label}</th>' for key, label in heads)
             + f"</tr></thead>\n<tbody>\n{body}\n</tbody></table>")
    title = f"{_text(exercise)}: {len(rows)} submission(s)"
    said = "".join(f'<p class="note">note: {_text(note)}</p>\n' for note in notes)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
            f"<title>{title}</title><style>{STYLE}</style></head>\n<body>\n<h1>{title}</h1>\n"
            f"{_summary(rows)}\n{said}{_histogram(rows)}\n{_parts(rows)}{table}\n<script>{SCRIPT}</script>\n"
            "</body></html>\n")


def _row(row: Row) -> str:
    name = _text(row.student)
    student = f'<a href="{html.escape(row.feedback)}">{name}</a>' if row.feedback else name
    parts = ", ".join(f"{_text(part)} {'pass' if passed else 'fail'}" for part, passed in row.parts)
    cells = [(student, row.student), (f'<span class="{row.verdict}">{row.verdict}</span>', row.verdict),
             (f"{row.score:g}", f"{row.score:g}"), (f"{row.seconds:.1f}", f"{row.seconds:.3f}"),
             (parts, parts)]
    shown = "".join(f'<td data-value="{html.escape(printable(value))}">{cell}</td>' for cell, value in cells)
    return f'<tr>{shown}<td class="reason">{_text(row.reason)}</td></tr>'


def _summary(rows: Sequence[Row]) -> str:
    counts = {v: sum(r.verdict == v for r in rows) for v in ("pass", "fail", "timeout", "error")}
    mean = sum(r.score for r in rows) / len(rows) if rows else 0.0
    said = ", ".join(f'<span class="{v}">{n} {v}</span>' for v, n in counts.items() if n)
    return f"<p>{said or 'nothing graded yet'}; mean score {mean:.2f}</p>"


def _parts(rows: Sequence[Row]) -> str:
    """How many of the class passed each part of the exercise (none: the exercise has no parts)."""
    names = list(dict.fromkeys(part for row in rows for part, _ in row.parts))
    if not names:
        return ""
    counts = [(name, sum(passed for row in rows for part, passed in row.parts if part == name),
               sum(part == name for row in rows for part, _ in row.parts)) for name in names]
    body = "".join(f"<tr><td>{_text(name)}()</td><td>{passed}</td><td>{of}</td></tr>" for name, passed, of in counts)
    return ('<h2>Parts</h2><table id="parts"><thead><tr><th>part</th><th>passed</th><th>of</th></tr></thead>'
            f"<tbody>{body}</tbody></table>\n")


def _histogram(rows: Sequence[Row]) -> str:
    """Bars of how many scores fall in each fifth of 0..1 (1 in the last)."""
    counts = [0] * BINS
    for row in rows:
        counts[min(BINS - 1, int(row.score * BINS))] += 1
    top = max(counts) or 1
    bars = "".join(f'<div class="bar" style="height:{round(100 * n / top)}%" title="{n}">{n or ""}</div>'
                   for n in counts)
    labels = "".join(f"<span>{i / BINS:g}-{(i + 1) / BINS:g}</span>" for i in range(BINS))
    return f'<h2>Scores</h2><div class="bars" id="histogram">{bars}</div><div class="labels">{labels}</div>'


def _text(value: str) -> str:
    return html.escape(printable(value))
