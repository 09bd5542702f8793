"""``--launcher spawn``: one process per host ``mp.spawn``s the host's ranks, as the tutorials
start theirs on one machine (``lab.rank.node spawn``); it takes the held ports from the holder."""
from __future__ import annotations

from typing import ClassVar

from lab.core.launchers.base import Launcher, rendezvous_env
from lab.core.plan import Plan
from lab.inventory.model import Host
from lab.rank import node
from lab.suite.check import Launched


class Spawn(Launcher):
    name: ClassVar[str] = "spawn"
    summary: ClassVar[str] = "one process per host that mp.spawns its ranks"
    hands_over_ports: ClassVar[bool] = True
    launched: ClassVar[Launched] = Launched(rank_parent="mp.spawn parent")
    passes_stdin: ClassVar[bool] = True  # (through a relay of the host's process: lab.rank.stdin.Relay)

    def node_args(self, plan: Plan, node_rank: int, host: Host, ranks: tuple[int, ...],
                  env: dict[str, str]) -> tuple[str, ...]:
        env.update(rendezvous_env(plan, ranks[0]))
        return node.command("spawn", "--nprocs", str(host.slots), "--first-rank", str(ranks[0]))
