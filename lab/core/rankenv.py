"""The settings a user adds to every rank's environment, as torchrun and DeepSpeed users expect.

Where they come from, later ones winning: the inventory's ``env:`` (all hosts, a group, a host: a
host's replaces its group's, as Ansible's variables do), the caller's own environment for the
conventional names (:data:`FORWARDED`: NCCL_*, GLOO_*, TORCH_*, OMP_NUM_THREADS... and any
``--forward-env PATTERN``; its PYTHONPATH as far as it lies in the project a launch carries:
:func:`project_python_path`), ``--env-file FILE`` (``KEY=VALUE`` lines), ``--env KEY=VALUE``. They
travel as the rest of a rank's settings do, on the launcher's standard input, never on a command
line (``ps`` on a host shows none). The run's own settings (the rendezvous, the lab's) are not the
user's to set: one given is left out, with one line saying so (:func:`without_reserved`).
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from lab.errors import UsageError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What the caller's environment gives the ranks when set: the settings torch, gloo and NCCL read.
FORWARDED = ("NCCL_*", "GLOO_*", "TORCH_*", "OMP_NUM_THREADS")
# The run's own settings: the rendezvous each launcher sets, and the lab's.
RESERVED = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                      "GROUP_RANK", "ROLE_RANK", "NODE_RANK", "PYTHONUNBUFFERED"})
RESERVED_PREFIXES = ("LAB_", "TORCHELASTIC_", "SLURM_")
ENV_FILE_MAX = 1 << 20  # bytes of an --env-file


def assignment(text: str, where: str) -> tuple[str, str]:
    """``KEY=VALUE`` as (KEY, VALUE); one line naming ``where`` when it is not one."""
    name, equals, value = text.partition("=")
    if not equals or not NAME.match(name):
        raise UsageError(f"{where}: {text[:80]!r} is not KEY=VALUE with KEY a variable name "
                         "(letters, digits and '_', not starting with a digit)")
    if "\0" in value:
        raise UsageError(f"{where}: the value of {name} holds a NUL byte")
    return name, value


def read_env_file(path: str) -> dict[str, str]:
    """An ``--env-file``: ``KEY=VALUE`` lines (an optional ``export`` first; the value may be in
    single or double quotes, kept as written inside them); blank lines and ``#`` lines skipped. One
    line naming the file and line when a line is not one."""
    try:
        data = Path(path).read_bytes()[:ENV_FILE_MAX + 1]
    except OSError as exc:
        raise UsageError(f"--env-file {path}: {exc.strerror or exc}") from None
    if len(data) > ENV_FILE_MAX:
        raise UsageError(f"--env-file {path}: larger than {ENV_FILE_MAX >> 20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--env-file {path}: not UTF-8 text") from None
    found: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, value = assignment(line.removeprefix("export "), f"{path}:{number}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[name] = value
    return found


def forwarded(environ: Mapping[str, str], patterns: Iterable[str] = ()) -> dict[str, str]:
    """What the caller's environment gives the ranks: its conventional settings and those whose
    names match ``patterns`` (``--forward-env``, shell-style: ``MY_*``)."""
    wanted = (*FORWARDED, *patterns)
    return {k: v for k, v in environ.items() if any(fnmatch.fnmatchcase(k, p) for p in wanted)}


def without_reserved(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """``env`` without the run's own settings, and the names left out."""
    left_out = sorted(k for k in env if k in RESERVED or k.startswith(RESERVED_PREFIXES))
    return {k: v for k, v in env.items() if k not in left_out}, left_out


def project_python_path(python_path: str, project: Path, copy: str) -> tuple[str, list[str]]:
    """The caller's PYTHONPATH as the ranks of a launch find it: each entry inside the ``project``
    folder the launch carries as the same folder of its copy (``copy``: where the copy is on every
    host), the others left out, for no host but this one has them; and those left out."""
    kept, left_out = [], []
    for entry in filter(None, python_path.split(":")):
        path = Path(entry).resolve()
        if path.is_relative_to(project):
            kept.append("/".join((copy, *path.relative_to(project).parts)))
        else:
            left_out.append(entry)
    return ":".join(kept), left_out
