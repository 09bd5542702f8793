"""``--log-dir DIR``: every rank's output in a file of its own, as torchrun's ``--log-dir`` with
``--tee``, beside what the console shows.

``DIR/rank_N.log`` holds rank N's lines as they came, each stream's marked (``[err] `` before a
line of its stderr); ``DIR/launcher_HOST.log`` a host's launcher's own lines (torchrun's agent); and
``DIR/summary.json``, written at the end, how the job ended: its status, its cause, and each
rank's host, exit code and log file. A file stops at LOG_MAX bytes with one line saying so: a rank
that floods its output fills no disk. The folder is made if missing; files of an earlier run in
it are replaced.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from lab.core.outcome import LaunchState, RankState, RunOutcome
from lab.errors import UsageError

LOG_MAX = 64 * 2**20  # bytes of one log file


class LogDir:
    """Writes each rank's and launcher's lines to its file (call it as the runner's ``on_line``)."""

    def __init__(self, folder: str, ranks: Iterable[int]) -> None:
        """Every rank's file made at once (empty until it prints)."""
        self.folder = Path(folder)
        self._files: dict[str, IO[bytes]] = {}
        self._written: dict[str, int] = {}
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            for rank in ranks:
                self._open(_rank_file(rank))
        except OSError as exc:
            self.close()
            raise UsageError(f"--log-dir {folder}: {exc.strerror or exc}") from None

    def _open(self, name: str) -> None:
        self._files[name] = open(self.folder / name, "wb")  # noqa: SIM115 (kept open for the run)
        self._written[name] = 0

    @staticmethod
    def name_of(state: RankState | LaunchState) -> str:
        if isinstance(state, RankState):
            return _rank_file(state.spec.rank)
        return f"launcher_{state.launch.host}.log"

    def __call__(self, state: RankState | LaunchState, stream: str, line: str) -> None:
        name = self.name_of(state)
        if name not in self._files:
            self._open(name)
        if self._written[name] >= LOG_MAX:
            return
        data = (("[err] " if stream == "err" else "") + line + "\n").encode("utf-8", "replace")
        if self._written[name] + len(data) > LOG_MAX:
            data = f"[the log reached {LOG_MAX >> 20} MiB: the rest is not kept]\n".encode()
            self._written[name] = LOG_MAX
        else:
            self._written[name] += len(data)
        self._files[name].write(data)
        self._files[name].flush()

    def close(self) -> None:
        for file in self._files.values():
            file.close()

    def summarize(self, outcome: RunOutcome, summary: dict[str, Any]) -> None:
        """Write ``summary.json``: ``summary`` (how the job ended) and each rank's host, exit code and
        log file (written whole, then renamed into place)."""
        ranks = [{"rank": s.spec.rank, "host": s.spec.host, "exit_code": s.exit_code, "log": self.name_of(s)}
                 for s in outcome.ranks]
        temporary = self.folder / ".summary.json.tmp"
        temporary.write_text(json.dumps({**summary, "ranks": ranks}, indent=2) + "\n")
        os.replace(temporary, self.folder / "summary.json")


def _rank_file(rank: int) -> str:
    return f"rank_{rank}.log"
