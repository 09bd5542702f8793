"""``lab launch``'s working directory: the script's project, carried to every host.

A real project is a folder (modules beside the script, a package, a config, a small data file),
so a launch carries a folder, not a script: by default the script's own (``--workdir DIR`` for
another), every file in it but those its ``.gitignore`` files ignore (each applies below its own
folder, as git's), ``--exclude`` patterns (the same syntax) and what is never the ranks' (.git,
__pycache__). On every host the ranks start in its copy, so sibling imports and relative paths
work as they do under torchrun in the folder. A folder larger than the cap (``--max-workdir-size``)
is one line naming its largest files, never a silent cut. Symbolic links are carried as the files
they point to when those lie inside the folder; others are left out, and said (``Workdir.skipped``).
"""
from __future__ import annotations

import hashlib
import os
import stat
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

    def relative(self, path: Path) -> str:
        """``path`` (inside the folder) as the folder's copies name it."""
        return path.resolve().relative_to(self.root).as_posix()


def collect(root: str | Path, excludes: tuple[str, ...] = (), max_mb: float = DEFAULT_MAX_MB) -> Workdir:
    """The files of folder ``root`` a launch carries (see the module); UsageError (one line) when
    it is no folder, a pattern is no pattern, or the files are larger than ``max_mb`` MiB."""
    import pathspec  # (here: only a launch's controller needs it)

    top = Path(root).resolve()
    if not top.is_dir():
        raise UsageError(f"--workdir {root}: not a folder")
    try:
        excluded = pathspec.GitIgnoreSpec.from_lines([*NEVER, *excludes])
    except (ValueError, TypeError) as exc:
        raise UsageError(f"--exclude: {exc}") from None
    ignores: list[tuple[str, pathspec.GitIgnoreSpec]] = []  # (folder, its .gitignore), the folder with '/'
    found: list[tuple[str, Path, os.stat_result]] = []
    skipped: list[str] = []
    for folder, dirs, names in os.walk(top):
        here = Path(folder)
        prefix = "" if here == top else here.relative_to(top).as_posix() + "/"
        ignore_file = here / ".gitignore"
        if ignore_file.is_file():
            ignores.append((prefix, pathspec.GitIgnoreSpec.from_lines(ignore_file.read_text(errors="replace")
                                                                      .splitlines())))

        def left_out(relative: str) -> bool:
            return excluded.match_file(relative) or any(
                relative.startswith(base) and spec.match_file(relative[len(base):]) for base, spec in ignores)

        kept = [d for d in dirs if not left_out(f"{prefix}{d}/")]
        skipped += [f"{prefix}{d}" for d in kept if (here / d).is_symlink()]
        dirs[:] = sorted(d for d in kept if not (here / d).is_symlink())
        for name in sorted(names):
            relative, path = f"{prefix}{name}", here / name
            if left_out(relative):
                continue
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
    found.sort(key=lambda f: f[0])
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
    return Workdir(top, tuple((r, path) for r, path, _ in found), size, listing.hexdigest()[:32], tuple(skipped))
