"""What a launch's ranks wrote in their project's copy on the hosts, brought back into the project
folder on this machine when the job ends, as if they had run in it (as torchrun's ranks do).

Each host's copy gets a mark once the project is in it (``lab.core.workcache.MARK``, beside it in
the run's directory); what is newer than the mark when the job ends (a checkpoint, a log, a file the job
changed) is what its ranks wrote. Rank 0's host sends its files at once, in one command's tar
stream (its own ``find`` and ``tar``), while the others say the digest of each of theirs
(``sha256sum``); then each other host sends only what rank 0's did not write, or wrote otherwise
(ranks that save the same checkpoint send it once). What comes is read no further than the bound
and written as it comes into a folder in the project's ``.lab/`` (each file's digest taken on the
way), whence each file is renamed into place:

* a path written on one host, or the same on every host that wrote it, at its place;
* a path whose hosts disagree: rank 0's host's at its place, each other host's under
  ``.lab/hosts/HOST/`` (which a launch never carries);
* a file of the project that changed here while the job ran is never overwritten: the host's goes
  under ``.lab/hosts/HOST/`` too.

More than the bound in all (``--bring-back-max``), or a host that could not say or send: nothing of
that host's is brought back, its run directory stays where it is, and a line says where.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import os
import posixpath
import re
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from lab.core.plan import WORK_DIR
from lab.core.workcache import MARK
from lab.core.workdir import NEVER
from lab.transport.base import RankProcess, Transport, for_each_host

if TYPE_CHECKING:
    import pathspec

log = logging.getLogger(__name__)

ASIDE = Path(".lab") / "hosts"  # in the project: what a host wrote that does not go in its place
DEFAULT_MAX_MB = 1024
LIST_TIMEOUT = 60.0  # seconds for a host to list what its ranks wrote (and their digests)
LIST_MAX = 64 << 20  # bytes of that list
FETCH_TIMEOUT = 600.0  # seconds for a host to send it
# sh, $1 the copy, $2 the mark: each file newer than the mark, as "SIZE PATH" and a NUL
LIST = r'cd "$1" 2>/dev/null && find . -type f -newer "$2" -printf "%s %P\0" 2>/dev/null; true'
# sh, the same: each of those files' sha256 and path, a NUL after each
DIGESTS = (r'cd "$1" 2>/dev/null || exit 0; '
           r'find . -type f -newer "$2" -printf "%P\0" 2>/dev/null | xargs -0 -r sha256sum -z -- 2>/dev/null')
# sh, the same: those files in one tar stream (nothing at all where the copy is gone); or, with $3,
# the files whose paths come on stdin (a NUL after each)
SEND = (r'cd "$1" 2>/dev/null || exit 0; if [ -n "$3" ]; then exec tar --null --no-recursion -T - -cf -; fi; '
        r'find . -type f -newer "$2" -printf "%P\0" 2>/dev/null | tar --null --no-recursion -T - -cf -')


@dataclass
class BroughtBack:
    """What came back into the project, and what did not (one line each, as the user reads them)."""

    files: list[str] = field(default_factory=list)  # paths in the project, as written there
    aside: list[str] = field(default_factory=list)  # paths under .lab/hosts/
    size: int = 0
    left: list[str] = field(default_factory=list)  # "node2: 3.1 GiB in /tmp/lab-run-x/work (over ...)"

    def lines(self) -> list[str]:
        said = []
        if self.files or self.aside:
            shown = ", ".join((self.files + self.aside)[:5])
            more = f" and {len(self.files) + len(self.aside) - 5} more" if len(self.files) + len(self.aside) > 5 else ""
            aside = f" ({len(self.aside)} of them under {ASIDE}/: their hosts disagree, or the project's own " \
                    f"changed meanwhile)" if self.aside else ""
            said.append(f"brought back {len(self.files) + len(self.aside)} file(s), {_size(self.size)}, that the "
                        f"ranks wrote into the project: {shown}{more}{aside}")
        said += [f"not brought back: {left}" for left in self.left]
        return said


Synced = dict[str, tuple[int, int]]  # path in the project -> (mtime_ns, size) of what a sync put there


def bring_back(transports: Mapping[str, Transport], project: Path, first: str, since: float,
               max_bytes: int = DEFAULT_MAX_MB << 20, synced: Synced | None = None) -> tuple[BroughtBack, set[str]]:
    """Bring what the ranks wrote on each host back into ``project`` (see the module); ``first``: rank
    0's host (where it ran: torchrun may place it); ``since``: when the job began (time.time(): a file
    of the project changed after it is kept, unless it is as a sync put it: ``synced``). What came
    back, and the hosts whose run directories must stay (what they wrote did not come back)."""
    with _incoming(project) as scratch:
        return _land_all(transports, project, first, _Changed(since, synced or {}), _Budget(max_bytes), scratch)


@contextlib.contextmanager
def _incoming(project: Path) -> Iterator[Path]:
    """A folder in the project's ``.lab/`` for files on their way (on the project's file system:
    renamed into place, never copied), gone after, and ``.lab/`` with it where it holds nothing else."""
    (project / ".lab").mkdir(exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(prefix="incoming-", dir=project / ".lab") as scratch:
            yield Path(scratch)
    finally:
        with contextlib.suppress(OSError):
            (project / ".lab").rmdir()


@dataclass(frozen=True)
class _Changed:
    """Whether a file of the project changed here while the job ran: after ``since``, and not as a
    sync of the job's own put it there."""

    since: float
    synced: Synced

    def __call__(self, project: Path, path: str) -> bool:
        try:
            status = (project / path).stat()
        except FileNotFoundError:
            return False
        return status.st_mtime > self.since and self.synced.get(path) != (status.st_mtime_ns, status.st_size)


def sync(transport: Transport, project: Path, saved: Mapping[str, int], patterns: Sequence[str], since: float,
         max_bytes: int, synced: Synced) -> list[str]:
    """Bring back now what a rank on ``transport``'s host said it saved (``saved``: absolute paths
    there, and the size each had) that lies in its copy of the project and matches ``patterns``,
    each at its place (one changed here meanwhile under .lab/hosts/HOST/; one sent at another size,
    caught being saved again, not at all), noting in ``synced`` what it put there; a line for each
    file, or for what did not come."""
    import pathspec

    assert transport.run_dir is not None
    copy, host = posixpath.join(transport.run_dir, WORK_DIR), transport.host.name
    wanted = pathspec.GitIgnoreSpec.from_lines(patterns)
    sizes = {rel: size for path, size in saved.items() if (rel := posixpath.relpath(posixpath.normpath(path), copy))
             != "." and _the_ranks(rel) and wanted.match_file(rel)}
    paths = sorted(sizes)
    if not paths:
        return []
    budget = _Budget(max_bytes)
    changed = _Changed(since, synced)
    lines = []
    with _incoming(project) as scratch:
        try:
            got = _fetch(transport, scratch, budget, paths)
        except OSError as exc:
            return [f"not brought back as it was saved: {', '.join(paths)} on {host} ({exc}); it comes back at the end"]
        if budget.over:
            return [f"not brought back as it was saved: {', '.join(paths)} on {host}, more than --bring-back-max "
                    f"{_size(max_bytes)}"]
        for path in sorted(got):
            size = (scratch / path).stat().st_size
            if size != sizes.get(path):
                lines.append(f"not brought back as it was saved: {path} on {host}, being saved again as it was sent "
                             "(the next save, or the end, brings it)")
                continue
            target = project / path if not changed(project, path) else project / ASIDE / host / path
            _put(scratch / path, target)
            if target == project / path:
                status = target.stat()
                synced[path] = (status.st_mtime_ns, status.st_size)
            lines.append(f"brought back {target.relative_to(project).as_posix()} ({_size(size)}) from {host}, as "
                         "its rank saved it")
    return lines


def _land_all(transports: Mapping[str, Transport], project: Path, first: str, changed: _Changed, budget: _Budget,
              scratch: Path) -> tuple[BroughtBack, set[str]]:
    """Each host's files fetched into ``scratch`` (its own folder there), then each renamed into place."""
    brought = BroughtBack()
    keep: set[str] = set()
    lead = first if first in transports else sorted(transports)[0]  # (its files at their places)
    staged = {name: scratch / name for name in transports}
    said = for_each_host(dict(transports), lambda t: _fetch(t, staged[lead], budget) if t.host.name == lead
                         else _digests(t))
    lead_sent = said[lead]
    lead_has = lead_sent if not isinstance(lead_sent, BaseException) else {}
    wanted = {name: [path for path, digest in listed.items() if lead_has.get(path) != digest]  # (its own alone)
              for name, listed in said.items() if name != lead and not isinstance(listed, BaseException)}
    fetched: dict[str, dict[str, bytes] | BaseException] = {
        name: said[name] if name == lead or name not in wanted else {} for name in said}  # (what each sent)
    fetched.update(for_each_host({n: transports[n] for n in wanted if wanted[n]},
                                 lambda t: _fetch(t, staged[t.host.name], budget, wanted[t.host.name])))
    if budget.over:
        _say_over(transports, budget.most, brought)
        return brought, set(transports)
    versions: dict[str, dict[str, bool]] = {}  # path -> each host that wrote it -> whether it sent it
    for name, got in sorted(fetched.items()):
        if isinstance(got, BaseException):
            brought.left.append(f"{name}: could not send what its ranks wrote ({got}); it stays in "
                                f"{_copy_of(transports[name])} on {name}")
            keep.add(name)
            continue
        listed = said[name]
        for path in got if isinstance(listed, BaseException) else listed:  # (another host's: all it wrote)
            versions.setdefault(path, {})[name] = path in got
    for path, by_host in sorted(versions.items()):
        target = project / path
        changed_here = changed(project, path)
        placed = lead if lead in by_host else sorted(by_host)[0]
        for name, sent in sorted(by_host.items()):
            if not sent:  # (the same as rank 0's host's)
                continue
            source = staged[name] / path
            size = source.stat().st_size
            if name == placed and not changed_here:
                _put(source, target)
                brought.files.append(path)
            else:
                _put(source, project / ASIDE / name / path)
                brought.aside.append((ASIDE / name / path).as_posix())
            brought.size += size
    return brought, keep


class _Budget:
    """The bytes the hosts may send in all, taken as they come: once over, every host's sending stops."""

    def __init__(self, most: int) -> None:
        self.most, self.left, self.over = most, most, False
        self._lock = threading.Lock()

    def take(self, count: int) -> None:
        with self._lock:
            self.left -= count
            self.over = self.over or self.left < 0
            if self.over:
                raise _OverBound


class _OverBound(Exception):
    pass


class _Counted(io.RawIOBase):
    """A host's stream, each byte read taken from the budget (the tar's headers and padding too)."""

    def __init__(self, stream: IO[bytes], budget: _Budget) -> None:
        self.stream, self.budget = stream, budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.stream.read(min(len(buffer), 1 << 16))
        self.budget.take(len(data))
        buffer[:len(data)] = data
        return len(data)


def _fetch(transport: Transport, into: Path, budget: _Budget, paths: Sequence[str] = ()) -> dict[str, bytes]:
    """The files the host's ranks wrote in their copy (``paths`` of them, where given), in ``into``, as
    they come in its one tar stream (stopped where the budget runs out, or after FETCH_TIMEOUT): path
    -> the digest of its bytes. What is never a rank's (Python's caches, the lab's own) is not kept."""
    assert transport.run_dir is not None
    where = transport.run_dir  # (started there, it holds the run's directory as it sends: lab.rank.reaper)
    process = transport.start(["/bin/sh", "-c", SEND, "sh", posixpath.join(where, WORK_DIR),
                               posixpath.join(where, MARK), "listed" if paths else ""], {}, where)
    expired = threading.Event()

    def expire() -> None:  # (its stream then ends)
        expired.set()
        process.kill()

    timer = threading.Timer(FETCH_TIMEOUT, expire)
    timer.start()
    got: dict[str, bytes] = {}
    stream = io.BufferedReader(_Counted(process.stdout, budget), 1 << 16)
    listed = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)

    def send() -> None:  # (beside the reading: a long list and what tar sends meanwhile never wait on each other)
        with contextlib.suppress(OSError, EOFError, ValueError):
            if listed:
                process.send(listed)
        process.close_stdin()

    sender = threading.Thread(target=send, name="lab-bring-back-list", daemon=True)
    try:
        sender.start()
        if stream.peek(1):  # (nothing at all: the copy is gone)
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                for member in archive:
                    name = _own_path(member)
                    if _the_ranks(name):
                        got[name] = _land(archive, tarfile.data_filter(member, str(into)), into)
        status = _status(process)
    except _OverBound:
        return got
    except tarfile.FilterError as exc:
        raise OSError(f"it sent {exc}") from exc
    except tarfile.TarError as exc:
        if expired.is_set():
            raise OSError(f"not sent within {FETCH_TIMEOUT:g}s") from exc
        raise OSError(f"its tar stream broke off ({exc})") from exc
    finally:
        timer.cancel()
        process.kill()
    if expired.is_set():
        raise OSError(f"not sent within {FETCH_TIMEOUT:g}s")
    if status != 0:
        raise OSError(f"its tar ended with status {status}")
    return got


def _own_path(member: tarfile.TarInfo) -> str:
    """``member``'s path, where it is one its host's ``find`` lists (a file, at a plain relative path in
    the copy); else the host sent what it was not asked for: OSError, and nothing of it is kept."""
    parts = member.name.split("/")
    if not member.isfile() or member.name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise OSError(f"it sent {member.name!r}, {'not a file' if not member.isfile() else 'not a path in its copy'}")
    return member.name


def _land(archive: tarfile.TarFile, member: tarfile.TarInfo, into: Path) -> bytes:
    """``member``'s bytes written under ``into`` as they come; their digest."""
    target = into / member.name
    target.parent.mkdir(parents=True, exist_ok=True)
    source = archive.extractfile(member)
    assert source is not None
    sha = hashlib.sha256()
    with target.open("wb") as f:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            f.write(chunk)
            sha.update(chunk)
    return sha.digest()


def _say_over(transports: Mapping[str, Transport], max_bytes: int, brought: BroughtBack) -> None:
    """Each host's lines when what they wrote is more than the bound: how much it is, and where it stays."""
    listed = for_each_host(dict(transports), _written)
    for name, found in sorted(listed.items()):
        where = f"they stay in {_copy_of(transports[name])} on {name}"
        if isinstance(found, BaseException):
            brought.left.append(f"{name}: more than --bring-back-max {_size(max_bytes)} in all; {where}")
        elif found:
            brought.left.append(f"{name}: {_size(sum(found.values()))} in {len(found)} file(s), more than "
                                f"--bring-back-max {_size(max_bytes)} in all; {where}")


def _written(transport: Transport) -> dict[str, int]:
    """The files the host's ranks wrote in their copy: path -> bytes."""
    files = {}
    for entry in filter(None, _output(transport, LIST).split("\0")):
        size, _, path = entry.partition(" ")
        if size.isdigit() and _the_ranks(path):
            files[path] = int(size)
    return files


def _digests(transport: Transport) -> dict[str, bytes]:
    """The files the host's ranks wrote in their copy: path -> the sha256 of its bytes, as the host says."""
    digests = {}
    for entry in filter(None, _output(transport, DIGESTS).split("\0")):
        digest, _, path = entry.partition("  ")
        if SHA256.fullmatch(digest) and _the_ranks(path):
            digests[path] = bytes.fromhex(digest)
    return digests


SHA256 = re.compile(r"[0-9a-f]{64}")


def _the_ranks(path: str) -> bool:
    """Whether ``path``, as a host named it, is one its ranks may have written in their copy: in it,
    and not what is never a rank's (Python's caches, the lab's own)."""
    return path not in ("", "..") and not path.startswith(("/", "../")) and not _never().match_file(path)


@functools.cache
def _never() -> pathspec.GitIgnoreSpec:
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(NEVER)


def _output(transport: Transport, script: str) -> str:
    """What ``script`` (sh: $1 the host's copy, $2 its mark) prints, whole (a list of every file the
    ranks wrote is never cut), within LIST_TIMEOUT and LIST_MAX bytes; OSError where it is not."""
    assert transport.run_dir is not None
    process = transport.start(["/bin/sh", "-c", script, "sh", posixpath.join(transport.run_dir, WORK_DIR),
                               posixpath.join(transport.run_dir, MARK)], {}, transport.run_dir)
    timer = threading.Timer(LIST_TIMEOUT, process.kill)  # (its stream then ends, and its status is not 0)
    timer.start()
    try:
        process.close_stdin()
        said = process.stdout.read(LIST_MAX + 1)
        status = _status(process)
    finally:
        timer.cancel()
        process.kill()
    if len(said) > LIST_MAX:
        raise OSError(f"it listed more than {_size(LIST_MAX)} of paths")
    if status != 0:
        raise OSError(f"no list within {LIST_TIMEOUT:g}s" if status is None else f"its list ended with status {status}")
    return said.decode("utf-8", "surrogateescape")


def _status(process: RankProcess) -> int | None:
    """``process``'s exit status, once it ends (its streams have): None if it has not within 5 s."""
    deadline = time.monotonic() + 5.0
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return process.poll()


def _put(source: Path, target: Path) -> None:
    """``source`` (whole, beside the project) renamed over ``target``, its folders made."""
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, target)


def _copy_of(transport: Transport) -> str:
    return posixpath.join(transport.run_dir or "its run directory", WORK_DIR)


def _size(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"
