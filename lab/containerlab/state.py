"""Where the lab keeps what it makes on this machine, and how it keeps that from being planted.

The state belongs to the user and to each lab's name, not to the folder an inventory is written
in (two inventories in /tmp once shared one ``/tmp/.lab``): :func:`home` is ``$LAB_STATE_HOME``,
else ``$XDG_STATE_HOME/lab``, else ``~/.local/state/lab``. In it, ``labs/NAME/`` holds a lab's own
files (its SSH key, known_hosts, the record of its machines, Slurm's key), and the rest is what
labs share (the wheelhouse, the offline base's root).

Every directory of it is made here with mode 0700 and checked each time it is used: one that is a
symlink, belongs to another user or lets others in is refused, one line naming it
(:class:`StateError`, exit 2), and so is a symlink anywhere on the path above it that neither root
nor the user made. Files are written whole and renamed into place (:func:`write`), or made only as
new files (:func:`write_new`: the SSH key), never through a symlink. One lab command at a time
changes a lab (:func:`locked`).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from lab.errors import UsageError

STATE_VAR = "LAB_STATE_HOME"  # where the state lives, when not the default


class StateError(UsageError):
    """A path of the lab's state that is not safe to use (one line: the path, what is wrong)."""


def home() -> Path:
    """The state's top directory (not made here: see :func:`ensure_dir`)."""
    if os.environ.get(STATE_VAR):
        return Path(os.path.abspath(os.environ[STATE_VAR]))
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return Path(os.path.abspath(base)) / "lab"


def shown(path: Path) -> str:
    """``path`` as an inventory names it: under the user's home as ``~/...`` (an inventory that
    every user of the repository can use), else absolute."""
    try:
        return "~/" + path.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(path)


def lab_dir(name: str) -> Path:
    """Where lab ``name``'s own files live (not made here)."""
    return home() / "labs" / name


def ensure_dir(path: Path) -> Path:
    """``path`` (the state's home or a folder in it) and every folder between, made 0700 where
    missing and checked where present; StateError when one is not safe."""
    top = home()
    if path != top and top not in path.parents:
        raise ValueError(f"{path} is not in the lab's state {top}")
    _check_above(top)
    for folder in [top, *reversed([p for p in path.parents if top in p.parents])] + ([path] if path != top else []):
        try:
            os.mkdir(folder, 0o700)  # (never follows a symlink in its place: that is EEXIST)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StateError(f"cannot make the lab's state directory {folder}: {exc.strerror}") from None
        check_dir(folder)
    return path


def _check_above(top: Path) -> None:
    """The folders above the state's home: any symlink among them is root's or the user's own;
    the missing ones are made (0700)."""
    for folder in reversed(top.parents):
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:
                raise StateError(f"cannot make {folder} for the lab's state: {exc.strerror}") from None
            info = os.lstat(folder)
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (0, os.geteuid()):
            raise StateError(f"{folder} is a symlink of another user's (uid {info.st_uid}): the lab keeps no "
                             f"state through it (set {STATE_VAR} to a folder of your own)")


def check_dir(folder: Path) -> None:
    """A folder of the state: a real directory (no symlink), the user's, closed to others."""
    try:
        info = os.lstat(folder)
    except OSError as exc:
        raise StateError(f"the lab's state directory {folder}: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise StateError(f"the lab's state directory {folder} is {_kind(info)}, not a directory: remove it")
    _check_owner(folder, info, "directory")


def check_file(path: Path) -> bool:
    """Whether a file of the state is there; StateError when it is there but not a regular file
    of the user's, closed to others (a symlink, another owner, mode 0644), or a folder on its way
    from the state's home is not safe (:func:`check_dir`)."""
    top = home()
    for folder in [p for p in reversed(path.parents) if p == top or top in p.parents]:
        if not os.path.lexists(folder):
            return False
        check_dir(folder)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode):
        raise StateError(f"the lab's file {path} is {_kind(info)}, not a regular file: remove it")
    _check_owner(path, info, "file")
    return True


def _check_owner(path: Path, info: os.stat_result, what: str) -> None:
    if info.st_uid != os.geteuid():
        raise StateError(f"the lab's {what} {path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): "
                         "remove it")
    if info.st_mode & 0o077:
        raise StateError(f"the lab's {what} {path} has mode {stat.S_IMODE(info.st_mode):04o}: others may "
                         f"reach it (chmod go= {path})")


def _kind(info: os.stat_result) -> str:
    return "a symlink" if stat.S_ISLNK(info.st_mode) else "a directory" if stat.S_ISDIR(info.st_mode) else \
        "not a regular file"


def write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    """Write ``path`` whole, of ``mode``: a new file beside it, renamed over it (what was there is
    replaced, never followed: a symlink in its place goes, not what it points to)."""
    ensure_dir(path.parent)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def write_new(path: Path, data: bytes, mode: int = 0o600) -> Path:
    """Make ``path`` as a new file of ``mode`` holding ``data`` (O_EXCL, O_NOFOLLOW: never an old
    file, never through a symlink); StateError when something is there already."""
    ensure_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        raise StateError(f"the lab's file {path} is there already, unexpected: remove it") from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)  # (whatever the umask)
        f.write(data)
    return path


HOLDER_WAIT = 1.0  # seconds a refused command waits for the lock's holder to say who it is


def _holder(fd: int) -> str:
    """Who holds a lock: its holder writes its pid and command once it has the lock, so a command
    refused in between waits a moment for the words."""
    deadline = time.monotonic() + HOLDER_WAIT
    while True:
        said = os.pread(fd, 100, 0).decode(errors="replace").strip()
        if said or time.monotonic() > deadline:
            return said or "?"
        time.sleep(0.02)


@contextlib.contextmanager
def locked(name: str, doing: str) -> Iterator[None]:
    """Lab ``name`` changed by this command alone (``doing``: "up", "down"); StateError at once
    when another lab command holds it, naming that command's pid."""
    folder = ensure_dir(home() / "locks")
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            raise StateError(f"lab {name} is being changed by another lab command ({holder}): wait for it to "
                             "end") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, {doing}".encode(), 0)
        yield
    finally:
        os.close(fd)  # (which lets go of the lock)
