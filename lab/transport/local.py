"""The local transport: ranks are processes on this machine."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from . import RankProcess, Transport


class LocalProcess(RankProcess):
    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        self.stdin, self.stdout, self.stderr = popen.stdin, popen.stdout, popen.stderr

    def poll(self) -> int | None:
        return self._popen.poll()

    def signal(self, signum: int) -> None:
        try:
            os.killpg(self._popen.pid, signum)  # start_new_session: pgid == pid
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.close_stdin()
        self._popen.wait()


class LocalTransport(Transport):
    @property
    def python(self) -> str:
        # The controller's own interpreter has torch; an inventory may name another.
        return self.host.python if self.host.python != "python3" else sys.executable

    def prepare(self, run_dir: str, uploads: Mapping[str, Path]) -> None:
        for relative, source in uploads.items():
            target = Path(run_dir, relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)

    def cleanup(self, run_dir: str, keep: bool = False) -> None:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> RankProcess:
        path = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.environ.get("PYTHONPATH")) if p)
        popen = subprocess.Popen(
            list(argv), cwd=cwd, env={**os.environ, **env, "PYTHONPATH": path},
            stdin=subprocess.PIPE,  # the worker stops itself when this closes
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        return LocalProcess(popen)
