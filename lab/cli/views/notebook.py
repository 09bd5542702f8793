"""What a notebook shows of its ranks (``lab.notebook``): each line as it comes, ``[host rN]`` first
(stderr's on the cell's stderr), and a cell's end: the ranks where it raised, or the run's why
when the cell ended it (a hang, a rank that died), as ``lab launch`` says it."""
from __future__ import annotations

import io
import sys
from collections.abc import Iterable

from rich.console import Console

from lab.cli.views.run import print_launch
from lab.core.outcome import LaunchState, RankState, RunOutcome
from lab.rank.text import printable


def show_line(whose: RankState | LaunchState, stream: str, line: str) -> None:
    """One line of a rank's (or of a host's launcher), as it comes."""
    tag = f"[{whose.spec.host} r{whose.spec.rank}]" if isinstance(whose, RankState) else f"[{whose.launch.host}]"
    out = sys.stderr if stream == "err" else sys.stdout
    out.write(f"{tag} {printable(line)}\n")
    out.flush()


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
