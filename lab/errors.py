"""The lab's exceptions and the exit code each one maps to.

Only the CLI prints or exits; everything else raises one of these. Each error's
message is one line that names the place (``file:line`` for input, the host for a
host problem), so the CLI can print it as is.
"""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of ``python -m lab``; documented in ``--help`` and the README."""

    OK = 0  # every check passed
    CHECK_FAILED = 1  # a check failed (wrong result, an exercise raised)
    BAD_INPUT = 2  # bad usage or bad input (command line, inventory)
    UNREACHABLE = 3  # a host could not be reached
    TIMEOUT = 4  # a rank did not finish in time (hang) and was stopped
    RUN_ERROR = 5  # the run itself broke (a rank died outside an exercise)
    INTERRUPTED = 130  # Ctrl-C / SIGTERM: every rank was stopped


class LabError(Exception):
    """Root of the lab's expected errors: one line, one exit code."""

    exit_code: ExitCode = ExitCode.RUN_ERROR


class UsageError(LabError):
    """The command line asks for something that cannot be done."""

    exit_code = ExitCode.BAD_INPUT


class InventoryError(LabError):
    """The inventory is malformed; the message starts with ``file:line:``."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, source: str, line: int | None, message: str) -> None:
        self.source = source
        self.line = line
        self.message = message
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {message}")


class HostUnreachable(LabError):
    """A host could not be reached; the message names the host."""

    exit_code = ExitCode.UNREACHABLE


class RunError(LabError):
    """A run could not start or broke outside any exercise."""

    exit_code = ExitCode.RUN_ERROR
