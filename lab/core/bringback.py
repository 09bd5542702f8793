"""What a launch's ranks wrote in their project's copy on the hosts, brought back into the project
folder on this machine when the job ends, as if they had run in it (as torchrun's ranks do).

Each host's copy gets a mark once the project is in it (:data:`MARK`, beside it in the run's
directory); what is newer than the mark when the job ends (a checkpoint, a log, a file the job
changed) is what its ranks wrote. Each host's files come back in one tar stream (its own ``tar``,
read no further than the bound), and land in the project:

* a path written on one host, or the same on every host that wrote it, at its place;
* a path whose hosts disagree: rank 0's host's at its place, each other host's under
  ``.lab/hosts/HOST/`` (which a launch never carries);
* a file of the project that changed here while the job ran is never overwritten: the host's goes
  under ``.lab/hosts/HOST/`` too.

More than the bound in all (``--bring-back-max``), or a host that could not say or send: nothing of
that host's is brought back, its run directory stays where it is, and a line says where.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import posixpath
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.core.plan import WORK_DIR
from lab.core.workdir import NEVER
from lab.transport.base import Transport, for_each_host

log = logging.getLogger(__name__)

MARK = ".lab-carried"  # in the run's directory: touched once the project's copy is whole
ASIDE = Path(".lab") / "hosts"  # in the project: what a host wrote that does not go in its place
DEFAULT_MAX_MB = 1024
LIST_TIMEOUT = 30.0  # seconds for a host to list what its ranks wrote
FETCH_TIMEOUT = 600.0  # seconds for a host to send it
# sh, $1 the copy, $2 the mark: each file newer than the mark, as "SIZE PATH" and a NUL
LIST = r'cd "$1" 2>/dev/null && find . -type f -newer "$2" -printf "%s %P\0" 2>/dev/null; true'


def mark(transport: Transport, run_dir: str) -> None:
    """Mark the project's copy on the host as whole: what its ranks write is newer than this."""
    status, said = transport.call(["touch", posixpath.join(run_dir, MARK)], LIST_TIMEOUT)
    if status != 0:
        log.debug("host %s: cannot mark the project's copy (%s): nothing will be brought back", transport.host.name,
                  said.strip())


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


def bring_back(transports: Mapping[str, Transport], project: Path, first: str, since: float,
               max_bytes: int = DEFAULT_MAX_MB << 20) -> tuple[BroughtBack, set[str]]:
    """Bring what the ranks wrote on each host back into ``project`` (see the module); ``first``: rank
    0's host (where it ran: torchrun may place it); ``since``: when the job began (time.time(): a file
    of the project changed after it is kept). What came back, and the hosts whose run directories must
    stay (what they wrote did not come back)."""
    brought = BroughtBack()
    listed = for_each_host(dict(transports), _written)
    hosts: dict[str, dict[str, int]] = {}
    keep: set[str] = set()
    for name, found in listed.items():
        if isinstance(found, BaseException):
            brought.left.append(f"{name}: could not list what its ranks wrote ({found}); its run directory stays")
            keep.add(name)
        elif found:
            hosts[name] = found
    total = sum(sum(files.values()) for files in hosts.values())
    if total > max_bytes:
        for name, files in sorted(hosts.items()):
            brought.left.append(f"{name}: {_size(sum(files.values()))} in {len(files)} file(s), more than "
                                f"--bring-back-max {_size(max_bytes)} in all; they stay in "
                                f"{_copy_of(transports[name])} on {name}")
            keep.add(name)
        return brought, keep
    fetched = for_each_host({n: transports[n] for n in hosts}, lambda t: _fetch(t, sorted(hosts[t.host.name]),
                                                                                max_bytes))
    versions: dict[str, dict[str, bytes]] = {}  # path -> host -> the digest of what it wrote there
    staged: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="lab-brought-") as scratch:
        for name, got in sorted(fetched.items()):
            if isinstance(got, BaseException):
                brought.left.append(f"{name}: could not send what its ranks wrote ({got}); it stays in "
                                    f"{_copy_of(transports[name])} on {name}")
                keep.add(name)
                continue
            staged[name] = Path(scratch) / name
            staged[name].mkdir()
            with tarfile.open(fileobj=io.BytesIO(got), mode="r:") as archive:
                archive.extractall(staged[name], filter="data")
            for path in hosts[name]:
                if (staged[name] / path).is_file():
                    versions.setdefault(path, {})[name] = _digest(staged[name] / path)
        for path, by_host in sorted(versions.items()):
            placed = first if first in by_host else sorted(by_host)[0]
            agree = len(set(by_host.values())) == 1
            target = project / path
            changed_here = target.exists() and target.stat().st_mtime > since
            for name in sorted(by_host):
                source = staged[name] / path
                if name == placed and not changed_here:
                    _put(source, target)
                    brought.files.append(path)
                elif not agree or changed_here:
                    _put(source, project / ASIDE / name / path)
                    brought.aside.append((ASIDE / name / path).as_posix())
                else:
                    continue
                brought.size += source.stat().st_size
    return brought, keep


def _written(transport: Transport) -> dict[str, int]:
    """The files the host's ranks wrote in their copy: path -> bytes."""
    assert transport.run_dir is not None
    status, said = transport.call(["/bin/sh", "-c", LIST, "sh", posixpath.join(transport.run_dir, WORK_DIR),
                                   posixpath.join(transport.run_dir, MARK)], LIST_TIMEOUT)
    if status != 0:
        raise OSError(f"no answer within {LIST_TIMEOUT:g}s" if status is None else f"status {status}")
    import pathspec

    never = pathspec.GitIgnoreSpec.from_lines(NEVER)  # (what is never a rank's: Python's caches, the lab's own)
    files = {}
    for entry in filter(None, said.split("\0")):
        size, _, path = entry.partition(" ")
        if size.isdigit() and path and not path.startswith(("/", "../")) and not never.match_file(path):
            files[path] = int(size)
    return files


def _fetch(transport: Transport, paths: Sequence[str], max_bytes: int) -> bytes:
    """The host's ``paths`` (in its copy) as one tar stream, no more than ``max_bytes`` and its headers."""
    assert transport.run_dir is not None
    process = transport.start(["tar", "-C", posixpath.join(transport.run_dir, WORK_DIR), "--null", "-T", "-",
                               "-cf", "-"], {}, "/")
    chunks: list[bytes] = []
    limit = max_bytes + (len(paths) + 2) * 1536  # (a tar member's headers, padded)

    def read() -> None:
        taken = 0
        while taken <= limit and (chunk := process.stdout.read(1 << 20)):
            chunks.append(chunk)
            taken += len(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process.send(b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths))
        process.close_stdin()
        reader.join(FETCH_TIMEOUT)
        deadline = time.monotonic() + 5.0
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        status = process.poll()
    finally:
        process.kill()
    data = b"".join(chunks)
    if len(data) > limit:
        raise OSError(f"sent more than the {_size(max_bytes)} it listed")
    if reader.is_alive() or status is None:
        raise OSError(f"not sent within {FETCH_TIMEOUT:g}s")
    if status != 0:
        raise OSError(f"its tar ended with status {status}")
    return data


def _digest(path: Path) -> bytes:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return sha.digest()


def _put(source: Path, target: Path) -> None:
    """``source`` at ``target``, whole (a new file renamed over the old), its folders made."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    shutil.copyfile(source, part)
    os.replace(part, target)


def _copy_of(transport: Transport) -> str:
    return posixpath.join(transport.run_dir or "its run directory", WORK_DIR)


def _size(count: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"
