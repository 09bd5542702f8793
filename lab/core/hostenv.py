"""The environment of a launch's requirements on each host (``lab.core.requirements``), which
its ranks import from after the lab's code.

Each host keeps its environments in ``$TMPDIR/lab-env-UID/KEY-PYTHON`` (its user's alone, 0700, as its
kept projects, ``lab.core.workcache``): one short command says whether the host has ``KEY`` (then
the run's directory links it, ``requirements-env``, on the ranks' PYTHONPATH), so a second launch
with the same file costs that command alone. Where it has not, this machine gets the wheels for the
host's Python and machine (``pip wheel``, or ``pip download --only-binary`` for another Python; kept
in this machine's cache, so a second host or lab takes them with no index), carries them in the
run's directory, and the host installs them with no index (``pip install --prefix``: what its
Python already has, torch say, is used as it is), under a lock, into a folder renamed to the key
once whole. A package nobody can get is one line naming it and the host.
"""
from __future__ import annotations

import os
import platform
import posixpath
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from lab.core.plan import REQUIREMENTS_ENV
from lab.core.requirements import Requirements
from lab.errors import RunError
from lab.transport.base import Transport, Upload

WHEELS = "requirements"  # in the run's directory: the wheels carried for the host, and its requirements.txt
CHECK_TIMEOUT = 30.0  # seconds for a host to say whether it has the environment
INSTALL_TIMEOUT = 900.0  # seconds for a host to install it (and for this machine to get its wheels)
UNUSED_DAYS = 30  # a host's environment no launch used for this long is removed

# -- this machine: the wheels for a host ------------------------------------------------------

_GETTING = threading.Lock()  # one pip at a time gets wheels: the hosts of a launch ask at once


def cache_dir() -> Path:
    """Where this machine keeps the wheels it got for hosts: ``$XDG_CACHE_HOME/lab/wheels``, else
    ``~/.cache/lab/wheels``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "lab" / "wheels"


def wheels_for(requirements: Requirements, python: str, machine: str, host: str) -> list[Path]:
    """The wheels a host of Python ``python`` (3.11) on ``machine`` (x86_64) installs the
    requirements from: kept in :func:`cache_dir`, got once (this machine's Python and machine: pip
    builds or downloads them; another: pip downloads binary wheels for that one). RunError naming
    ``host`` and what pip could not find."""
    folder = cache_dir() / f"{requirements.key}-py{python}-{machine}"
    with _GETTING:
        if not folder.is_dir():
            _get(requirements, python, machine, host, folder)
    return sorted(folder.glob("*.whl"))


def _get(requirements: Requirements, python: str, machine: str, host: str, folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".get-") as scratch:
        listed = Path(scratch, "requirements.txt")
        listed.write_text(requirements.text, encoding="utf-8")
        wheels = Path(scratch, "wheels")
        if python == here and machine == platform.machine():
            argv = [sys.executable, "-m", "pip", "wheel", "--wheel-dir", str(wheels)]
        else:
            argv = [sys.executable, "-m", "pip", "download", "--dest", str(wheels), "--only-binary=:all:",
                    "--python-version", python, *(f"--platform={tag}_{machine}" for tag in (
                        "manylinux_2_28", "manylinux_2_17", "manylinux2014", "linux"))]
        argv += ["--quiet", "--disable-pip-version-check", "--no-input", *requirements.index, "-r", str(listed)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT,
                                  cwd=Path(requirements.path).parent, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise RunError(f"host {host}: getting the packages of {requirements.path} for its Python took over "
                           f"{INSTALL_TIMEOUT:.0f} s") from exc
        if done.returncode != 0:
            raise RunError(f"host {host}: cannot get the packages of {requirements.path} for its Python {python} "
                           f"on {machine}: {_pip_error(done.stdout + done.stderr)}")
        wheels.mkdir(exist_ok=True)
        try:
            os.rename(wheels, folder)
        except OSError:  # (another lab's launch got there first: theirs are the same)
            shutil.rmtree(wheels, ignore_errors=True)


def _pip_error(said: str) -> str:
    """pip's last ERROR line (what it could not find), else its last line."""
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR:")]
    return (errors or lines or ["pip failed"])[-1][:300]


# -- on a host: its environment ---------------------------------------------------------------

# sh, $1 the key, $2 the run's directory, $3 the host's Python, $4 "install" (the wheels are in
# $2/WHEELS) or "". The environment is KEY-PYTHON (the interpreter's own file's name: python3.11, so
# another Python has one of its own). "unsafe" where the user's folder of environments is not safely its own; else,
# with $4, the environment installed (under a lock; into a folder renamed to the key once whole) and
# "failed" and pip's last ERROR line if it could not be; "missing PYTHON MACHINE" where it has none;
# else the run's directory linked to its site-packages, the environment marked used, "ready", and
# the ones unused for UNUSED_DAYS removed.
_ENSURE = r"""
u=$(id -u); c="${TMPDIR:-/tmp}/lab-env-$u"; p=$(readlink -f "$(command -v "$3")") && e="$c/$1-${p##*/}" || exit 1
[ -e "$c" ] || [ -L "$c" ] || mkdir -m 700 "$c" 2>/dev/null
if [ ! -d "$c" ] || [ -L "$c" ] || [ ! -O "$c" ] || [ "$(stat -c %a "$c")" != 700 ]; then echo unsafe; exit 0; fi
if [ -n "$4" ] && [ ! -d "$e" ]; then
  exec 9>"$e.lock"; command -v flock >/dev/null && flock -w WAIT 9
  if [ ! -d "$e" ]; then
    rm -rf "$e.part"
    if ! "$3" -m pip install --quiet --disable-pip-version-check --no-input --no-cache-dir --no-warn-script-location \
        --no-index --find-links "$2/WHEELS" --prefix "$e.part" -r "$2/WHEELS/requirements.txt" >"$e.log" 2>&1; then
      rm -rf "$e.part"; echo failed; grep '^ERROR' "$e.log" | tail -n 1; tail -n 1 "$e.log"; exit 0
    fi
    mv -T "$e.part" "$e"; rm -f "$e.log"
  fi
fi
if [ ! -d "$e" ] || [ -L "$e" ]; then
  echo missing $("$3" -c 'import platform, sys; print("%d.%d" % sys.version_info[:2], platform.machine())'); exit 0
fi
s=$(find "$e" -maxdepth 5 -type d \( -name site-packages -o -name dist-packages \) | head -n 1)
ln -sfn "${s:-$e}" "$2/LINK" && touch "$e" && echo ready
find "$c" -mindepth 1 -maxdepth 1 -mtime +DAYS -exec rm -rf {} + 2>/dev/null
true
""".replace("WAIT", str(int(INSTALL_TIMEOUT))).replace("WHEELS", WHEELS).replace("LINK", REQUIREMENTS_ENV) \
   .replace("DAYS", str(UNUSED_DAYS))


def ensure(transport: Transport, run_name: str, run_dir: str, requirements: Requirements) -> bool:
    """Make the host's environment of ``requirements`` (installed if it has none) and link it into
    its run directory; whether it was installed now. RunError naming the host where it cannot be."""
    said = _ensure(transport, run_dir, requirements, "", CHECK_TIMEOUT)
    if said[0] == "ready":
        return False
    if said[0] != "missing" or len(said) < 3:
        raise RunError(f"host {transport.host.name}: cannot keep an environment for {requirements.path}: its folder "
                       f"of environments says {' '.join(said)!r}")
    python, machine = said[1], said[2]
    uploads: dict[str, Upload] = {
        posixpath.join(WHEELS, "requirements.txt"): requirements.text.encode("utf-8"),
        **{posixpath.join(WHEELS, w.name): w for w in wheels_for(requirements, python, machine, transport.host.name)}}
    transport.prepare(run_name, uploads)
    said = _ensure(transport, run_dir, requirements, "install", INSTALL_TIMEOUT)
    if said[0] == "failed":
        pip_said = "\n".join(said[1:]) or "pip failed"
        raise RunError(f"host {transport.host.name}: cannot install {requirements.path}: {_pip_error(pip_said)}")
    if said[0] != "ready":
        raise RunError(f"host {transport.host.name}: cannot install {requirements.path}: {' '.join(said)!r}")
    return True


def _ensure(transport: Transport, run_dir: str, requirements: Requirements, install: str,
            timeout: float) -> list[str]:
    status, said = transport.call(["/bin/sh", "-c", _ENSURE, "sh", requirements.key, run_dir, transport.python,
                                   install], timeout)
    if status is None:
        raise RunError(f"host {transport.host.name}: installing {requirements.path} took over {timeout:.0f} s")
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    if status != 0 or not lines:
        raise RunError(f"host {transport.host.name}: cannot set up the environment of {requirements.path}: "
                       f"{lines[-1] if lines else f'exit {status}'}")
    first = next((i for i, line in enumerate(lines) if line.split()[0] in ("ready", "missing", "failed", "unsafe")),
                 len(lines) - 1)
    head = lines[first].split()
    return [*head, *lines[first + 1:]] if head[0] == "failed" else head
