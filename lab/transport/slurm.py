"""The slurm transport: a node of the Slurm allocation the lab runs in (``--hosts slurm``),
reached by a job step of one task there: ``srun --overlap --nodes=1 --ntasks=1 --nodelist=NODE``
(see ``lab.transport.prefixed``). The steps share the allocation's CPUs with each other
(``--overlap``), so the lab's own (the port holder, a host's launcher, a kill) never wait for one
another; killing the local srun ends its step, and everything in it, on the node."""
from __future__ import annotations

import os
import shutil

from lab.errors import RunError
from lab.transport.prefixed import PrefixedTransport


class SlurmTransport(PrefixedTransport):
    def prefix(self) -> list[str]:
        srun = shutil.which("srun")
        if srun is None or "SLURM_JOB_ID" not in os.environ:
            raise RunError(f"host {self.host.name}: a node of a Slurm allocation is reached with srun, from inside "
                           f"the allocation (salloc, sbatch): " + ("srun is not on PATH" if srun is None else
                                                                   "SLURM_JOB_ID is not set here"))
        return [srun, "--overlap", "--quiet", "--nodes=1", "--ntasks=1", f"--nodelist={self.host.name}",
                "--kill-on-bad-exit=1"]
