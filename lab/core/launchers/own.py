"""``--launcher lab``: one process per host imports torch once and forks the host's ranks from
itself, each with its settings in its environment (``lab.rank.node fork``, ``lab.rank.zygote``).
No rank can reach it: it checks every event against the rank whose pipe it came through, tags its
ranks' lines, takes the held ports from the holder, measures what its connections carried,
passes rank 0 the launch's stdin and, where asked, keeps each rank apart as a user of its own."""
from __future__ import annotations

from typing import ClassVar

from lab.core.launchers.base import Launcher, rendezvous_env
from lab.core.plan import Plan
from lab.inventory.model import Host
from lab.rank import node


class OwnLauncher(Launcher):
    name: ClassVar[str] = "lab"
    summary: ClassVar[str] = ("each rank, the settings in its environment, forked from one process per host that "
                              "imported torch once")
    hands_over_ports: ClassVar[bool] = True
    measures_wire: ClassVar[bool] = True
    isolates_ranks: ClassVar[bool] = True
    tags_output: ClassVar[bool] = True
    passes_stdin: ClassVar[bool] = True

    def node_args(self, plan: Plan, node_rank: int, host: Host, ranks: tuple[int, ...],
                  env: dict[str, str]) -> tuple[str, ...]:
        env.update(rendezvous_env(plan, ranks[0]))
        return node.command("fork", "--nprocs", str(host.slots), "--first-rank", str(ranks[0]))
