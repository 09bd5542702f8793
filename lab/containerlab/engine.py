"""The Docker engine the container lab runs on, and the distro tools it needs.

On a fresh Debian machine as root (like CI), missing pieces are installed from the
distro (docker.io, debootstrap) and dockerd is started when none answers, saying so.
Elsewhere a missing piece stops with a one-line instruction.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import docker
from docker.errors import DockerException

from lab.errors import LabError

log = logging.getLogger(__name__)

DOCKERD_LOG = Path("/var/log/lab-dockerd.log")
ENGINE_WAIT = 60.0
API_TIMEOUT = 120  # seconds for one engine API call (image builds stream, and are longer)

Say = Callable[[str], None]
Item = TypeVar("Item")
Result = TypeVar("Result")


def each(action: Callable[[Item], Result], items: Iterable[Item]) -> list[Result]:
    """``action`` on every item at once (the engine does the work: containers, execs), the results
    in order. Every call has ended when this returns or raises (the first failure, after the
    others finished), so nothing is still being made behind a caller's cleanup."""
    todo = list(items)
    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
        futures = [pool.submit(action, item) for item in todo]
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()  # (those not yet begun; the pool waits for the rest)


class EngineError(LabError):
    """The container engine or a tool it needs is missing or not answering."""


def _can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def apt_install(packages: list[str], say: Say) -> None:
    """Install Debian packages (root only); one line says what and why."""
    say(f"installing {' '.join(packages)} from the distro")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *packages]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            raise EngineError(f"{' '.join(argv)} failed: {tail[0]}")


def require_tool(tool: str, package: str, say: Say) -> str:
    """The path of ``tool``, installing ``package`` first where that is possible."""
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if path:
        return path
    if not _can_install():
        raise EngineError(f"{tool} is missing: install it (Debian: sudo apt-get install {package})")
    apt_install([package], say)
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")
    if not path:
        raise EngineError(f"{tool} is still missing after installing {package}")
    return path


def client(timeout: int = API_TIMEOUT) -> docker.DockerClient:
    """A client of a running engine, or EngineError with what to do."""
    try:
        c = docker.from_env(version="auto", timeout=timeout)
        c.ping()
        return c
    except DockerException as exc:
        raise EngineError(f"no Docker engine answers ({reason(exc)}); start dockerd, "
                          f"or run `make lab-up` as root to have it installed and started") from None


def ensure_engine(say: Say) -> docker.DockerClient:
    """A client of a running engine: install and start one where we may."""
    try:
        return client()
    except EngineError:
        if not _can_install():
            raise
    dockerd = require_tool("dockerd", "docker.io", say)
    say(f"no Docker engine is running: starting dockerd (log: {DOCKERD_LOG})")
    with open(DOCKERD_LOG, "ab") as out:
        subprocess.Popen([dockerd], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    deadline = time.monotonic() + ENGINE_WAIT
    while True:
        try:
            return client()
        except EngineError:
            if time.monotonic() > deadline:
                raise EngineError(f"dockerd did not answer within {ENGINE_WAIT:g}s; see {DOCKERD_LOG}") from None
            time.sleep(0.5)


def reason(exc: BaseException, limit: int = 300) -> str:
    """What a failed Docker call says, in one line: the engine's explanation (an APIError's), a
    TLS failure by its cause (requests buries that deep in a long line), else the first line."""
    text = str(getattr(exc, "explanation", None) or exc)
    tls = re.search(r"\[SSL: \w+\] ([^(]+?) \(_ssl", text)
    if tls:
        return f"TLS: {tls.group(1)}"
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__
