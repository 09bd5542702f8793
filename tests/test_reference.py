"""docs/reference.md says what the parser and the exit codes say: regenerated, it is the same file."""
from __future__ import annotations

import argparse

import pytest

from docs.reference import REFERENCE, REGENERATE, Command, render, walk
from lab.cli import build_parser
from lab.containerlab.machines import MACHINE_KEYS
from lab.errors import ExitCode
from lab.inventory.hosts import HOST_KEYS


def test_the_reference_is_up_to_date() -> None:
    assert REFERENCE.read_text() == render(), f"docs/{REFERENCE.name} is stale: regenerate it with {REGENERATE}"


def test_the_reference_does_not_depend_on_the_terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    widths = []
    for columns in ("40", "300"):
        monkeypatch.setenv("COLUMNS", columns)
        widths.append(render(build_parser()))
    assert widths[0] == widths[1]


def test_every_command_option_exit_code_and_key_is_in_it() -> None:
    text = render()
    for command in walk(Command(build_parser(), (), None)):
        assert f"# {' '.join(command.words) or command.parser.prog}\n" in text
        for action in command.parser._actions:
            for flag in action.option_strings:
                if not isinstance(action, argparse._HelpAction):
                    assert f"`{flag}`" in text, flag
    for code in ExitCode:
        assert f"| {int(code)} | `{code.name}` | {code.meaning} |" in text
    for name, key in [*HOST_KEYS.items(), *MACHINE_KEYS.items()]:
        assert f"| `{name}`" in text and " ".join(key.meaning.split()) in text, name
