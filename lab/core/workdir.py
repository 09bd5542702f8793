"""``lab launch``'s working directory: the script's project, carried to every host.

A real project is a folder (modules beside the script, a package, a config, a small data file),
so a launch carries a folder, not a script: by default the script's own (``--workdir DIR`` for
another), every file in it but those its ignore rules leave out, as git itself says where the folder
is in a work tree, else as git reads the ``.gitignore`` files; ``--include`` patterns (the same
syntax) bring back what those leave out (its data), ``--exclude`` patterns and what is never the
ranks' (.git, __pycache__) leave out whatever they name. What the ignore rules left out that a
program may read (data-like names, large files) is said at every launch (``Workdir.ignored_data``).
On every host the ranks start in its copy, so sibling imports and relative paths work as they do
under torchrun in the folder. (On this machine alone a launch carries nothing: its ranks run in the
project itself, ``Plan.in_place``.) A folder larger than the cap (``--max-workdir-size``)
is one line naming its largest files, never a silent cut. Symbolic links are carried as the files
they point to when those lie inside the folder; others are left out, and said (``Workdir.skipped``).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lab.errors import UsageError

if TYPE_CHECKING:
    import pathspec

NEVER = (".git/", "__pycache__/", "*.pyc", ".lab/")  # never a rank's
DEFAULT_MAX_MB = 100


@dataclass(frozen=True)
class Workdir:
    root: Path
    files: tuple[tuple[str, Path], ...]  # (path in the folder, with '/', the local file), sorted
    size: int  # bytes, all files together
    # What names this state of the project: its files' paths, sizes, modification times and modes
    # (as rsync's quick check: a changed file has another size or time), for the hosts' kept copies.
    key: str = ""
    skipped: tuple[str, ...] = ()  # left out: links out of the folder (or to nothing), files not readable
    # left out by the ignore rules, and what a program may read (data-like, or large): (path, bytes)
    ignored_data: tuple[tuple[str, int], ...] = ()

    def relative(self, path: Path) -> str:
        """``path`` (inside the folder) as the folder's copies name it."""
        return path.resolve().relative_to(self.root).as_posix()


DATA_SUFFIXES = frozenset({".bin", ".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".npy", ".npz", ".csv", ".tsv",
                           ".json", ".jsonl", ".txt", ".parquet", ".arrow", ".h5", ".hdf5", ".safetensors",
                           ".tfrecord", ".idx", ".model", ".vocab", ".zip", ".tar", ".gz"})
DATA_SIZE = 1 << 20  # an ignored file this large may be data a program reads, whatever its name
GIT_WAIT = 60.0  # seconds for git to list a repository's files


def collect(root: str | Path, excludes: tuple[str, ...] = (), max_mb: float = DEFAULT_MAX_MB,
            includes: tuple[str, ...] = ()) -> Workdir:
    """The files of folder ``root`` a launch carries (see the module); UsageError (one line) when
    it is no folder, a pattern is no pattern, or the files are larger than ``max_mb`` MiB. What its
    ignore rules leave out is git's to say where the folder is in a git work tree (its .gitignore
    files, .git/info/exclude, the user's excludes file; a tracked file is carried however it is
    named), else the .gitignore files' own, as git reads them (the deepest that says anything of a
    path decides; a folder left out keeps everything in it out); ``includes`` brings back what they
    leave out, ``excludes`` (and what is never a rank's) leaves out whatever it names."""
    import pathspec  # (here: only a launch's controller needs it)

    top = Path(root).resolve()
    if not top.is_dir():
        raise UsageError(f"--workdir {root}: not a folder")
    specs = {}
    for option, patterns in (("--exclude", [*NEVER, *excludes]), ("--include", list(includes))):
        try:
            specs[option] = pathspec.GitIgnoreSpec.from_lines(patterns)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{option}: {exc}") from None
    excluded, included = specs["--exclude"], specs["--include"]
    kept, ignored = _listed_by_git(top) or _listed_by_gitignore(top)
    brought = [f for f in _files_of(top, ignored) if included.match_file(f)] if includes else []
    found: list[tuple[str, Path, os.stat_result]] = []
    skipped: list[str] = []
    for relative in sorted({*kept, *brought}):
        if excluded.match_file(relative) or any(excluded.match_file(f"{d}/") for d in _folders_of(relative)):
            continue
        path = top / relative
        try:
            status = path.stat()  # (through a link)
        except OSError:
            skipped.append(relative)
            continue
        if (path.is_symlink() and not path.resolve().is_relative_to(top) or not stat.S_ISREG(status.st_mode)
                or not os.access(path, os.R_OK)):
            skipped.append(relative)
            continue
        found.append((relative, path, status))
    size = sum(status.st_size for _, _, status in found)
    if size > max_mb * 2**20:
        largest = sorted(found, key=lambda f: f[2].st_size, reverse=True)[:3]
        named = ", ".join(f"{r} ({status.st_size / 2**20:.1f} MiB)" for r, _, status in largest)
        raise UsageError(f"--workdir {top}: {size / 2**20:.1f} MiB of files is more than --max-workdir-size "
                         f"{max_mb:g} MiB (the largest: {named}); leave out what the ranks do not need "
                         "(--exclude PATTERN, .gitignore) or raise the cap")
    listing = hashlib.sha256()
    for relative, _, status in found:
        listing.update(f"{relative}\0{status.st_size}\0{status.st_mtime_ns}\0{status.st_mode & 0o777:o}\n".encode())
    carried = {r for r, _, _ in found}
    return Workdir(top, tuple((r, path) for r, path, _ in found), size, listing.hexdigest()[:32], tuple(skipped),
                   tuple(_data_like(top, [f for f in ignored if not f.endswith("/") and f not in carried])))


def _folders_of(relative: str) -> list[str]:
    """The folders a path lies in, outermost first ("a/b/c.py": "a", "a/b")."""
    parts = relative.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _listed_by_git(top: Path) -> tuple[list[str], list[str]] | None:
    """(the files git keeps: tracked, and untracked but not ignored; what it ignores: files, and whole
    folders as "folder/"), relative to ``top``; None where ``top`` is in no git work tree, or there is
    no git."""
    if shutil.which("git") is None:
        return None
    listed = []
    for flags in (("--cached", "--others", "--exclude-standard"),
                  ("--others", "--ignored", "--exclude-standard", "--directory")):
        try:
            out = subprocess.run(["git", "-C", str(top), "ls-files", "-z", *flags, "--", "."], capture_output=True,
                                 timeout=GIT_WAIT, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if out.returncode != 0:
            return None
        listed.append([p for p in os.fsdecode(out.stdout).split("\0") if p])
    return listed[0], listed[1]


def _listed_by_gitignore(top: Path) -> tuple[list[str], list[str]]:
    """As :func:`_listed_by_git` says, from the folder's .gitignore files alone (no git, or no repository)."""
    import pathspec

    rules: dict[str, pathspec.GitIgnoreSpec] = {}  # folder ("" or "a/b/") -> its .gitignore

    def ignored(relative: str) -> bool:
        """Git's rule: the deepest .gitignore that says anything of the path decides, its last pattern."""
        folders = ["", *(f"{d}/" for d in _folders_of(relative.rstrip("/")))]
        for base in reversed(folders):
            if base in rules:
                said = rules[base].check_file(relative[len(base):]).include
                if said is not None:
                    return said
        return False

    kept: list[str] = []
    left: list[str] = []
    for folder, dirs, names in os.walk(top):
        here = Path(folder)
        prefix = "" if here == top else here.relative_to(top).as_posix() + "/"
        ignore_file = here / ".gitignore"
        if ignore_file.is_file():
            rules[prefix] = pathspec.GitIgnoreSpec.from_lines(ignore_file.read_text(errors="replace").splitlines())
        left += [f"{prefix}{d}/" for d in dirs if ignored(f"{prefix}{d}/")]
        dirs[:] = sorted(d for d in dirs if not ignored(f"{prefix}{d}/") and d != ".git")
        kept += [f"{prefix}{d}" for d in dirs if (here / d).is_symlink()]  # (not walked into: said, as git lists it)
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
        for name in sorted(names):
            (left if ignored(f"{prefix}{name}") else kept).append(f"{prefix}{name}")
    return kept, left


def _files_of(top: Path, entries: list[str]) -> list[str]:
    """The files of ``entries`` (files, and folders as "folder/", relative to ``top``), each folder's
    every file."""
    files = []
    for entry in entries:
        if not entry.endswith("/"):
            files.append(entry)
            continue
        for folder, dirs, names in os.walk(top / entry):
            dirs.sort()
            base = Path(folder).relative_to(top).as_posix()
            files += [f"{base}/{name}" for name in sorted(names)]
    return files


def _data_like(top: Path, ignored: list[str]) -> list[tuple[str, int]]:
    """The ignored files a program may well read (its data: a data-like suffix, or a large file), with
    their sizes."""
    found = []
    for relative in ignored:
        try:
            size = (top / relative).stat().st_size
        except OSError:
            continue
        if Path(relative).suffix.lower() in DATA_SUFFIXES or size >= DATA_SIZE:
            found.append((relative, size))
    return found
