"""The local transport: ranks are processes on this machine, each under the reaper (its own
session, and the group it names is the one signalled: see lab.rank.reaper)."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from lab.rank.reaper import KEPT
from lab.transport.base import RankProcess, Transport, Upload, removable, started_group, supervised


def local_gpu_count() -> int:
    """GPUs torch can use here; asks torch only when nvidia-smi shows any (importing it is slow)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if "GPU" not in listed:
        return 0
    import torch

    return int(torch.cuda.device_count())


START_TIMEOUT = 30.0  # seconds for a started process to name its process group


class LocalProcess(RankProcess):
    def __init__(self, popen: subprocess.Popen[bytes], pgid: int) -> None:
        self._popen, self.pgid = popen, pgid
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        self.stdin, self.stdout, self.stderr = popen.stdin, popen.stdout, popen.stderr

    def poll(self) -> int | None:
        return self._popen.poll()

    def exited(self) -> bool:
        return self._popen.poll() is not None  # the reaper's: it ends after everything in the group

    def signal(self, signum: int) -> None:
        if not self.exited():
            _killpg(self.pgid, signum)

    def release(self) -> None:
        self.close_stdin()
        self._popen.wait()


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):  # gone
        pass


class LocalTransport(Transport):
    @property
    def python(self) -> str:
        # The controller's own interpreter has torch; an inventory may name another.
        return self.host.python if self.host.python != "python3" else sys.executable

    def prepare(self, run_name: str, uploads: Mapping[str, Upload]) -> str:
        run_dir = Path(tempfile.gettempdir(), run_name)
        run_dir.mkdir(mode=0o700, exist_ok=True)
        for relative, source in uploads.items():
            target = run_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(source, bytes):
                target.write_bytes(source)
            else:
                shutil.copyfile(source, target)
        self.run_dir = str(run_dir)
        return self.run_dir

    def cleanup(self, keep: bool = False, also: Sequence[str] = ()) -> None:
        if not keep:
            for directory in removable([self.run_dir, *also]):
                shutil.rmtree(directory, ignore_errors=True)
        elif self.run_dir is not None:
            with contextlib.suppress(OSError):
                Path(self.run_dir, KEPT).touch()

    def signal_groups(self, pgids: Sequence[int], signum: int) -> None:
        for pgid in pgids:
            _killpg(pgid, signum)

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> RankProcess:
        path = os.pathsep.join(p for p in (env.get("PYTHONPATH"), os.environ.get("PYTHONPATH")) if p)
        popen = subprocess.Popen(
            supervised(self.python, argv), cwd=cwd, env={**os.environ, **env, "PYTHONPATH": path},
            stdin=subprocess.PIPE,  # the worker stops itself when this closes
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        what = f"host {self.host.name}: cannot start {argv[0]}"
        return LocalProcess(popen, started_group(popen, what, START_TIMEOUT))
