"""What a notebook shows of its ranks (``lab.notebook``): each line as it comes, ``[host rN]`` first
(stderr's on the cell's stderr), and a cell's end: the ranks where it raised, or the run's why
when the cell ended it (a hang, a rank that died), as ``lab launch`` says it.

In a Jupyter kernel a cell's lines are one live display instead, updated as they come: grouped by
rank with its host (HTML, a collapsible group a rank, stderr in red) where the front-end shows HTML,
and the same ``[host rN]`` lines in arrival order where it shows text. A line a progress bar redraws
(``\r``, tqdm's) shows as it was drawn last."""
from __future__ import annotations

import html
import io
import sys
import time
from collections.abc import Iterable
from typing import Any

from rich.console import Console

from lab.cli.views.run import print_launch
from lab.core.outcome import LaunchState, RankState, RunOutcome
from lab.rank.text import printable

REDRAW = 0.25  # seconds between two updates of a cell's live display


def show_line(whose: RankState | LaunchState, stream: str, line: str) -> None:
    """One line of a rank's (or of a host's launcher), as it comes."""
    out = sys.stderr if stream == "err" else sys.stdout
    out.write(f"{_tag(whose)} {_drawn(line)}\n")
    out.flush()


def _tag(whose: RankState | LaunchState) -> str:
    return f"[{whose.spec.host} r{whose.spec.rank}]" if isinstance(whose, RankState) else f"[{whose.launch.host}]"


def _drawn(line: str) -> str:
    """A line as a terminal would show it: what was drawn after its last carriage return."""
    return printable(line.rstrip("\r").rsplit("\r", 1)[-1])


class CellView:
    """A cell's lines in a Jupyter kernel: one display, updated as they come (see the module); elsewhere
    (a terminal's IPython) each line printed as it comes."""

    def __init__(self, shell: Any) -> None:
        self.live = type(shell).__name__ == "ZMQInteractiveShell"  # (ipykernel's: a front-end that displays)
        self.lines: list[tuple[str, int, str, str]] = []  # (tag, its rank or -1, stream, line) as they came
        self.handle: Any = None
        self.shown_at = 0.0

    def __call__(self, whose: RankState | LaunchState, stream: str, line: str) -> None:
        if not self.live:
            show_line(whose, stream, line)
            return
        self.lines.append((_tag(whose), whose.spec.rank if isinstance(whose, RankState) else -1, stream,
                           _drawn(line)))
        if time.monotonic() - self.shown_at > REDRAW:
            self.show()

    def show(self) -> None:
        """Update the display (make it, the first time) with every line so far."""
        if not self.live or not self.lines:
            return
        from IPython.display import display

        shown = _Grouped(list(self.lines))
        if self.handle is None:
            self.handle = display(shown, display_id=True)  # type: ignore[no-untyped-call]
        else:
            self.handle.update(shown)
        self.shown_at = time.monotonic()


class _Grouped:
    """A cell's lines: text in arrival order, HTML grouped by rank."""

    def __init__(self, lines: list[tuple[str, int, str, str]]) -> None:
        self.lines = lines

    def __repr__(self) -> str:
        return "\n".join(f"{tag} {line}" for tag, _, _, line in self.lines)

    def _repr_html_(self) -> str:
        groups: dict[tuple[int, str], list[tuple[str, str]]] = {}
        for tag, rank, stream, line in self.lines:
            groups.setdefault((rank, tag), []).append((stream, line))
        parts = []
        for (_, tag), lines in sorted(groups.items()):
            shown = "".join(f'<span style="color:#c00">{html.escape(line)}</span>\n' if stream == "err"
                            else f"{html.escape(line)}\n" for stream, line in lines)
            parts.append(f'<details open><summary style="cursor:pointer"><b>{html.escape(tag.strip("[]"))}</b> '
                         f'<span style="color:#888">{len(lines)} line(s)</span></summary>'
                         f'<pre style="margin:2px 0 6px 1em">{shown}</pre></details>')
        return "".join(parts)


def show_lines(lines: Iterable[str], error: bool = False) -> None:
    """The lab's own lines (``lab: ...``)."""
    out = sys.stderr if error else sys.stdout
    for line in lines:
        out.write(f"lab: {printable(line)}\n")
    out.flush()


def show_text(out: str, err: str = "") -> None:
    """What a command the notebook ran printed, as it printed it."""
    sys.stdout.write(out)
    sys.stdout.flush()
    sys.stderr.write(err)
    sys.stderr.flush()


def show_timeline(name: str, calls: dict[int, tuple[str, list[tuple[float, float | None, Any]]]]) -> None:
    """A cell's calls on each rank: a picture (SVG: a row a rank, a bar a call, its op and line on
    hover) where the front-end shows one, and a line a call in text."""
    from IPython.display import display

    display(_Timeline(name, calls))  # type: ignore[no-untyped-call]


class _Timeline:
    WIDTH, ROW, LEFT = 900, 26, 110
    COLORS = {"send": "#1f77b4", "recv": "#ff7f0e", "collective": "#2ca02c", "batch": "#9467bd"}

    def __init__(self, name: str, calls: dict[int, tuple[str, list[tuple[float, float | None, Any]]]]) -> None:
        self.name, self.calls = name, calls
        starts = [t0 for _, made in calls.values() for t0, _, _ in made]
        ends = [t1 if t1 is not None else t0 for _, made in calls.values() for t0, t1, _ in made]
        self.zero = min(starts, default=0.0)
        self.span = max(max(ends, default=0.0) - self.zero, 1e-6)

    def __repr__(self) -> str:
        lines = [f"{self.name}: the calls of each rank (ms from the first call's start)"]
        for rank, (host, made) in sorted(self.calls.items()):
            said = ", ".join(f"{r.op} #{r.seq} {1000 * (t0 - self.zero):.1f}-"
                             + (f"{1000 * (t1 - self.zero):.1f}" if t1 is not None else "...") for t0, t1, r in made)
            lines.append(f"  rank {rank} ({host}): {said or 'no call'}")
        return "\n".join(lines)

    def _repr_svg_(self) -> str:
        scale = (self.WIDTH - self.LEFT - 10) / self.span
        height = self.ROW * (len(self.calls) + 1) + 10
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.WIDTH}" height="{height}" '
                 f'font-family="sans-serif" font-size="12">',
                 f'<text x="4" y="16" font-weight="bold">{html.escape(self.name)}: each rank\'s calls, '
                 f'{1000 * self.span:.1f} ms</text>']
        for row, (rank, (host, made)) in enumerate(sorted(self.calls.items()), 1):
            y = row * self.ROW + 6
            parts.append(f'<text x="4" y="{y + 14}">rank {rank} ({html.escape(host)})</text>')
            for t0, t1, record in made:
                x = self.LEFT + (t0 - self.zero) * scale
                width = max(((t1 if t1 is not None else self.zero + self.span) - t0) * scale, 2.0)
                color = self.COLORS.get(record.direction, "#7f7f7f") if t1 is not None else "#d62728"
                tip = f"{record.op} #{record.seq} at {record.where or '?'}: {1000 * ((t1 or t0) - t0):.2f} ms"
                parts.append(f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{self.ROW - 8}" '
                             f'fill="{color}"><title>{html.escape(tip)}</title></rect>')
        parts.append("</svg>")
        return "".join(parts)


def interrupted_where(how: dict[int, str]) -> str:
    """Where each rank's interrupted cell ended: "rank 0 at cell [7]:3, rank 1 had ended it, ..."."""
    def where(said: str) -> str:
        if said == "ok":
            return "had ended it"
        interrupted, _, at = said.partition(" at ")
        return f"at {at}" if interrupted == "raised KeyboardInterrupt" and at else said

    return ", ".join(f"rank {rank} {where(how[rank])}" for rank in sorted(how))


def run_end_text(outcome: RunOutcome) -> str:
    """What ``lab launch`` says of a run that ended (its why first), as plain text."""
    text = io.StringIO()
    console = Console(file=text, width=200, no_color=True, highlight=False, soft_wrap=True, force_terminal=False,
                      force_jupyter=False)
    print_launch(console, "the notebook's ranks", outcome, [s for s in outcome.ranks if not s.done])
    return text.getvalue().strip("\n")
