"""What every launcher is: who starts a plan's ranks, and what the plan and the runner need to
know of it. A launcher is a class with a name; ``lab.core.launchers`` finds it by that name.

The plan asks a launcher to check the hosts (:meth:`Launcher.check`), to order them as the ranks
will be numbered (:meth:`Launcher.order`) and for the processes to start (:meth:`Launcher.launches`,
which the plan then holds as data); the runner asks it which ranks' inputs each host gets, on which
host a rank that said hello runs, whether the hosts' run directories will do, what to clean after a
run and what refusal its output holds. The defaults are those of a launcher that starts one process
per host, whose ranks the lab numbers itself.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

from lab.core.plan import Launch, Plan, interface_env
from lab.errors import LabError, UsageError
from lab.inventory.model import Host
from lab.rank.isolation import USERS_VAR
from lab.rank.preflight import PREFLIGHT_VAR
from lab.rank.stdin import EVERY_RANK, RANK_0, STDIN_VAR
from lab.rank.wire import WIRE_VAR
from lab.suite.check import Launched

if TYPE_CHECKING:
    from lab.transport.base import Transport

TAG_OUTPUT_VAR = "LAB_TAG_OUTPUT"  # set: the ranks' relay tags their lines (lab.rank.output), the launcher does not


class Launcher:
    """One way to start the ranks: one process per host (:meth:`node_args` says which), unless a
    subclass starts them otherwise (:meth:`launches`)."""

    name: ClassVar[str]
    summary: ClassVar[str]  # what it does, for --launcher's help
    # torchrun's own rendezvous forms the ranks' group: env:// only, and MASTER_PORT is torchrun's
    forms_group: ClassVar[bool] = False
    # the lab knows each rank's host before the ranks start (else it learns it from each one's hello)
    places_ranks: ClassVar[bool] = True
    # the lab's own processes take the held ports from the port holder (lab.rank.ports --exclusive)
    hands_over_ports: ClassVar[bool] = False
    # each host's launcher checks the network before it starts any rank (lab.rank.preflight)
    checks_network: ClassVar[bool] = True
    # each host's launcher measures what its connections carried (lab.rank.wire), out of its ranks' reach
    measures_wire: ClassVar[bool] = False
    # each host's launcher can run each rank as a user of its own, kept apart from the others (Options.rank_users)
    isolates_ranks: ClassVar[bool] = False
    # the launcher tags its ranks' lines itself (the lab's zygote); else each rank's relay does
    tags_output: ClassVar[bool] = False
    # its process on rank 0's host passes rank 0 what `lab launch` reads on its stdin (lab.rank.stdin), and
    # each host's every rank of its host, where the plan asks (a notebook's cells)
    passes_stdin: ClassVar[bool] = False
    # torchrun's agent may restart the ranks after one fails (--max-restarts), each time with a new hello
    restarts_ranks: ClassVar[bool] = False
    # what the checks see of it in the ranks (their parent process, GROUP_RANK)
    launched: ClassVar[Launched] = Launched()

    def check(self, hosts: Sequence[Host], partition: str | None) -> None:
        """Refuse hosts or options this launcher cannot start ranks on (UsageError, one line)."""
        if partition is not None:
            raise UsageError(f"--partition {partition!r}: a Slurm partition is for --launcher srun or srun-torchrun")

    def order(self, hosts: Sequence[Host]) -> tuple[Host, ...]:
        """The hosts in the order their ranks are numbered (the runner learns the real placement
        from each rank's hello)."""
        return tuple(hosts)

    def launches(self, plan: Plan) -> tuple[Launch, ...]:
        """The processes to start: one per host, which starts the host's ranks (``lab.rank.node``)."""
        own = plan.own_settings()
        launches = []
        for node_rank, host in enumerate(plan.hosts):
            ranks = tuple(r.rank for r in plan.ranks if r.host == host.name)
            env = {**plan.launcher_env(dict(host.env), own), **interface_env(host)}
            if not self.tags_output:
                env[TAG_OUTPUT_VAR] = "1"
            args = self.node_args(plan, node_rank, host, ranks, env)
            if plan.wire is not None:
                env[WIRE_VAR] = plan.wire
            if plan.options.rank_users is not None:
                env[USERS_VAR] = str(plan.options.rank_users)
            self.pass_stdin(plan, ranks, env)
            if plan.checks_network:
                env[PREFLIGHT_VAR] = json.dumps({"name": host.name, "master_addr": plan.master_addr,
                                                 "master_port": plan.master_port if node_rank == 0 else None,
                                                 "take_master_port": plan.hands_over_ports and node_rank == 0})
            launches.append(Launch(host.name, ranks, (*args, *plan.program), env))
        return tuple(launches)

    def pass_stdin(self, plan: Plan, ranks: Sequence[int], env: dict[str, str]) -> None:
        """Where the launch of ``ranks`` passes the controller's stdin on (lab.rank.stdin), say to whom
        in its ``env``: every rank (a notebook's cells), else rank 0 (``lab launch``'s stdin)."""
        if self.passes_stdin and plan.is_launch and (plan.options.cells_mark or 0 in ranks):
            env[STDIN_VAR] = EVERY_RANK if plan.options.cells_mark else RANK_0

    def node_args(self, plan: Plan, node_rank: int, host: Host, ranks: tuple[int, ...],
                  env: dict[str, str]) -> tuple[str, ...]:
        """The command of ``host``'s process before the program (``env``: its settings, to add to)."""
        raise NotImplementedError

    def inputs_for(self, plan: Plan, host: str) -> tuple[int, ...]:
        """The ranks whose drawn inputs go to ``host``: its own, where the lab places the ranks."""
        if self.places_ranks:
            return tuple(r.rank for r in plan.ranks if r.host == host and r.rank in plan.inputs)
        return tuple(plan.inputs)

    def host_of(self, plan: Plan, launch_host: str, hostname: str) -> str:
        """The host a rank runs on that said hello through ``launch_host``'s launch (``hostname``: its own word)."""
        return launch_host

    def check_run_dirs(self, plan: Plan, run_dirs: Mapping[str, str]) -> None:
        """Refuse the hosts' run directories (RunError) where the launcher needs them otherwise."""

    def clean_up(self, plan: Plan, login: Transport, completed: bool) -> None:
        """What to end beyond the launches' processes once the run is over (``login``: the first host's)."""

    def refusal(self, plan: Plan, output: Sequence[str]) -> LabError | None:
        """The refusal to run that the first launch printed (``output``), when no rank started."""
        return None


def rendezvous_env(plan: Plan, rank: int) -> dict[str, str]:
    """What the lab tells a host's launcher of the rendezvous, from ``rank``'s planned settings (its
    first rank's: each of its ranks gets the rest from it)."""
    planned = plan.ranks[rank].env
    return {k: planned[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE") if k in planned}
