"""The preflight, on a host: before its ranks start, the host's launcher checks the network the job
will use, from the process that will start them (``lab.rank.node``: the zygote, torchrun's agent,
mp.spawn's parent), while that process imports torch.

:func:`begin` forks a helper from the launcher before it imports torch, which says each second how
much CPU the launcher has used (``pulse``: the kernel's word that its start-up is under way, however
slowly a busy machine lets it go; the controller's deadline for start-up counts only time when nothing
moved) and, asked for by ``LAB_PREFLIGHT`` (JSON: the host's name, master_addr, master_port on rank 0's
host), does the whole preflight, through the launcher's own streams. It imports nothing more: loading
libtorch holds the launcher's interpreter for seconds at a time, and on a busy machine longer, so a
listener in the launcher would answer its peers late, and be taken for absent.

1. The helper reports this host's ``facts`` (the address gloo will advertise, from its hostname or
   GLOO_SOCKET_IFNAME, its interfaces, the port its listener took; rank 0's host listens on
   MASTER_PORT too, which the run's port holder lets it bind, or hands it over: lab.rank.ports),
   then waits for the controller's line
   of targets (``{"targets": [...]}``: MASTER_ADDR:MASTER_PORT and every peer's advertised address),
   connects to them all at once (``lab.rank.probe.check_links``: judged by what the network answers)
   and reports the ``links``.
2. It pulses while it waits for the controller.
3. It then waits for the controller's verdict: ``go`` (every host's links are in and nothing is
   wrong), on which it stops listening (rank 0's host says so: ``closed``), pulses until the launcher
   has imported torch, and exits 0. The controller
   tells rank 0's host first and the others once it has closed: their ranks would otherwise reach
   its listener on MASTER_PORT in place of the store. A job that failed its preflight gets no verdict:
   the controller ends its launchers; end-of-file on stdin (the controller is gone) ends the helper
   with 1.
4. :meth:`StartupHelper.end`, once torch is imported, waits for the helper: on 0 the launcher starts its
   ranks, on anything else it ends.

Nothing here runs after the ranks start, and nothing of it is left for them: the launcher started
no thread (the zygote forks), the helper and its listeners are gone, and so is the setting.
"""
from __future__ import annotations

import json
import os
import select
import sys
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from lab.rank import ports
from lab.rank.netfacts import Target
from lab.rank.probe import check_links, survey
from lab.rank.protocol import emit
from lab.rank.worker import TOKEN_VAR

PREFLIGHT_VAR = "LAB_PREFLIGHT"
GO = b"go"  # the controller's verdict line when the network is fit for the job
TIMEOUT = 2.5  # seconds in which no connection attempt to an address is answered: nothing answers there
CLOSE_WAIT = 1.0  # seconds for the listeners' threads to end once told to
PULSE_EVERY = 1.0  # seconds between two ``pulse`` events while the helper waits for the controller


class _Stdin:
    """Lines from fd 0, read unbuffered (the controller sends nothing after its verdict, and the
    launcher watches the same descriptor for end-of-file later); while none comes, ``idle`` is
    called each PULSE_EVERY seconds."""

    def __init__(self, idle: Callable[[], None]) -> None:
        self._data = b""
        self._idle = idle

    def line(self) -> bytes | None:
        """The next line without its newline; None at end-of-file."""
        while b"\n" not in self._data:
            if not select.select([0], [], [], PULSE_EVERY)[0]:
                self._idle()
                continue
            try:
                chunk = os.read(0, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return None
            self._data += chunk
        line, _, self._data = self._data.partition(b"\n")
        return line


def launcher_cpu() -> float:
    """The CPU seconds the launcher (this helper's parent) has used."""
    return cpu_of(os.getppid())


def cpu_of(pid: int) -> float:
    """The CPU seconds process ``pid`` has used: utime and stime of its /proc/PID/stat, which the
    kernel shows whatever the process is doing (of any process of the user's); 0 where unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class StartupHelper:
    """A host's launcher's helper while it imports torch (see the module): the preflight when the lab
    asked for one (``spec``), and the ``pulse`` either way; :func:`begin` starts it."""

    def __init__(self, spec: dict[str, Any] | None, token: str) -> None:
        self.checks = spec is not None
        sys.stdout.flush()  # (what the launcher has not written yet must not be written twice)
        sys.stderr.flush()
        done, self._done = os.pipe()  # (closed by end(), or by the launcher's death: the helper stops)
        self.helper = os.fork()
        if self.helper == 0:
            code = 1
            try:
                os.close(self._done)
                code = 0 if (spec is None or _check(spec, token)) and _pulse(token, done) else 1
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(done)

    def end(self) -> None:
        """torch is imported: stop the helper, and with a preflight wait for its verdict: return on
        ``go``; end the process otherwise (the controller went away, or stops the job)."""
        os.close(self._done)
        _, status = os.waitpid(self.helper, 0)
        if self.checks and os.waitstatus_to_exitcode(status) != 0:
            os._exit(1)  # (nothing of ours ran: nothing to tear down)


def _pulse(token: str, done: int) -> bool:
    """Say each PULSE_EVERY seconds how much CPU the launcher has used, until it is done importing
    torch (or gone)."""
    while not select.select([done], [], [], PULSE_EVERY)[0]:
        emit(token, "pulse", cpu=round(launcher_cpu(), 2))
    return True


def _check(spec: dict[str, Any], token: str) -> bool:
    """The helper's preflight: report the facts, connect to the targets and report the links, then
    wait for the verdict; on ``go`` stop listening and say so (the controller tells the other hosts
    to go only once rank 0's host has). Whether the verdict was ``go``."""
    name, stdin = str(spec["name"]), _Stdin(lambda: emit(token, "pulse", cpu=round(launcher_cpu(), 2)))
    port = spec.get("master_port")
    held = ports.take(int(port)) if port is not None and spec.get("take_master_port") else None
    facts, listeners = survey(name, token, TIMEOUT, str(spec["master_addr"]),
                              int(port) if port is not None else None, lookups=False, master_socket=held)
    try:
        emit(token, "facts", **facts)
        line = stdin.line()
        if line is None:
            return False
        try:
            targets = [Target(**t) for t in json.loads(line)["targets"]]
        except (ValueError, KeyError, TypeError) as exc:
            sys.stderr.write(f"lab.rank.preflight: unreadable targets: {exc}\n")
            return False
        links = check_links(targets, name, token, TIMEOUT)
        emit(token, "links", links=[asdict(link) for link in links])
        verdict = stdin.line()
        if verdict is None or verdict.strip() != GO:
            return False
        for listener in listeners:
            listener.close(CLOSE_WAIT)
        if len(listeners) > 1:  # (it listened on MASTER_PORT too)
            emit(token, "closed")
        return True
    finally:
        for listener in listeners:
            listener.close()


def begin() -> StartupHelper | None:
    """The launcher's helper, started when the lab started the launcher (with the preflight when the
    lab asked for one: its setting is taken out of the environment, the ranks do not see it)."""
    spec = os.environ.pop(PREFLIGHT_VAR, None)
    token = os.environ.get(TOKEN_VAR)
    if not spec and not token:
        return None
    return StartupHelper(json.loads(spec) if spec else None, token or "")
