"""What the controller knows of Slurm: a job it started (``--launcher srun``), cancelled by name
when a run stops early, Slurm's refusals to run one, each as one line with its exit code, the
batch jobs of ``lab submit``, and the nodes of the allocation the lab runs in (``--hosts slurm``).

The job is the run's (``Plan.job_name``: ``lab-TOKEN``), so cancelling it by name on the login
host (``scancel --name``) reaches it whatever became of the ``srun`` that started it, and
``squeue`` says when nothing of it is left.
"""
from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable, Mapping

from lab.errors import ExitCode, LabError, UsageError
from lab.inventory.keys import HOST_NAME, PLAIN_PATH
from lab.inventory.model import Host, Inventory
from lab.rank.node import per_node_counts
from lab.rank.srun import NO_SRUN
from lab.transport.base import Transport

log = logging.getLogger(__name__)

_PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}")
CANCEL_WAIT = 20.0  # seconds for a cancelled job to leave squeue
WORKING = ("idle", "mixed", "allocated", "completing")  # the states (``sinfo %T``) of a node that takes jobs



def check_partition(partition: str) -> None:
    """A Slurm partition's name, as it may go on srun's or sbatch's command line."""
    if not _PARTITION.fullmatch(partition):
        raise UsageError(f"--partition {partition!r}: not a Slurm partition's name (letters, digits, '_.-')")

class SlurmError(LabError):
    """Slurm would not run the job (no such partition, nodes down or busy, a limit), or stopped it
    (its time limit); the exit code says which kind of refusal it was."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        self.exit_code = exit_code
        super().__init__(message)


_REFUSED = re.compile(r"^s(?:run|batch): error: (?:Unable to allocate resources|Job submit/allocate failed|"
                      r"Batch job submission failed): (?P<why>.+)$")
_PENDING = re.compile(r"^srun: (?P<why>Re(?:quired|quested) .*not available.*)$")
# Slurm's reasons, by what they mean for the user: the request is wrong, or the nodes cannot take it now
_BAD_REQUEST = ("invalid", "not available", "violates", "qos", "account", "time limit", "partition")
_NODES_CANNOT = ("busy", "down", "drained", "reserved", "not responding")


def refusal(lines: Iterable[str], where: str) -> SlurmError | None:
    """Slurm's refusal among ``lines`` (srun's or sbatch's own, said ``where``: "host node1"), as
    the error to raise; None when they hold none."""
    waited = ""  # why srun said the job had to wait, before it gave up
    for line in lines:
        line = line.strip()
        if line.startswith(NO_SRUN):
            return SlurmError(f"{where}: {line.removeprefix('lab.rank.node: ')}", ExitCode.BAD_INPUT)
        if (pending := _PENDING.match(line)) is not None:
            waited = pending["why"]
        found = _REFUSED.match(line)
        if found:
            why = found["why"].strip() + (f" ({waited})" if waited and waited not in found["why"] else "")
            lowered = why.lower()
            if any(w in lowered for w in _NODES_CANNOT):
                return SlurmError(f"{where}: Slurm refused the job: {why}: `sinfo` there shows the nodes' "
                                    f"states", ExitCode.UNREACHABLE)
            code = ExitCode.BAD_INPUT if any(w in lowered for w in _BAD_REQUEST) else ExitCode.RUN_ERROR
            return SlurmError(f"{where}: Slurm refused the job: {why}", code)
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


ALLOCATION = "slurm"  # --hosts slurm: the nodes of the Slurm allocation the lab runs in


def allocation_inventory(environ: Mapping[str, str], python: str) -> Inventory:
    """The nodes of the Slurm allocation the lab runs in (``salloc``, ``sbatch``), read from its
    environment (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE), each reached by a job step of its own
    (``connection: slurm``) and running ``python``: this one, as a cluster's nodes share it. Their
    ``shared_dir`` (file:// rendezvous) is LAB_SHARED_DIR, a directory every node mounts, if set."""
    nodelist, tasks = environ.get("SLURM_JOB_NODELIST"), environ.get("SLURM_TASKS_PER_NODE")
    if not environ.get("SLURM_JOB_ID") or not nodelist or not tasks:
        raise UsageError("--hosts slurm reads the nodes of the Slurm allocation the lab runs in: run it inside "
                         "one (salloc -N2 --ntasks-per-node=2, or an sbatch script); SLURM_JOB_ID, "
                         "SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE are not all set here")
    try:
        nodes, counts = expand_nodelist(nodelist), per_node_counts(tasks)
    except ValueError as exc:
        raise UsageError(f"--hosts slurm: SLURM_JOB_NODELIST={nodelist!r}, SLURM_TASKS_PER_NODE={tasks!r}: "
                         f"{exc}") from None
    if len(nodes) != len(counts) or not all(HOST_NAME.match(n) for n in nodes):
        raise UsageError(f"--hosts slurm: SLURM_JOB_NODELIST={nodelist!r} and SLURM_TASKS_PER_NODE={tasks!r} do "
                         f"not name one task count per node")
    shared = environ.get("LAB_SHARED_DIR") or None
    if shared is not None and not PLAIN_PATH.match(shared):
        raise UsageError(f"LAB_SHARED_DIR={shared!r}: not an absolute path of plain characters")
    source = f"<slurm job {environ['SLURM_JOB_ID']}>"
    return Inventory(source, tuple(Host(node, node, connection="slurm", python=python, slots=count, source=source,
                                        shared_dir=shared) for node, count in zip(nodes, counts)))


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compact list of nodes as names: ``node[1-3,07],login`` -> node1, node2, node3,
    node07, login (ranges keep their zero padding; ValueError when it is not such a list)."""
    names: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(nodelist + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0 or depth > 1:
            raise ValueError("unbalanced brackets")
        if char == "," and depth == 0:
            names += _expand_name(nodelist[start:i])
            start = i + 1
    return names


def _expand_name(name: str) -> list[str]:
    """One item of a node list: a name, or a name with bracketed ranges (``gpu[1-2]-ib[0-1]``)."""
    head, bracket, rest = name.partition("[")
    if not bracket:
        if not name:
            raise ValueError("an empty name")
        return [name]
    inside, _, tail = rest.partition("]")
    tails = _expand_name(tail) if tail else [""]
    numbers: list[str] = []
    for part in inside.split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(last or first) < int(first):
            raise ValueError(f"not a range: {part!r}")
        numbers += [f"{n:0{len(first)}d}" for n in range(int(first), int(last or first) + 1)]
    return [f"{head}{number}{t}" for number in numbers for t in tails]
