"""The lab's exceptions and the exit code each one maps to.

Only the CLI prints or exits; everything else raises one of these. Each error's
message is one line that names the place (``file:line`` for input, the host for a
host problem), so the CLI can print it as is.
"""
from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of ``python -m lab``; ``--help`` lists them with :attr:`meaning`, and so does the README."""

    OK = 0
    CHECK_FAILED = 1
    BAD_INPUT = 2
    UNREACHABLE = 3
    TIMEOUT = 4
    RUN_ERROR = 5
    NETWORK = 6
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    ExitCode.OK: "every check passed",
    ExitCode.CHECK_FAILED: "a check failed (a wrong result, or an exercise raised or crashed)",
    ExitCode.BAD_INPUT: "bad usage or bad input (command line, inventory)",
    ExitCode.UNREACHABLE: "a host could not be reached, or was lost (went silent) during the run",
    ExitCode.TIMEOUT: "the ranks hung (nothing moved on their connections for --hang-after seconds) or a step "
                      "passed --timeout: stopped",
    ExitCode.RUN_ERROR: "the run itself broke (a rank could not start or died outside any exercise)",
    ExitCode.NETWORK: "the preflight found the network unfit for the job (a host that cannot reach a peer or "
                      "MASTER_ADDR): no rank started",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); every rank was stopped",
}


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
    """A host could not be reached; ``host`` is its inventory name, and the message names it too."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(message)


class HostsUnreachable(LabError):
    """Several hosts could not be reached: each one's error, one line each (a group never stops at
    the first failure)."""

    exit_code = ExitCode.UNREACHABLE

    def __init__(self, errors: Sequence[HostUnreachable]) -> None:
        self.errors = tuple(errors)
        super().__init__("\n".join(str(e) for e in self.errors))

    @classmethod
    def of(cls, errors: Sequence[HostUnreachable]) -> LabError:
        """One host's error as itself, several as a group."""
        return errors[0] if len(errors) == 1 else cls(errors)


class RunError(LabError):
    """A run could not start or broke outside any exercise."""

    exit_code = ExitCode.RUN_ERROR
