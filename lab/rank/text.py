"""Untrusted text made safe to show: one function for everything the lab prints or writes.

A rank's output, an exception's message, a student's file name: any of it may carry terminal
escapes (``ESC[2J`` clears the grader's screen, a green ``PASS`` forges a result), a carriage
return that overwrites a line, bidi controls that reorder it, or characters XML 1.0 forbids
(which make a JUnit file unreadable). :func:`printable` replaces each such character with its
visible escape (``\\x1b``, ``\\r``, ``\\u202e``), so a reader sees what was printed and
nothing acts on it. Rich markup (``[green]``) is a separate matter: print untrusted text as a
``rich.text.Text`` (or with ``markup=False``), never as a markup string.
"""
from __future__ import annotations

import re

# C0 controls but tab (and newline, where lines are kept), DEL, C1 controls, the bidi and line
# separator controls, and what XML 1.0 cannot hold (lone surrogates, U+FFFE, U+FFFF).
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff"
_IN_LINE = re.compile(f"[\n{_UNSAFE}]")
_IN_LINES = re.compile(f"[{_UNSAFE}]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, newlines: bool = False) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``); tabs are kept, and
    line breaks too when ``newlines``."""
    return (_IN_LINES if newlines else _IN_LINE).sub(_escape, text)


def exception_line(exc: BaseException, limit: int = 200) -> str:
    """An exception as one line: its type, then the first line of its message (printable, cut)."""
    said = printable(str(exc).strip().split("\n", 1)[0])[:limit]
    return f"{type(exc).__name__}{': ' + said if said else ''}"
