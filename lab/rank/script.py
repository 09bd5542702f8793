"""``python -m lab.rank.script SCRIPT [ARGS...]`` (or ``ARGS`` of the module ``LAB_MODULE`` names):
a user's program as one rank of ``lab launch``.

Like ``python SCRIPT ARGS`` (the script runs as ``__main__``, with its own directory on
``sys.path``; a module as ``python -m`` runs it, the working directory first on ``sys.path``),
in the project's copy on its host (``LAB_WORKDIR``), plus the worker's safety nets
(``lab.rank.worker.start_rank``): the rank's whole process group stops when the controller goes
away (stdin closes), SIGUSR1 dumps every thread's stack, so the lab can say where a hung rank
stopped, and under a per-host launcher its lines are tagged with its rank; what it prints can
never read as an event of the lab's (``lab.rank.output``). It says hello (its rank, pid, host)
to the controller first. Its torch.distributed calls go to the flight recorder
(``lab.rank.flight``), installed as soon as torch is imported: at once if it is (the lab's
launcher loaded it before it forked the rank), else when the script imports it, before the
script's next line, so that its ``from torch.distributed import ...`` binds the recorded
functions (a script that never imports torch pays nothing for it). The rendezvous settings are
in the environment, set by the launcher.

A program that does not simply return says how it ended in an ``end`` event
(``lab.rank.protocol``), before the flight recorder's last dump:

* an exception it did not catch: ``how`` "raised", ``code`` 1, then the traceback on stderr as
  Python prints it, without the lab's frames (this module's, runpy's, the recorder's wrappers),
  and exit status 1 (a KeyboardInterrupt too, where Python would end the process by SIGINT);
* ``sys.exit`` (exit(), ``raise SystemExit``): ``how`` "exited", ``code`` the status the process
  exits with; the SystemExit then goes on as it came (the same status and message as Python's);
* ``os._exit``, which skips atexit and so the recorder's last dump: the rank wraps it before the
  script runs (:func:`reported_exit`) to send ``end`` and that dump first, best effort (in a
  thread given EXIT_WAIT seconds: a held lock or a full or closed channel cannot keep the process
  from exiting with the status asked for).

``where`` is the user's line, ``file.py:LINE`` (the innermost frame that is neither the lab's nor
torch's nor the standard library's; "" when none is).
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from types import FrameType, ModuleType, TracebackType
from typing import NoReturn

from lab.rank import protocol, saves
from lab.rank.files import FILES
from lab.rank.labfiles import LAB_DIRS
from lab.rank.torchcalls import TORCH_CALLS
from lab.rank.watcher import WATCHER
from lab.rank.worker import capped, error_text, start_rank

WORKDIR_VAR = "LAB_WORKDIR"  # lab launch: the folder its ranks start in (the project's copy)
MODULE_VAR = "LAB_MODULE"  # lab launch -m: the module its ranks run (the arguments are its own)
EXIT_WAIT = 3.0  # seconds os._exit gives the rank's last words (its end, its last dump) before it exits
WALK_MAX = 64  # frames looked at for the user's


def main() -> None:
    start_rank()
    rank, restart = int(os.environ.get("RANK", "-1")), restart_count()
    if protocol.CHANNEL is not None:  # (the lab gave it a token)
        protocol.CHANNEL.send("hello", rank=rank, pid=os.getpid(), hostname=socket.gethostname(),
                              local_rank=int(os.environ.get("LOCAL_RANK", "0")), restart=restart)

    def with_torch() -> None:
        record_calls(rank)
        keep_attempts_apart(restart)
        saves.install(rank)
        FILES.install()

    after_torch(with_torch)
    workdir = os.environ.pop(WORKDIR_VAR, None)
    if workdir:  # (the project's copy: relative paths in the program mean what they mean in its folder)
        os.chdir(workdir)
    module = os.environ.pop(MODULE_VAR, None)
    if module:  # as ``python -m MODULE ARGS``: the working directory first on the path
        sys.argv = [module, *sys.argv[1:]]
        sys.path.insert(0, os.getcwd())
        start: Callable[[], object] = lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, *args = sys.argv[1:]
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        start = lambda: runpy.run_path(script, run_name="__main__")
    os._exit = reported_exit(rank, os._exit)  # type: ignore[assignment]  # (the same call: one status)
    run(start, rank)


def restart_count() -> int:
    """How many times torchrun restarted the ranks before this one started (its agent's
    TORCHELASTIC_RESTART_COUNT; 0 under any other launcher)."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(count) if count.isdigit() else 0


def run(start: Callable[[], object], rank: int) -> None:
    """Run the program (``start``) as ``__main__``; if it raises (SystemExit too), say how it ended
    and end as ``python SCRIPT`` would."""
    try:
        start()
    except SystemExit as exc:
        shown = "" if exc.code is None else repr(exc.code)
        say_end(rank, "exited", exit_status(exc.code), f"SystemExit: sys.exit({shown})",
                raised_at(exc.__traceback__), "")
        raise
    except BaseException as exc:  # (KeyboardInterrupt too: the program did not catch it)
        text = "".join(traceback.format_exception(without_lab(exc)))
        where = raised_at(exc.__traceback__)
        TORCH_CALLS.raised(exc)
        if isinstance(exc, SyntaxError) and exc.filename and not exc.filename.startswith("<") and exc.lineno:
            where = f"{os.path.basename(exc.filename)}:{exc.lineno}"  # (the line that is wrong, in a file)
        say_end(rank, "raised", 1, error_text(exc), where, text)
        show_traceback(exc, text)
        raise SystemExit(1) from None


def exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` ends the process with."""
    if code is None:
        return 0
    return code & 0xFF if isinstance(code, int) else 1


def say_end(rank: int, how: str, code: int, error: str, where: str, text: str) -> None:
    """Send ``end`` (see the module), if the rank has a channel that still takes it."""
    channel = protocol.CHANNEL
    if channel is None:
        return
    try:
        channel.send("end", rank=rank, how=how, code=code, error=capped(error), where=capped(where),
                     traceback=capped(text))
    except OSError:  # the channel is gone, and the controller with it
        pass


def show_traceback(exc: BaseException, text: str) -> None:
    """Print ``text`` (``exc``'s traceback) on stderr as Python would: through ``sys.excepthook``
    where one was set (torch.distributed's tags each line with the rank)."""
    try:
        if sys.excepthook is not sys.__excepthook__:
            sys.excepthook(type(exc), exc, exc.__traceback__)
            return
    except Exception:  # (Python too prints the exception itself when the hook fails)
        pass
    sys.stderr.write(text)
    sys.stderr.flush()


# -- where: the user's frames ------------------------------------------------------------------

def is_users(frame: FrameType) -> bool:
    """Whether ``frame`` runs the user's code: not the lab's (its files), nor torch's, nor the
    standard library's (their modules)."""
    if frame.f_code.co_filename.startswith(LAB_DIRS):
        return False
    module = frame.f_globals.get("__name__")
    top = module.partition(".")[0] if isinstance(module, str) else ""
    return top != "torch" and top not in sys.stdlib_module_names


def line_of(frame: FrameType, lineno: int | None) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{lineno or frame.f_code.co_firstlineno}"


def raised_at(tb: TracebackType | None) -> str:
    """The user's line an exception came from: the innermost user's frame of its traceback."""
    where = ""
    while tb is not None:
        if is_users(tb.tb_frame):
            where = line_of(tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    return where


def called_from(frame: FrameType | None) -> str:
    """The user's line a call came from (its caller is ``frame``): the first user's frame outward,
    else the caller's own line."""
    caller = frame
    for _ in range(WALK_MAX):
        if frame is None:
            break
        if is_users(frame):
            return line_of(frame, frame.f_lineno)
        frame = frame.f_back
    return "" if caller is None else line_of(caller, caller.f_lineno)


def without_lab(exc: BaseException) -> BaseException:
    """``exc``, with the frames of the lab and of runpy (which ran the script) taken out of its
    traceback and out of those of the exceptions chained to it, as ``python SCRIPT`` shows them."""
    pending, seen = [exc], set()
    while pending:
        one = pending.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        one.__traceback__ = _kept(one.__traceback__)
        linked = (one.__cause__, one.__context__, *getattr(one, "exceptions", ()))  # (an ExceptionGroup's)
        pending += [e for e in linked if isinstance(e, BaseException)]
    return exc


def _kept(tb: TracebackType | None) -> TracebackType | None:
    kept = []
    while tb is not None:
        frame = tb.tb_frame
        if not frame.f_code.co_filename.startswith(LAB_DIRS) and frame.f_globals.get("__name__") != "runpy":
            kept.append(tb)
        tb = tb.tb_next
    rebuilt = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return rebuilt


# -- os._exit ----------------------------------------------------------------------------------

def reported_exit(rank: int, real_exit: Callable[[int], NoReturn]) -> Callable[[int], NoReturn]:
    """``os._exit`` for the user's program (see the module). The lab's own calls (the zygote ending
    a rank that returned) and those of another process (a child the program forked) are the real
    one alone."""
    pid = os.getpid()

    @functools.wraps(real_exit)
    def _exit(status: int) -> NoReturn:
        try:
            caller = sys._getframe(1)
            if os.getpid() == pid and isinstance(status, int) and -(1 << 31) <= status < 1 << 31 and \
                    not caller.f_code.co_filename.startswith(LAB_DIRS):  # (a status os._exit takes: a C int)
                last_words = threading.Thread(target=_last_words, args=(rank, status, called_from(caller)),
                                              name="lab-exit", daemon=True)
                last_words.start()
                last_words.join(EXIT_WAIT)
        except BaseException:  # (no thread to be had, an interrupt: whatever it is, the process exits)
            pass
        real_exit(status)

    return _exit


def _last_words(rank: int, status: int, where: str) -> None:
    """``end``, then the flight recorder's last dump (it has no atexit to send it)."""
    try:
        say_end(rank, "exited", status & 0xFF, f"os._exit({status})", where, "")
        WATCHER.finish()
    except Exception:  # (best effort: nothing of the lab's on the stderr of a program that ends itself)
        pass


# -- torch, once imported ----------------------------------------------------------------------

def record_calls(rank: int) -> None:
    """Wrap torch.distributed (``lab.rank.calls``) and start the flight recorder's reports."""
    from lab.rank.calls import install

    try:
        install()
    except ImportError:  # a torch built without torch.distributed: nothing to record
        return
    if rank >= 0:
        WATCHER.watch(rank)


def keep_attempts_apart(restart: int) -> None:
    """A restarted attempt's ranks under torchrun meet in their agent's store (TORCHELASTIC_USE_AGENT_STORE),
    which still holds the last attempt's keys: gloo reads its peers' old addresses there and cannot
    connect ("Gloo connectFullMesh failed ... Connection refused"), with plain torchrun too (torch 2.13;
    pytorch/pytorch#167288 is the same with NCCL). So each restarted attempt's env:// rendezvous gets
    keys of its own, a prefix in that store, as a new store would give it; the first attempt's is torch's."""
    if restart == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    rendezvous = sys.modules.get("torch.distributed.rendezvous")  # (the package's name is also a function's)
    create = getattr(rendezvous, "_create_c10d_store", None)
    if rendezvous is None or create is None:  # (a torch without it: as it is)
        return
    from torch.distributed.distributed_c10d import PrefixStore

    def attempts_own(*args: object, **kwargs: object) -> object:
        return PrefixStore(f"lab/attempt-{restart}/", create(*args, **kwargs))

    rendezvous._create_c10d_store = attempts_own  # type: ignore[attr-defined]


def after_torch(then: Callable[[], None]) -> None:
    """Call ``then`` now if torch is imported, else once it is (its module has run)."""
    if "torch" in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterTorch(then))


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds torch as the import system would, with a loader that calls ``then`` once it ran."""

    def __init__(self, then: Callable[[], None]) -> None:
        self.then = then

    def find_spec(self, name: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # (once; and the search below is the import system's own)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Then(spec.loader, self.then)
        return spec


class _Then(importlib.abc.Loader):
    """A module's own loader, then ``then``; the module keeps its own loader."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then()


if __name__ == "__main__":
    main()
