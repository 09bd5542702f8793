"""``--launcher srun`` and ``srun-torchrun``: one Slurm job, started by ``srun`` from the first
host (the login host, ``lab.rank.node srun``), whose tasks are the ranks (``srun``: each maps
SLURM_PROCID... to RANK...) or one torchrun per node (``srun-torchrun``, the tutorials' ``srun
torchrun``). Slurm places the tasks, so a rank's host is the one its hostname names; Slurm starts
them, so there is no preflight; the job is the run's by name, so a run that did not complete
cancels it whatever became of its ``srun``."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from lab.core import slurm
from lab.core.launchers.base import TAG_OUTPUT_VAR, Launcher, rendezvous_env
from lab.core.launchers.torchrun import torchrun_args
from lab.core.plan import DEFAULT_TIMEOUT, Launch, Plan, interface_env
from lab.errors import LabError, RunError, UsageError
from lab.inventory.model import Host
from lab.rank import node
from lab.suite.check import Launched

if TYPE_CHECKING:
    from lab.transport.base import Transport


SRUN_SAYS = 2  # seconds left, after srun gives up waiting for the nodes, for its word to reach the lab


def srun_wait(timeout: float) -> int:
    """How long srun waits for the nodes (``--immediate``): the run's start-up timeout, less the time
    for srun's word on why it gave up (a drained node...) to arrive before the lab's own timeout ends
    the run without it; waiting longer for the nodes would be a hang. A job with no timeout (0) waits
    as long as a run's step may."""
    return max(1, round(timeout or DEFAULT_TIMEOUT) - SRUN_SAYS)


class Srun(Launcher):
    name: ClassVar[str] = "srun"
    summary: ClassVar[str] = "the ranks are the tasks of one Slurm job, started by srun on the first host"
    places_ranks: ClassVar[bool] = False
    checks_network: ClassVar[bool] = False
    tags_output: ClassVar[bool] = True  # (each task is forked from the lab's zygote: lab.rank.node task)
    passes_stdin: ClassVar[bool] = True  # (srun passes its stdin to every task: each task's launcher takes its rank's)
    launched: ClassVar[Launched] = Launched(sets_group_rank=True)  # (each task a parent of its own)

    def check(self, hosts: Sequence[Host], partition: str | None) -> None:
        """What a job of one ``srun`` needs of the hosts: as many ranks on each (``--ntasks-per-node``)."""
        if partition is not None:
            slurm.check_partition(partition)
        slots = {h.slots for h in hosts}
        if len(slots) > 1:
            raise UsageError(f"--launcher {self.name} starts as many ranks on every node (srun --ntasks-per-node), "
                             f"but the hosts have {', '.join(f'{h.name} {h.slots}' for h in hosts)} slots")

    def launches(self, plan: Plan) -> tuple[Launch, ...]:
        """One ``srun`` from the login host for the whole job, in one environment for every node
        (what their inventory entries share)."""
        login = plan.hosts[0]
        shared = set.intersection(*(set(h.env) for h in plan.hosts))
        env = {**plan.launcher_env(dict(shared), plan.own_settings()), **interface_env(login)}
        per_node, mode, task = self.task(plan, login, env)
        # (every count given: srun run from inside a step of an allocation would take that step's from its environment)
        srun = node.command(
            "srun", f"--nodes={len(plan.hosts)}", f"--ntasks={len(plan.hosts) * per_node}",
            f"--ntasks-per-node={per_node}", "--distribution=block",
            f"--nodelist={','.join(h.name for h in plan.hosts)}", f"--job-name={plan.job_name}",
            f"--immediate={srun_wait(plan.timeout)}",
            *((f"--partition={plan.options.partition}",) if plan.options.partition else ()), "--", mode)
        ranks = tuple(r.rank for r in plan.ranks)
        self.pass_stdin(plan, ranks, env)
        return (Launch(login.name, ranks, (*srun, *task, *plan.program), env),)

    def task(self, plan: Plan, login: Host, env: dict[str, str]) -> tuple[int, node.ModeName, tuple[str, ...]]:
        """The tasks per node, and what each task runs before the program (``lab.rank.node``'s mode and
        its arguments): a rank."""
        env.update(rendezvous_env(plan, 0))
        return login.slots, "task", ()

    def host_of(self, plan: Plan, launch_host: str, hostname: str) -> str:
        """The host its hostname names (one launch for every node)."""
        names = {h.name for h in plan.hosts}
        return next((n for n in (hostname, hostname.split(".", 1)[0]) if n in names), launch_host)

    def check_run_dirs(self, plan: Plan, run_dirs: Mapping[str, str]) -> None:
        """``srun`` starts every task in its own directory, the run's on the login host: every node
        needs the run's directory at that same path."""
        login = run_dirs[plan.hosts[0].name]
        other = next(((name, d) for name, d in run_dirs.items() if d != login), None)
        if other is not None:
            raise RunError(f"host {other[0]}: its run directory is {other[1]}, not {login} as on "
                           f"{plan.hosts[0].name}: srun runs the tasks in the same directory on every node "
                           f"(give the hosts the same TMPDIR)")

    def clean_up(self, plan: Plan, login: Transport, completed: bool) -> None:
        if not completed:
            slurm.cancel(login, plan.job_name)

    def refusal(self, plan: Plan, output: Sequence[str]) -> LabError | None:
        return slurm.refusal(output, f"host {plan.hosts[0].name}")


class SrunTorchrun(Srun):
    name: ClassVar[str] = "srun-torchrun"
    summary: ClassVar[str] = "srun starts one torchrun per node, as the tutorials' `srun torchrun`"
    forms_group: ClassVar[bool] = True
    restarts_ranks: ClassVar[bool] = True
    tags_output: ClassVar[bool] = False  # (a task is an agent: its ranks tag their lines themselves)
    launched: ClassVar[Launched] = Launched(rank_parent="torchrun agent", sets_group_rank=True)

    def order(self, hosts: Sequence[Host]) -> tuple[Host, ...]:
        """Under ``srun`` every agent has the same arguments, so torchrun numbers the nodes in the
        sorted order of their hosts' names."""
        return tuple(sorted(hosts, key=lambda h: h.name))

    def task(self, plan: Plan, login: Host, env: dict[str, str]) -> tuple[int, node.ModeName, tuple[str, ...]]:
        env[TAG_OUTPUT_VAR] = "1"
        return 1, "torchrun", torchrun_args(plan, login.slots)
