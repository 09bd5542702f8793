"""The consoles the CLI prints on, the lines it says as it goes, JSON for programs, and the one
line of each error.

A line of text is printed whole however long it is: never wrapped, also when the output is no
terminal (a log or a CI job keeps a path in one piece; rich would wrap at 80 columns there). Only
tables are laid out to the console's width."""
from __future__ import annotations

import contextlib
import json
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from lab.rank.text import printable

Say = Callable[[str], None]


def console(stderr: bool = False) -> Console:
    """A console for a person, on stdout (stderr when stdout carries JSON); no highlighting: what it
    shows is the lab's own words or untrusted text, never to be styled by guess; text never wrapped
    (soft wrap: the terminal folds a long line, a log keeps it whole)."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def sayer(console: Console) -> Say:
    """``lab: MESSAGE``, each message on one line of its own."""
    return lambda message: say_line(console, f"lab: {printable(message)}")


def say_line(console: Console, line: str, style: str = "") -> None:
    """One line as it is (no markup), never wrapped."""
    console.print(Text(line, style=style), highlight=False, soft_wrap=True)


@contextlib.contextmanager
def working(console: Console, what: str) -> Iterator[Say]:
    """A spinner saying ``what`` while the block runs (on a terminal); the callable it gives shows
    the latest line of how it goes in its place, dimmed and cut at 100 characters."""
    with console.status(what, spinner="dots") as status:
        yield lambda line: status.update(Text(line[:100], style="dim"))


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def print_verbatim(text: str) -> None:
    """``text`` as it is, for a program to read (a shell's completion script)."""
    print(text, end="")


def print_error(error: Exception) -> None:
    """A LabError's lines, each one ``lab: error: ...``, on stderr."""
    for line in str(error).splitlines():
        print(f"lab: error: {printable(line)}", file=sys.stderr)


def print_interrupted() -> None:
    print("lab: interrupted", file=sys.stderr)


def print_internal_error(error: Exception, written: Path | None) -> None:
    """A bug in the lab: one line, with where its traceback was ``written`` (None: nowhere, so it
    is printed here, above the line)."""
    if written is None:
        traceback.print_exc()
    frame = traceback.extract_tb(error.__traceback__)[-1]
    print(f"lab: internal error: {type(error).__name__}: {printable(str(error))} "
          f"({Path(frame.filename).name}:{frame.lineno}; full traceback "
          f"{f'in {written}' if written else 'above'})", file=sys.stderr)
