"""``--launcher torchrun``: one torchrun agent per host (``lab.rank.node torchrun``), which forms a
c10d rendezvous on rank 0's host and starts that host's ranks; torchrun numbers the ranks and the
nodes itself, so the lab learns where each rank runs from its hello."""
from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from lab.core.launchers.base import Launcher
from lab.core.plan import RUN_DIR, Plan, public_id
from lab.inventory.model import Host
from lab.rank import node
from lab.suite.check import Launched

TORCHRUN_DIR = "torchelastic"  # in the run's directory: torchrun's --log-dir


class Torchrun(Launcher):
    name: ClassVar[str] = "torchrun"
    summary: ClassVar[str] = "one per host: c10d rendezvous on rank 0's host, torchrun numbers the ranks"
    forms_group: ClassVar[bool] = True
    places_ranks: ClassVar[bool] = False
    restarts_ranks: ClassVar[bool] = True
    launched: ClassVar[Launched] = Launched(rank_parent="torchrun agent", sets_group_rank=True)
    passes_stdin: ClassVar[bool] = True  # (through a relay of the host's process: lab.rank.stdin.Relay)

    def order(self, hosts: Sequence[Host]) -> tuple[Host, ...]:
        """torchrun's c10d rendezvous numbers the nodes in the sorted order of their addresses
        (``--local-addr``, then the agent's pid)."""
        return tuple(sorted(hosts, key=lambda h: h.peer_address))

    def node_args(self, plan: Plan, node_rank: int, host: Host, ranks: tuple[int, ...],
                  env: dict[str, str]) -> tuple[str, ...]:
        return node.command("torchrun", *torchrun_args(plan, host.slots), "--node-rank", str(node_rank),
                            "--local-addr", host.peer_address)


def torchrun_args(plan: Plan, slots: int) -> tuple[str, ...]:
    """The arguments of torchrun that a host's agent shares with the others' (``slots``: its ranks).
    Its own files (the ranks' error files) go in the run's directory, which the run removes, not in
    a folder of the host's temp directory that nothing does."""
    return ("--nnodes", str(len(plan.hosts)), "--nproc-per-node", str(slots),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", str(plan.rdzv_endpoint),
            "--rdzv-id", public_id(plan.token), "--max-restarts", str(plan.options.max_restarts),
            "--log-dir", f"{RUN_DIR}/{TORCHRUN_DIR}")
