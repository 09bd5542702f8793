"""What the controller knows of Slurm: a job it started (``--launcher srun``), cancelled by name
when a run stops early, Slurm's refusals to run one, each as one line with its exit code, the
batch jobs of ``lab submit``, and the nodes of the allocation the lab runs in (``--hosts slurm``).

The job is the run's (``Plan.job_name``: ``lab-TOKEN``), so cancelling it by name on the login
host (``scancel --name``) reaches it whatever became of the ``srun`` that started it, and
``squeue`` says when nothing of it is left.
"""
from __future__ import annotations

import logging
import os
import re
import select
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lab.core.ansible import HOST_NAME, PLAIN_PATH
from lab.errors import ExitCode, LabError, UsageError
from lab.model.inventory import Host, Inventory
from lab.rank.node import per_node_counts
from lab.transport import Transport

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


SBATCH_TIMEOUT = 60.0  # seconds for sbatch to answer (not for the job: --wait waits for it)
_JOB_ID = re.compile(r"^Submitted batch job (\d+)", re.M)
_TIME = re.compile(r"(\d+-)?\d{1,3}(:\d{2}){0,2}")  # Slurm's [days-]minutes[:seconds] or hours:minutes:seconds


@dataclass(frozen=True)
class BatchJob:
    """``lab submit``'s job: the exercises (and ``run``'s options) to run on the allocation's nodes."""

    run_args: tuple[str, ...]  # what follows ``python -m lab run`` in the job
    nodes: int
    ntasks_per_node: int
    time: str | None = None
    partition: str | None = None

    def check(self) -> None:
        if self.nodes < 1 or self.ntasks_per_node < 1:
            raise UsageError("--nodes and --ntasks-per-node must be at least 1")
        if self.time is not None and not _TIME.fullmatch(self.time):
            raise UsageError(f"--time {self.time!r}: not a Slurm time (MINUTES, HH:MM:SS, DAYS-HH)")
        if self.partition is not None:
            check_partition(self.partition)

    def script(self, python: str, checkout: Path, out: Path) -> str:
        """The sbatch script: the allocation's nodes are the hosts (``--hosts slurm``); the run's
        report goes to the job's output (``slurm-JOBID.out``), its JUnit results to ``lab-JOBID.xml``,
        both in ``out``."""
        options = ["--job-name=lab-submit", f"--nodes={self.nodes}", f"--ntasks-per-node={self.ntasks_per_node}",
                   f"--output={out}/slurm-%j.out", *([f"--time={self.time}"] if self.time else []),
                   *([f"--partition={self.partition}"] if self.partition else [])]
        run = shlex.join([python, "-m", "lab", "run", *self.run_args, "--hosts", "slurm"])
        results = shlex.quote(str(out)) + '/lab-"$SLURM_JOB_ID"'
        return "\n".join(["#!/bin/sh", "# written by `python -m lab submit`",
                          *(f"#SBATCH {option}" for option in options),
                          f"cd {shlex.quote(str(checkout))} || exit 5",
                          f"exec {run} --junit {results}.xml", ""])


def submit(job: BatchJob, out: Path, wait: bool, submitted: Callable[[str], None]) -> tuple[str, int | None]:
    """Write ``job``'s script into ``out`` and sbatch it here (the cluster's login host), telling
    ``submitted`` the job's id as soon as Slurm gives it; the job id, and with ``wait`` the job's exit
    code once it ended (sbatch --wait; Ctrl-C cancels the job)."""
    job.check()
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise UsageError("lab submit runs sbatch, which is not on PATH here: run it on a Slurm cluster's login host")
    out.mkdir(parents=True, exist_ok=True)
    checkout = Path(__file__).resolve().parents[2]
    path = out / "lab-submit.sh"
    path.write_text(job.script(os.path.abspath(sys.executable), checkout, out.resolve()))
    path.chmod(0o700)
    argv = [sbatch, "--parsable", *(["--wait"] if wait else []), str(path)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job_id = ""
    try:
        assert process.stdout is not None
        if not select.select([process.stdout], [], [], SBATCH_TIMEOUT)[0]:
            raise SlurmError(f"sbatch did not answer within {SBATCH_TIMEOUT:g}s: does slurmctld? (`scontrol ping`)",
                             ExitCode.UNREACHABLE)
        job_id = process.stdout.readline().strip().split(";")[0]
        if job_id.isdigit():
            submitted(job_id)
        if wait and job_id.isdigit():
            _wait_while_it_can_run(process, job_id)
        process.wait(timeout=SBATCH_TIMEOUT)
    except BaseException:  # Ctrl-C, sbatch hanging, a job that can never run: nothing of it stays
        process.kill()
        if job_id.isdigit():
            subprocess.run(["scancel", job_id], capture_output=True, timeout=SBATCH_TIMEOUT)
        raise
    error = process.stderr.read().strip() if process.stderr else ""
    if not job_id.isdigit():
        refused = refusal(error.splitlines(), "sbatch") or SlurmError(
            f"sbatch did not submit the job: {(error.splitlines() or ['no answer'])[-1]}", ExitCode.RUN_ERROR)
        raise refused
    return job_id, process.returncode if wait else None


POLL = 2.0  # seconds between two looks at a pending job
# why a job is pending (squeue %r) when it can never run as asked: waiting would be a hang
NEVER_RUNS = ("PartitionNodeLimit", "PartitionTimeLimit", "PartitionConfig", "BadConstraints", "InvalidAccount",
              "InvalidQOS", "PartitionDown", "PartitionInactive", "QOSMaxNodePerJobLimit",
              "QOSMaxWallDurationPerJobLimit")


def _wait_while_it_can_run(process: subprocess.Popen[str], job_id: str) -> None:
    """Wait for ``sbatch --wait`` to end; SlurmError when the job is pending for a reason that
    never passes (more nodes than the partition has, say)."""
    while True:
        try:
            process.wait(timeout=POLL)
            return
        except subprocess.TimeoutExpired:
            pass
        try:
            listed = subprocess.run(["squeue", "--noheader", "--jobs", job_id, "--format=%t %r"], capture_output=True,
                                    text=True, timeout=SBATCH_TIMEOUT).stdout.split(None, 1)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(listed) == 2 and listed[0] == "PD" and listed[1].strip() in NEVER_RUNS:
            raise SlurmError(f"job {job_id}: Slurm can never run it as asked ({listed[1].strip()}): it was cancelled",
                             ExitCode.BAD_INPUT)


def job_output(out: Path, job_id: str) -> str:
    """What the job printed (its output file), as far as it got."""
    try:
        return (out / f"slurm-{job_id}.out").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def ran_out_of_time(output: str) -> bool:
    """Whether Slurm ended the job at its time limit (what slurmstepd writes in its output)."""
    return "DUE TO TIME LIMIT" in output


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
