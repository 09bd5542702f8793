"""``lab submit``: a batch job that runs the lab on its Slurm allocation (``--hosts slurm``),
submitted with sbatch on the cluster's login host; with ``--wait`` its exit code, and a job that
can never run as asked cancelled rather than waited on."""
from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lab.core.slurm import SlurmError, check_partition, refusal
from lab.errors import ExitCode, UsageError

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
