"""What a project needs beyond torch on every host: ``lab launch --requirements FILE`` (or the
inventory's ``requirements:``), read as pip reads it.

This machine reads the file (``-r``/``-c`` files it names are read in; its index options are this
machine's pip's to use; a wheel file it names is that wheel's name and version, its folder a place to
find it), and the hosts get what it names as plain requirements, one a line, keyed by their text
(:attr:`Requirements.key`). What the lab cannot carry to a host (an editable, a folder, a URL) is
one line naming the file and line. ``lab.core.hostenv`` installs them on each host.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from lab.errors import UsageError

# pip's options this machine's pip uses to get the wheels; the hosts install with no index
INDEX_OPTIONS = ("-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--no-index", "--trusted-host",
                 "--pre", "--prefer-binary", "--only-binary", "--no-binary")
NESTED = ("-r", "--requirement", "-c", "--constraint")


@dataclass(frozen=True)
class Requirements:
    path: str  # the file on this machine
    lines: tuple[str, ...]  # what the hosts install: one requirement a line
    index: tuple[str, ...]  # pip's index options the file gives, for this machine's pip
    key: str  # what names the environment on the hosts: the digest of the lines and the options

    @property
    def text(self) -> str:
        return "".join(f"{line}\n" for line in self.lines)


def read(path: str | Path) -> Requirements:
    """The requirements file ``path``, read as pip reads it; UsageError naming the file and line
    of what the lab cannot carry (an editable or a folder: build a wheel and name its file)."""
    file = Path(path).expanduser().resolve()
    lines: list[str] = []
    index: list[str] = []
    _read_into(file, lines, index, ())
    return Requirements(str(file), tuple(lines), tuple(index),
                        hashlib.sha256("\0".join((*lines, "", *index)).encode()).hexdigest()[:16])


def _read_into(file: Path, lines: list[str], index: list[str], within: tuple[Path, ...]) -> None:
    if file in within:
        raise UsageError(f"{within[-1]}: reads {file}, which reads it: a loop")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--requirements {file}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from exc
    for number, raw in enumerate(_joined(text), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        where = f"{file}:{number}"
        option, _, value = line.replace("=", " ", 1).partition(" ") if line.startswith("-") else ("", "", "")
        value = value.strip()
        if option in NESTED[:2]:
            _read_into((file.parent / value).resolve(), lines, index, (*within, file))
        elif option in NESTED[2:]:  # (a constraints file: this machine's pip resolves under it)
            index.extend(("--constraint", str((file.parent / value).resolve())))
        elif option in INDEX_OPTIONS:
            local = option in ("-f", "--find-links") and "://" not in value
            index.extend((option, str((file.parent / value).resolve()) if local else value) if value else (option,))
        elif option:
            raise UsageError(f"{where}: {option}: not what the lab can install on the hosts (it installs wheels: "
                             "build one and name its file)")
        elif line.endswith(".whl"):
            lines.append(_wheel_requirement(where, file.parent / line))
            index.extend(("--find-links", str((file.parent / line).resolve().parent)))
        else:
            try:
                requirement = Requirement(line)
            except InvalidRequirement as exc:
                if "/" in line or line.startswith("."):
                    raise UsageError(f"{where}: {line}: a folder; the lab installs wheels on the hosts (build one "
                                     "and name its file)") from exc
                raise UsageError(f"{where}: not a requirement: {str(exc).splitlines()[0]}") from exc
            if requirement.url:
                raise UsageError(f"{where}: {requirement.name} @ a URL: name its wheel file, or a version")
            lines.append(str(requirement))


def _joined(text: str) -> list[str]:
    """The file's lines, one ending in a backslash joined with the next as pip reads it (the
    joined line at the number of its first, blanks after it so the rest keep theirs)."""
    lines: list[str] = []
    open_at = -1  # the line a backslash continues, if any
    for line in text.splitlines():
        if open_at >= 0:
            lines[open_at] = lines[open_at][:-1] + line
            lines.append("")
        else:
            lines.append(line)
            open_at = len(lines) - 1
        if not lines[open_at].endswith("\\"):
            open_at = -1
    return lines


def _wheel_requirement(where: str, wheel: Path) -> str:
    """A wheel file named in the file, as the requirement of its name and version (its file is
    carried with the others)."""
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as exc:
        raise UsageError(f"{where}: {wheel.name}: not a wheel's file name ({exc})") from exc
    if not wheel.is_file():
        raise UsageError(f"{where}: {wheel}: no such wheel")
    return f"{name}=={version}"
