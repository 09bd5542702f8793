"""Where a hung rank stopped, from the Python stacks it dumps (faulthandler, on SIGUSR1: lab.rank.worker);
a rank's traceback as a person reads it, without the lab's own frames."""
from __future__ import annotations

import re
from pathlib import Path

from lab.core.plan import WORK_DIR, Plan
from lab.rank.cells import CELL_NAME
from lab.rank.ops import FUNCTIONS
from lab.transport.base import PACKAGE_DIR

_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = ("Thread 0x", "Current thread 0x")  # how faulthandler starts each thread's stack
_TRACEBACK_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line \d+')
# the lab's own frames: its rank side, an exercise's driver, runpy
_LABS = re.compile(r"/lab/rank/|/lab/suite/|^<frozen runpy>$|/runpy\.py$")
_TORCHS = re.compile(r"/torch/")
_PYTHONS = re.compile(r"/lib/python3[^/]*/(?!site-packages/|dist-packages/)|<frozen ")  # Python's own modules
_C10D = "/torch/distributed/distributed_c10d.py"


def is_stack_line(line: str) -> bool:
    """Whether a line of stderr is part of a stack dump: a thread's first line, or one of its frames."""
    return line.startswith(_THREAD) or _FRAME.match(line) is not None


def users_lines(lines: list[str]) -> list[str]:
    """A rank's last lines without the lab's in its stack dumps: no frame of the lab's own (the worker,
    the launcher, an exercise's driver), and no thread whose stack holds nothing but the lab's and
    Python's (the recorder's, the relay's): what its program's author should read."""
    kept: list[str] = []
    thread: list[str] = []  # the stack being read: its heading, then its frames but the lab's

    def end_thread() -> None:
        if any(not _PYTHONS.search(frame) for frame in thread[1:]):
            kept.extend(thread)
        thread.clear()

    for line in lines:
        if line.startswith(_THREAD):
            end_thread()
            thread.append(line)
        elif _FRAME.match(line) is not None:
            if not is_labs_frame(line):
                (thread if thread else kept).append(line)
        else:
            end_thread()
            kept.append(line)
    end_thread()
    return kept


def is_labs_frame(line: str) -> bool:
    """Whether a line of stderr is a frame of the lab's own in a stack dump (faulthandler's)."""
    return (m := _FRAME.match(line)) is not None and _LABS.search(m["path"]) is not None


def where_stopped(dump: list[str], programs: dict[str, Path]) -> str | None:
    """Where a faulthandler dump shows the rank: the innermost frame inside a program of the run
    (``programs``: see program_files) or a notebook's cell, as ``file.py:LINE in FUNC: source``
    (``cell [7]:4 in <module>``); else the innermost frame of the thread that runs the exercises (the
    one with lab/rank/worker.py frames), e.g. inside torch, but never one of the lab's own."""
    threads: list[list[re.Match[str]]] = [[]]
    for text in dump:
        if text.startswith(_THREAD):
            threads.append([])
        elif m := _FRAME.match(text):
            threads[-1].append(m)
    frames = [f for t in threads for f in t]
    mine = [m for m in frames if _program_of(m["path"], programs) is not None or CELL_NAME.match(m["path"])]
    main = next((t for t in threads if any(f["path"].endswith("lab/rank/worker.py") and f["func"] != "watch"
                                           for f in t)), None)
    candidates = mine or [f for f in main or frames if not _LABS.search(f["path"])]  # (never the lab's own)
    if not candidates:
        return None
    frame = candidates[0]
    name, line = Path(frame["path"]).name, int(frame["line"])
    source = ""
    local = _program_of(frame["path"], programs)
    if local is not None and local.exists():
        lines = local.read_text(encoding="utf-8", errors="replace").splitlines()
        source = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return f"{name}:{line} in {frame['func']}" + (f": {source}" if source else "")


def called_in(dump: list[str]) -> str | None:
    """The torch.distributed function a faulthandler dump shows the rank inside (the innermost frame
    of torch's distributed_c10d.py that is one of its communication functions): ``all_reduce``,
    ``reduce_scatter_single``; None when none is (a collective issued from C++, DDP's)."""
    for text in dump:
        m = _FRAME.match(text)
        if m is not None and m["path"].endswith(_C10D) and m["func"] in FUNCTIONS:
            return m["func"]
    return None


INSTALLED = ("/site-packages/", "/dist-packages/")  # a library's file, even where it lies in the project (its venv)


def _program_of(path: str, programs: dict[str, Path]) -> Path | None:
    """The local file of the run's program at ``path`` on a host, if it is one: a tail of its path, or
    (a folder, its key ending in "/": a launch in the project itself) any file of ours under it."""
    for tail, local in programs.items():
        if tail.endswith("/"):
            if path.startswith(tail) and not any(part in path for part in INSTALLED) \
                    and not Path(path).is_relative_to(PACKAGE_DIR):
                return Path(path)
        elif path.endswith(f"/{tail}"):
            return local
    return None


def program_files(plan: Plan) -> dict[str, Path]:
    """Every program the plan runs, by the tail of its path on a host (``script/x.py``,
    ``work/pkg/model.py``, ``lab/suite/exercises/ring_allreduce.py``) -> its local file; a launch in
    the project itself (``Plan.in_place``) by its folder ("/home/me/proj/": every file in it)."""
    files = {tail: Path(local) for tail, local in plan.uploads.items() if tail.endswith(".py")}
    files.update({f"{WORK_DIR}/{tail}": Path(local) for tail, local in plan.work.items() if tail.endswith(".py")})
    if plan.in_place:
        files[plan.in_place.rstrip("/") + "/"] = Path(plan.in_place)
    for stage in plan.stages:
        for exercise in stage.exercises:
            program = exercise["program"]
            if not program.endswith(".py"):
                path = PACKAGE_DIR.joinpath(*program.split(".")[1:]).with_suffix(".py")
                files[path.relative_to(PACKAGE_DIR.parent).as_posix()] = path
    return files


def users_traceback(traceback: str) -> str:
    """A Python traceback with the lab's own frames (its worker, script runner, runpy) left out, and
    of torch's frames in a row only the last (where the user's call reached the backend)."""
    frames: list[list[str]] = []  # the lines before the first frame, then each frame with its source lines
    head: list[str] = []
    tail: list[str] = []
    for line in traceback.splitlines():
        if _TRACEBACK_FRAME.match(line):
            frames.append([line])
        elif frames and line.startswith("    "):
            frames[-1].append(line)
        elif frames:
            tail.append(line)
        else:
            head.append(line)
    kept: list[list[str]] = []
    for frame in frames:
        if _LABS.search(_path(frame)):
            continue
        if kept and _TORCHS.search(_path(frame)) and _TORCHS.search(_path(kept[-1])):
            kept.pop()
        kept.append(frame)
    return "\n".join([*head, *(line for frame in kept for line in frame), *tail])


def _path(frame: list[str]) -> str:
    found = _TRACEBACK_FRAME.match(frame[0])
    return found["path"] if found else ""
