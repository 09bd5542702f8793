"""``python -m lab``: the root parser, made of every command's own, and ``main``: it dispatches to
the command's handler and turns what went wrong into one line and an exit code (an internal
error's traceback goes to a debug log only the user can read)."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import platform
import signal
import stat
import sys
import tempfile
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

import lab
from lab.cli.common import EXIT_CODES, Commands, Parser
from lab.cli.views import screen
from lab.errors import ExitCode, LabError, UsageError
from lab.transport.ssh.settings import WIRE_LOG


def add_completion(commands: Commands) -> None:
    completion = commands.add_parser(
        "completion", help="print the shell completion script for `lab` (bash or zsh), to source from your shell's rc",
        description="Print a completion script for the `lab` command: e.g. `lab completion bash >> ~/.bashrc`, "
                    "or `eval \"$(lab completion zsh)\"` in ~/.zshrc. Commands, options and exercise names complete.")
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(handler=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    try:
        from argcomplete.shell_integration import shellcode
    except ImportError:
        raise UsageError("completion needs argcomplete, which this Python lacks: pip install argcomplete "
                         "(make venv installs it)") from None
    screen.print_verbatim(shellcode(["lab"], shell=args.shell))
    return ExitCode.OK


# Each command: its name, and the module of lab.cli and its function that add its parser, in the
# order the top-level help lists them.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("list", "running", "add_list"), ("run", "running", "add_run"), ("grade", "grading", "add_grade"),
    ("up", "labs", "add_up"), ("launch", "running", "add_launch"), ("bench", "bench", "add_bench"),
    ("submit", "running", "add_submit"), ("doctor", "doctor", "add_doctor"), ("down", "labs", "add_down"),
    ("net", "labs", "add_net"), ("break", "labs", "add_break"), ("fix", "labs", "add_fix"),
    ("status", "labs", "add_status"), ("ls", "labs", "add_ls"), ("completion", "main", "add_completion"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The root parser with every command's, or with command ``only``'s alone: a command line that
    names its command imports that command's module only (``lab launch`` no Docker SDK, say)."""
    parser = Parser(
        prog="lab" if Path(sys.argv[0]).name == "lab" else "python -m lab",
        description="Run torch.distributed exercises on a cluster of hosts and check every result.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print the lab's, torch's and Python's versions and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, module, adder in COMMANDS:
        if only is None or name == only:
            add: Callable[[Commands], None] = getattr(importlib.import_module(f"lab.cli.{module}"), adder)
            add(commands)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The command a command line names first, if it is one of COMMANDS; None: build them all (help,
    --version, a mistyped command, the shell asking for completions)."""
    if not argv or "_ARGCOMPLETE" in os.environ:
        return None
    return argv[0] if argv[0] in {name for name, _, _ in COMMANDS} else None


class _Version(argparse.Action):
    """``--version``: the versions, read when asked (torch's metadata costs every other command line)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        screen.print_verbatim(versions() + "\n")
        parser.exit()


def versions() -> str:
    """The lab's version, and the torch it would run (read from its metadata: no import)."""
    import importlib.metadata  # (only here: its import costs every other command line 40 ms)

    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    return f"lab {lab.__version__} (torch {torch}, Python {platform.python_version()})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_named_command(sys.argv[1:] if argv is None else argv))
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (argcomplete answers, and exits)
        with contextlib.suppress(ImportError):
            import argcomplete

            argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    set_up_logging(getattr(args, "verbose", 0) or 0)
    # Ctrl-C and SIGTERM stop every rank on every host, whatever this process inherited: a shell
    # that starts it in the background (and many CI runners) ignores SIGINT for it.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except LabError as exc:
        screen.print_error(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        screen.print_interrupted()
        return ExitCode.INTERRUPTED
    except Exception as exc:  # a bug: one line here, the whole traceback in the debug log
        screen.print_internal_error(exc, write_debug_log(traceback.format_exc()))
        return ExitCode.RUN_ERROR


LOG_SHORT = 240  # characters of a log line at -v (-vv: whole)


class _StepFormatter(logging.Formatter):
    """``lab [+1.23s]: message``: each step with the time since the command started; at -v a
    line cut at LOG_SHORT characters (an inline script, a long command line), at -vv whole."""

    def __init__(self, whole: bool) -> None:
        super().__init__("lab [+%(seconds).2fs]: %(message)s")
        self.whole = whole

    def format(self, record: logging.LogRecord) -> str:
        record.seconds = record.relativeCreated / 1000
        text = super().format(record)
        if self.whole or len(text) <= LOG_SHORT:
            return text
        return f"{text[:LOG_SHORT]}... ({len(text) - LOG_SHORT} more characters: -vv shows them)"


def set_up_logging(verbosity: int) -> None:
    """No log lines but warnings without -v; with -v, the lab's own steps with their times (SSH's
    own wire talk and the libraries' steps left out); with -vv, everything, whole."""
    handler = logging.StreamHandler()
    if verbosity:
        handler.setFormatter(_StepFormatter(whole=verbosity > 1))
    else:
        handler.setFormatter(logging.Formatter("lab: %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbosity > 1 else logging.WARNING, handlers=[handler])
    if verbosity == 1:
        logging.getLogger("lab").setLevel(logging.DEBUG)
        logging.getLogger(WIRE_LOG).setLevel(logging.WARNING)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def debug_log_path() -> Path:
    """Where the traceback of an internal error goes: ``$XDG_STATE_HOME/lab/debug.log``, else
    ``~/.local/state/lab/debug.log``."""
    state = os.environ.get("XDG_STATE_HOME", "")
    return (Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state") / "lab" / "debug.log"


def write_debug_log(text: str) -> Path | None:
    """Write ``text`` where only this user can read it: ``debug_log_path()`` (the file 0600, its
    directory 0700 and the user's), else ``lab-UID/debug.log`` in the temp directory (0700, the
    user's). The file is written anew and renamed into place, so whatever was there (a symlink,
    someone else's file) is replaced, never followed; a directory that is a symlink or someone
    else's is not used. Where it went; None when it could go nowhere."""
    for directory in (debug_log_path().parent, Path(tempfile.gettempdir()) / f"lab-{os.getuid()}"):
        try:
            return _write_private(directory, "debug.log", text)
        except OSError:
            continue
    return None


def _write_private(directory: Path, name: str, text: str) -> Path:
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    found = os.lstat(directory)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise PermissionError(f"{directory}: not a directory of this user's")
    if stat.S_IMODE(found.st_mode) != 0o700:
        os.chmod(directory, 0o700)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.")  # 0600, a new file
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        os.replace(temporary, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return directory / name
