"""What the controller knows of Slurm: a job it started (``--launcher srun``), cancelled by name
when a run stops early, and Slurm's refusals to run one, each as one line with its exit code.

The job is the run's (``Plan.job_name``: ``lab-TOKEN``), so cancelling it by name on the login
host (``scancel --name``) reaches it whatever became of the ``srun`` that started it, and
``squeue`` says when nothing of it is left.
"""
from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable

from lab.errors import ExitCode, LabError
from lab.transport import Transport

log = logging.getLogger(__name__)

CANCEL_WAIT = 20.0  # seconds for a cancelled job to leave squeue
WORKING = ("idle", "mixed", "allocated", "completing")  # the states (``sinfo %T``) of a node that takes jobs


class SlurmRefused(LabError):
    """Slurm would not run the job (no such partition, nodes down or busy, a limit); the exit code
    says which kind of refusal it was."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        self.exit_code = exit_code
        super().__init__(message)


_REFUSED = re.compile(r"^srun: error: (?:Unable to allocate resources|Job submit/allocate failed): (?P<why>.+)$")
_PENDING = re.compile(r"^srun: (?P<why>Re(?:quired|quested) .*not available.*)$")
# Slurm's reasons, by what they mean for the user: the request is wrong, or the nodes cannot take it now
_BAD_REQUEST = ("invalid", "not available", "violates", "qos", "account", "time limit", "partition")
_NODES_CANNOT = ("busy", "down", "drained", "reserved", "not responding")


def refusal(lines: Iterable[str], login: str) -> SlurmRefused | None:
    """Slurm's refusal among ``lines`` (srun's own, on the ``login`` host), as the error to raise;
    None when they hold none."""
    waited = ""  # why srun said the job had to wait, before it gave up
    for line in lines:
        line = line.strip()
        if (pending := _PENDING.match(line)) is not None:
            waited = pending["why"]
        found = _REFUSED.match(line)
        if found:
            why = found["why"].strip() + (f" ({waited})" if waited and waited not in found["why"] else "")
            lowered = why.lower()
            if any(w in lowered for w in _NODES_CANNOT):
                return SlurmRefused(f"host {login}: Slurm refused the job: {why}: `sinfo` there shows the nodes' "
                                    f"states", ExitCode.UNREACHABLE)
            code = ExitCode.BAD_INPUT if any(w in lowered for w in _BAD_REQUEST) else ExitCode.RUN_ERROR
            return SlurmRefused(f"host {login}: Slurm refused the job: {why}", code)
    return None


def cancel(transport: Transport, job_name: str) -> None:
    """Cancel the run's job (``scancel --name``) on the login host and wait until ``squeue`` lists
    nothing of it, up to CANCEL_WAIT seconds. Never raises: what is left is logged."""
    name = shlex.quote(job_name)
    polls = int(CANCEL_WAIT / 0.25)
    script = (f"scancel --name={name} >/dev/null 2>&1; i=0; while [ $i -lt {polls} ]; do "
              f"[ -z \"$(squeue --noheader --name={name} --format=%i 2>/dev/null)\" ] && exit 0; "
              f"sleep 0.25; i=$((i+1)); done; squeue --noheader --name={name}; exit 1")
    try:
        status, output = transport.call(["/bin/sh", "-c", script], CANCEL_WAIT + 10)
    except (OSError, LabError) as exc:
        log.warning("host %s: cannot cancel Slurm job %s: %s", transport.host.name, job_name, exc)
        return
    if status != 0:
        log.warning("host %s: Slurm job %s is still listed after scancel: %s", transport.host.name, job_name,
                    output.strip() or f"exit {status}")
