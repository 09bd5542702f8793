"""The preflight, on a host: before its ranks start, the host's launcher checks the network the job
will use, from the process that will start them (``lab.rank.node``: the zygote, torchrun's agent,
mp.spawn's parent), while it imports torch.

Asked for by ``LAB_PREFLIGHT`` (JSON: the host's name, master_addr, master_port on rank 0's host), it
drives the doctor's probe machinery (``lab.rank.probe``) through the launcher's own streams:

1. :func:`begin` reports this host's ``facts`` (the address gloo will advertise, from its hostname or
   GLOO_SOCKET_IFNAME, its interfaces, the port its listener took; rank 0's host listens on
   MASTER_PORT too, which the run's port holder lets it bind) and starts a thread that waits for
   the controller's line of targets (``{"targets": [...]}``: MASTER_ADDR:MASTER_PORT and every
   peer's advertised address), connects to them all at once, each bounded by the timeout, and
   reports the ``links``. The launcher imports torch meanwhile.
2. The same thread then waits for the controller's verdict: ``go`` (every host's links are in and
   nothing is wrong), on which it stops listening (rank 0's host says so: ``closed``). The controller
   tells rank 0's host first and the others once it has closed: their ranks would otherwise reach
   its listener on MASTER_PORT in place of the store. A job that failed its preflight gets no verdict:
   the controller ends its launchers; end-of-file on stdin (the controller is gone) ends them too.
3. :meth:`Preflight.end`, once torch is imported, waits for that thread; the launcher then starts
   its ranks.

Nothing here runs after the ranks start, and nothing of it is left for them: no thread (the zygote
forks), no listener, not the setting.
"""
from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import asdict
from typing import Any

from lab.rank.netfacts import Target
from lab.rank.probe import check_links, survey
from lab.rank.protocol import emit
from lab.rank.worker import TOKEN_VAR

PREFLIGHT_VAR = "LAB_PREFLIGHT"
GO = b"go"  # the controller's verdict line when the network is fit for the job
TIMEOUT = 2.0  # seconds for a connection, and as long for its handshake: a peer that needs more is not there
CLOSE_WAIT = 1.0  # seconds for the listeners' threads to end once told to


class _Stdin:
    """Lines from fd 0, read unbuffered: what is left after the last line read stays here, not in
    a buffer the launcher (which watches fd 0 for end-of-file later) cannot see."""

    def __init__(self) -> None:
        self._data = b""

    def line(self) -> bytes | None:
        """The next line without its newline; None at end-of-file."""
        while b"\n" not in self._data:
            try:
                chunk = os.read(0, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return None
            self._data += chunk
        line, _, self._data = self._data.partition(b"\n")
        return line


class Preflight:
    """One host's preflight (see the module); :func:`begin` starts it."""

    def __init__(self, spec: dict[str, Any], token: str) -> None:
        self.token = token
        self.name = str(spec["name"])
        self.timeout = TIMEOUT
        self.stdin = _Stdin()
        self.verdict: bytes | None = None  # the controller's last line
        port = spec.get("master_port")
        facts, self.listeners = survey(self.name, token, self.timeout, str(spec["master_addr"]),
                                       int(port) if port is not None else None, lookups=False)
        emit(token, "facts", **facts)
        self.checker = threading.Thread(target=self._check, name="lab-preflight", daemon=True)
        self.checker.start()

    def _check(self) -> None:
        """Wait for the targets, connect to them all, report; then wait for the verdict and, on ``go``,
        stop listening at once and say so (the controller tells the other hosts to go only once rank
        0's host has: their ranks would reach its listener on MASTER_PORT in place of the store)."""
        line = self.stdin.line()
        if line is None:
            return
        try:
            targets = [Target(**t) for t in json.loads(line)["targets"]]
        except (ValueError, KeyError, TypeError) as exc:
            sys.stderr.write(f"lab.rank.preflight: unreadable targets: {exc}\n")
            return
        links = check_links(targets, self.name, self.token, self.timeout)
        emit(self.token, "links", links=[asdict(link) for link in links])
        self.verdict = self.stdin.line()
        if self.verdict is not None and self.verdict.strip() == GO:
            for listener in self.listeners:
                listener.close(CLOSE_WAIT)
            if len(self.listeners) > 1:  # (it listened on MASTER_PORT too)
                emit(self.token, "closed")

    def end(self) -> None:
        """Wait for the controller's verdict: return on ``go``, with nothing of the preflight left (no
        thread, no listener); end the process otherwise (the controller went away, or stops the job)."""
        self.checker.join()
        if self.verdict is None or self.verdict.strip() != GO:
            for listener in self.listeners:
                listener.close()
            os._exit(1)  # (nothing of ours ran: nothing to tear down)


def begin() -> Preflight | None:
    """The host's preflight, started, when the lab asked for one (its setting is taken out of the
    environment: the ranks do not see it)."""
    spec = os.environ.pop(PREFLIGHT_VAR, None)
    if not spec:
        return None
    return Preflight(json.loads(spec), os.environ.get(TOKEN_VAR, ""))
