"""``python -m lab.rank.node fork|torchrun|spawn ...``: the one process per host that starts that
host's ranks itself.

* ``fork --nprocs N --first-rank F PROGRAM`` (``--launcher lab``): imports torch once and forks
  the host's ranks from itself, passing their streams on checked: see ``lab.rank.zygote``.

* ``torchrun ARGS``: torchrun as ``python -m torch.distributed.run ARGS`` would run it, in this
  process. Its agent joins the c10d rendezvous, then starts the ranks, each in a session of its
  own, with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
  MASTER_PORT set. The ranks inherit this process's standard input, so each one stops itself
  when the controller goes away (see ``lab.rank.worker.stop_when_orphaned``).
* ``srun SRUN_OPTIONS -- KIND ARGS`` (``--launcher srun`` and ``srun-torchrun``): on the Slurm
  cluster's login host, one job whose tasks are the ranks (KIND ``task``) or one torchrun per
  node (KIND ``torchrun``, the tutorial's ``srun torchrun``): see ``lab.rank.srun``.
* ``task PROGRAM``: one Slurm task as a rank: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and
  GROUP_RANK from SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, the step's tasks on this node and
  SLURM_NODEID (the lab gives MASTER_ADDR and MASTER_PORT); the rank is forked from the lab's
  zygote (``fork`` above, with one rank), so its streams are checked as under ``--launcher lab``.
* ``spawn --nprocs N --first-rank F PROGRAM``: ``torch.multiprocessing.spawn`` of N ranks, as the
  tutorials start theirs on one machine. Rank ``F + i`` gets RANK and LOCAL_RANK here; the lab
  gives this process MASTER_ADDR, MASTER_PORT, WORLD_SIZE and LOCAL_WORLD_SIZE. The ranks stay
  in this process group, which stops as a whole when the controller goes away.

PROGRAM is ``-m MODULE ARGS`` (the lab's worker or launcher), as torchrun takes it.

``fork``, ``torchrun`` and ``spawn`` fork a helper while they import torch, which says how their
start-up goes and checks the network the job will use before they start any rank, when the lab
asks them to (``lab.rank.preflight``).

SIGUSR1 (the lab asks a hung run for its stacks) must not end this process: it is passed on to
torchrun's ranks, whose sessions the lab's signal to this group does not reach; spawned ranks
are in this group and get it anyway.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

from lab.rank import inputs, preflight
from lab.rank.protocol import report_exits
from lab.rank.stdin import EVERY_RANK, RANK_0, STDIN_VAR, Relay
from lab.rank.worker import WATCHED_BY_PARENT, stop_when_orphaned


def children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _forward_to_children(signum: int, frame: object) -> None:
    for child in children(os.getpid()):
        try:
            os.killpg(child, signum)  # each torchrun rank leads its own session
        except (ProcessLookupError, PermissionError):
            pass


def torchrun(args: list[str], helper: preflight.StartupHelper | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    ready(helper, int(args[args.index("--nproc-per-node") + 1]) if "--nproc-per-node" in args else 1)
    signal.signal(signal.SIGUSR1, _forward_to_children)
    try:
        torchrun_main(args)
    except ChildFailedError as exc:  # torchrun's table of which rank failed how, without our stack
        print(exc.format_msg(), file=sys.stderr)  # type: ignore[no-untyped-call]
        first, _ = exc.get_first_failure()  # the root cause first: the others were stopped after it
        report_exits({rank: exc.failures[rank].exitcode for rank in sorted(exc.failures, key=lambda r: r != first)})
        return 1
    return 0


def host_ranks(kind: str, args: list[str], counted: bool = True) -> argparse.Namespace:
    """``--nprocs N --first-rank F -m MODULE ARGS``: the host's ranks, and the program each runs
    (not ``counted``: ``-m MODULE ARGS`` alone)."""
    parser = argparse.ArgumentParser(prog=f"python -m lab.rank.node {kind}")
    if counted:
        parser.add_argument("--nprocs", type=int, required=True)
        parser.add_argument("--first-rank", type=int, required=True)
    parser.add_argument("-m", dest="module", required=True)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser.parse_args(args)


def spawn(args: list[str], helper: preflight.StartupHelper | None = None) -> int:
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    options = host_ranks("spawn", args)
    ready(helper, options.nprocs)
    # The ranks in this group dump their stacks on SIGUSR1; this process and the start of each
    # rank (the disposition is inherited until the program installs its dump) ignore it.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.environ[WATCHED_BY_PARENT] = "1"
    try:
        mp.spawn(_rank, args=(options.first_rank, options.module, options.args),  # type: ignore[attr-defined,no-untyped-call]
                 nprocs=options.nprocs)
    except ProcessException as exc:  # one rank failed; mp.spawn has stopped the others
        print(f"lab.rank.node: mp.spawn: {exc}".rstrip(), file=sys.stderr)
        report_exits({options.first_rank + exc.error_index: getattr(exc, "exit_code", 1)})
        return 1
    return 0


def task(args: list[str]) -> NoReturn:
    """One Slurm task as a rank (see the module): its settings from Slurm's, then the rank, forked
    from the lab's zygote, which passes its streams on checked and says how it ended."""
    from lab.rank import zygote

    options = host_ranks("task", args, counted=False)
    node = int(os.environ["SLURM_NODEID"])
    os.environ.update(WORLD_SIZE=os.environ["SLURM_NTASKS"], GROUP_RANK=str(node),
                      LOCAL_WORLD_SIZE=str(per_node_counts(os.environ["SLURM_STEP_TASKS_PER_NODE"])[node]))
    options.nprocs, options.first_rank = 1, int(os.environ["SLURM_PROCID"])
    zygote.main(options, first_local_rank=int(os.environ["SLURM_LOCALID"]))


def per_node_counts(spec: str) -> list[int]:
    """Slurm's tasks per node, node by node, from its compact count (``2(x3),1`` -> 2, 2, 2, 1);
    ValueError when it is not one."""
    counts: list[int] = []
    for part in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if found is None:
            raise ValueError(f"not a count of tasks: {part!r}")
        counts += [int(found[1])] * int(found[2] or 1)
    return counts


def _rank(local_rank: int, first_rank: int, module: str, args: list[str]) -> None:
    """One spawned rank: the tutorials' ``init_process`` sets its settings, then runs the
    program (the lab's worker or launcher: a module with ``main()``)."""
    os.environ.update(RANK=str(first_rank + local_rank), LOCAL_RANK=str(local_rank))
    sys.argv = [module, *args]
    sys.exit(importlib.import_module(module).main())


@dataclass(frozen=True)
class Mode:
    """One way a host's launcher starts its ranks (the module lists them)."""

    start: Callable[[list[str], preflight.StartupHelper | None], int]
    checks_network: bool  # forks the start-up helper before it imports torch (lab.rank.preflight)
    watches_stdin: bool  # it stops itself when the controller goes away (the zygote); else main() sees to it
    relays_stdin: bool = False  # an agent of torch's starts the ranks: their stdin relayed (ready())


def _fork(args: list[str], helper: preflight.StartupHelper | None) -> int:
    from lab.rank import zygote  # (it watches stdin itself: it forks, so it leaves no thread running)

    return zygote.main(host_ranks("fork", args), helper=helper)


def _srun(args: list[str], helper: preflight.StartupHelper | None) -> int:
    from lab.rank import srun

    return srun.main(args)


ModeName = Literal["fork", "torchrun", "spawn", "srun", "task"]  # (MODES' keys: a test holds them equal)
MODES: dict[str, Mode] = {
    "fork": Mode(_fork, checks_network=True, watches_stdin=True),
    "torchrun": Mode(torchrun, checks_network=True, watches_stdin=False, relays_stdin=True),
    "spawn": Mode(spawn, checks_network=True, watches_stdin=False, relays_stdin=True),
    "srun": Mode(_srun, checks_network=False, watches_stdin=True),  # (it passes its stdin on to srun's tasks)
    "task": Mode(lambda args, helper: task(args), checks_network=False, watches_stdin=True),
}


def command(mode: ModeName, *args: str) -> tuple[str, ...]:
    """The arguments of ``python`` that start a host's launcher in ``mode`` (the lab's launchers'
    processes, ``lab.core.launchers``)."""
    return ("-m", "lab.rank.node", mode, *args)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        print(f"usage: python -m lab.rank.node {{{','.join(MODES)}}} ARGS", file=sys.stderr)
        return 2
    # Not dumpable from the start (execve made it so again): this process holds the launch's
    # streams, where only the launcher speaks, and no rank of this user may open them in /proc.
    inputs.not_dumpable()
    if sys.argv[1] == "fork":  # (the zygote, forked from a server that has torch imported, where one answers)
        from lab.rank import warm

        status = warm.hand_over(sys.argv[1:])
        if status is not None:
            return status
    return start(sys.argv[1], sys.argv[2:])


def start(name: str, args: list[str]) -> int:
    """Start the host's ranks in mode ``name`` from this process (a cold start, or the warm server's
    zygote: lab.rank.warm)."""
    mode = MODES[name]
    helper = preflight.begin() if mode.checks_network else None  # (before it imports torch)
    if helper is None and not mode.watches_stdin and not mode.relays_stdin:
        stop_when_orphaned()  # (else once torch is imported: ready())
    return mode.start(args, helper)


def ready(helper: preflight.StartupHelper | None, ranks: int) -> None:
    """torch is imported (torchrun's agent or mp.spawn is about to start the host's ``ranks`` ranks):
    the helper stopped (with the preflight's verdict), then a relay of the controller's line
    (lab.rank.stdin.Relay): the ranks' stdin what the controller sends them, if any, else /dev/null,
    and all of this process group stopped when the controller goes away."""
    if helper is not None:
        helper.end()
    reading = {EVERY_RANK: ranks, RANK_0: 1}.get(os.environ.get(STDIN_VAR, ""), 0)
    Relay(reading).start()


if __name__ == "__main__":
    sys.exit(main())
