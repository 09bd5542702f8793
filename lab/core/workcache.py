"""The project's copy on a host, kept between launches: a second launch of an unchanged project
carries nothing over the network.

Each host keeps the projects it was given in ``$TMPDIR/lab-work-UID/KEY`` (its user's alone: the
folder must be that user's, not a link, mode 0700, or it is not used), ``KEY`` naming the
project's files by their paths, sizes and modification times (``Workdir.key``, as rsync's quick
check). Once the run's directory is made, one short command copies the kept project into it
(``WORK_DIR``, renamed into place whole: hosts of one machine share it), where the ranks may write as
they like without touching the kept copy; where the host has no such project, it says so, the
files go there once (into a folder of their own, renamed to the key when whole, so a copy cut short
is never taken for one) and the same command copies it. The newest KEEP projects are kept. Once the
copy is whole, the same command marks it (:data:`MARK`): what is newer than the mark when the job
ends is what its ranks wrote (``lab.core.bringback``).
"""
from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping
from pathlib import Path

from lab.core.plan import WORK_DIR
from lab.errors import RunError
from lab.transport.base import Transport, Upload

log = logging.getLogger(__name__)

KEEP = 4  # projects kept on a host
MARK = ".lab-carried"  # in the run's directory: touched once the project's copy is whole
CALL_TIMEOUT = 60.0  # seconds for a host's copy of a project into the run's directory

# sh, $1 the key, $2 the project's folder in the run directory, $3 the folder the project was just
# carried to (if it was). "unsafe" when the user's folder of projects is not safely its own; else that
# folder renamed to the key (unless another got there first), then "missing UID" when the host has no
# project of that key, else the project copied into $2 by way of a folder renamed into place (two hosts
# of one machine may share the run directory), "copied", and the oldest kept projects let go. A kept
# project's folder appears whole (renamed into place once its files are in): being there is being complete.
# The copy whole, MARK beside it in the run's directory is touched.
_COPY = r"""
u=$(id -u); c="${TMPDIR:-/tmp}/lab-work-$u"
[ -e "$c" ] || [ -L "$c" ] || mkdir -m 700 "$c" 2>/dev/null
if [ ! -d "$c" ] || [ -L "$c" ] || [ ! -O "$c" ] || [ "$(stat -c %a "$c")" != 700 ]; then echo unsafe; exit 0; fi
if [ -n "$3" ]; then mv -T "$c/$3" "$c/$1" 2>/dev/null || rm -rf "$c/$3"; fi
if [ ! -d "$c/$1" ] || [ -L "$c/$1" ]; then echo "missing $u"; exit 0; fi
if [ ! -d "$2" ]; then
  t=$(mktemp -d "$2.XXXXXX") && cp -a "$c/$1/." "$t/" || exit 1
  mv -T "$t" "$2" 2>/dev/null || rm -rf "$t"
fi
[ -d "$2" ] || exit 1
touch "${2%/*}/MARK" || exit 1
echo copied
ls -1dt "$c"/*/ 2>/dev/null | tail -n +KEEP | while read -r old; do rm -rf "$old"; done
""".replace("KEEP", str(KEEP + 1)).replace("MARK", MARK)


def carry(transport: Transport, run_name: str, uploads: Mapping[str, Upload], work: Mapping[str, Path],
          key: str) -> tuple[str, bool]:
    """Make the run's directory on the host with ``uploads`` and the project (``work``: its files,
    by path in it) in its ``work/``, the project from the host's kept copy when it has ``key``, and
    mark it (MARK); the run directory, and whether the project went over the network. A kept project costs the host two
    commands (the run's files; the copy), a new one two more (its files, kept; the copy)."""
    run_dir = transport.prepare(run_name, uploads)
    project = posixpath.join(run_dir, WORK_DIR)
    said = _copy(transport, key, project, "")
    if said[0] == "missing":
        part = f"{key}.part-{transport.host.name}"  # (a host's own: hosts may share a machine)
        transport.prepare(posixpath.join(f"lab-work-{said[1]}", part), dict(work))
        transport.prepare(run_name, {})  # (the run's directory again: the one its end removes)
        said = _copy(transport, key, project, part)
        if said[0] != "copied":  # (its folder of projects was safe a moment ago)
            raise RunError(f"host {transport.host.name}: cannot keep the project: its folder of projects "
                           f"says {' '.join(said)!r}")
        return run_dir, True
    if said[0] != "copied":
        log.debug("host %s: no kept projects (%s): the project goes into the run's directory", transport.host.name,
                  " ".join(said))
        transport.prepare(run_name, {f"{WORK_DIR}/{p}": f for p, f in work.items()})
        status, output = transport.call(["/bin/sh", "-c", 'mkdir -p -- "$1" && touch -- "$2"', "sh", project,
                                         posixpath.join(run_dir, MARK)], CALL_TIMEOUT)  # (an empty project too)
        if status != 0:
            raise RunError(f"host {transport.host.name}: cannot mark the project's copy in {run_dir}: "
                           f"{output.strip() or f'exit {status}'}")
        return run_dir, True
    return run_dir, False


def check_shared(transport: Transport, project: str, probe: Path) -> None:
    """That the host sees the project in its shared folder where this machine does (``probe``: a file
    of it, or the project itself): the same size and modification time there; RunError naming the
    host where it does not (a ``shared_dir`` that is not the one this machine sees at that path)."""
    mine = probe.stat()
    expected = f"{mine.st_size} {int(mine.st_mtime)}"
    status, said = transport.call(["stat", "-c", "%s %Y", str(probe)], CALL_TIMEOUT)
    if status == 0 and said.strip() == expected:
        return
    seen = "not there" if status != 0 else \
        f"another file there (size and time {said.strip()[:40]!r}, here {expected!r})"
    raise RunError(f"host {transport.host.name}: the project {project} lies in its shared_dir "
                   f"{transport.host.shared_dir}, but {probe} is {seen}: the host does not share this machine's "
                   "folder (mount it there, or launch from a folder outside shared_dir: the project is then carried)")


def _copy(transport: Transport, key: str, project: str, part: str) -> list[str]:
    """The host's word on its kept project ``key`` (see _COPY): ["copied"], ["missing", UID], ["unsafe"]."""
    status, said = transport.call(["/bin/sh", "-c", _COPY, "sh", key, project, part], CALL_TIMEOUT)
    if status != 0:
        raise RunError(f"host {transport.host.name}: cannot copy the project into the run's directory: "
                       f"{said.strip().splitlines()[-1] if said.strip() else f'exit {status}'}")
    for line in reversed(said.splitlines()):  # (its own line: what runs it may say more, as srun's warnings)
        words = line.split()
        if words in (["copied"], ["unsafe"]) or len(words) == 2 and words[0] == "missing" and words[1].isdigit():
            return words
    return ["unsafe"]
