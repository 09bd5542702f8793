"""The exercise suite: a plain registry from name to exercise.

Each exercise pairs a rank program (``lab/suite/exercises/<module>.py``, what a student
reads and may replace with ``--solution``) with a checker
(``lab/suite/checks/<module>.py``, a pure-Python oracle that never imports torch).

``rendezvous`` says who forms the process group:

* ``"none"``: the program needs no process group (it may start processes itself);
* ``"shared"``: the lab forms one default group (``--init``) that every shared
  exercise of the run reuses, so ``run all`` pays start-up and rendezvous once;
* ``"env"``, ``"tcp"``, ``"file"``: the program forms its own group with that
  init method, from the settings the lab injects, and destroys it again.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from lab.suite.check import Results, Verdict, World
from lab.suite.checks import backends, basics, collectives, dsgd, p2p, ring

# Who forms the process group: nobody, the lab (one group every shared exercise reuses), or the
# program itself with that init method.
Rendezvous = Literal["none", "shared", "env", "tcp", "file"]
Checker = Callable[[Results, World], Verdict]

@dataclass(frozen=True)
class Exercise:
    name: str
    summary: str
    program: str  # dotted module of the reference rank program; it defines run(...)
    check: Checker
    rendezvous: Rendezvous = "shared"
    min_ranks: int = 1
    in_all: bool = True  # part of `run all`


def _exercises() -> dict[str, Exercise]:
    items = [
        Exercise("processes", "torch.multiprocessing: Process + join, then mp.spawn; each child reports once",
                 "lab.suite.exercises.processes", basics.check_processes, "none"),
        Exercise("launchers", "RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE as the launcher sets them "
                 "(--launcher lab, torchrun or spawn)", "lab.suite.exercises.launchers", basics.check_launchers),
        Exercise("groups", "init_process_group, get_rank/get_world_size, new_group of a subset",
                 "lab.suite.exercises.groups", basics.check_groups),
        Exercise("init-env", "init_method='env://': MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE",
                 "lab.suite.exercises.init_env", basics.check_init, "env"),
        Exercise("init-tcp", "init_method='tcp://ADDR:PORT' with explicit rank and world_size",
                 "lab.suite.exercises.init_tcp", basics.check_init, "tcp"),
        Exercise("init-file", "init_method='file:///PATH' on a path every rank shares",
                 "lab.suite.exercises.init_file", basics.check_init, "file"),
        Exercise("p2p", "blocking send/recv: 0 -> 1, then a pass around the ring",
                 "lab.suite.exercises.p2p", p2p.check_p2p, min_ranks=2),
        Exercise("p2p-async", "non-blocking isend/irecv and wait()",
                 "lab.suite.exercises.p2p_async", p2p.check_p2p_async, min_ranks=2),
        Exercise("broadcast", "broadcast from rank 0 (and from the last rank)",
                 "lab.suite.exercises.broadcast", collectives.check_broadcast),
        Exercise("reduce", "reduce to rank 0 with SUM, PRODUCT, MAX, MIN",
                 "lab.suite.exercises.reduce", collectives.check_reduce),
        Exercise("all-reduce", "all_reduce with SUM, PRODUCT, MAX, MIN",
                 "lab.suite.exercises.all_reduce", collectives.check_all_reduce),
        Exercise("scatter", "scatter a list of tensors from rank 0",
                 "lab.suite.exercises.scatter", collectives.check_scatter),
        Exercise("gather", "gather every rank's tensor on rank 0",
                 "lab.suite.exercises.gather", collectives.check_gather),
        Exercise("all-gather", "all_gather every rank's tensor on every rank",
                 "lab.suite.exercises.all_gather", collectives.check_all_gather),
        Exercise("reduce-scatter", "reduce_scatter of [1,10,100,1000]*rank (the tutorial's example)",
                 "lab.suite.exercises.reduce_scatter", collectives.check_reduce_scatter),
        Exercise("barrier", "barrier: no rank leaves before the last one arrives",
                 "lab.suite.exercises.barrier", collectives.check_barrier),
        Exercise("ring-allreduce", "ring all-reduce from isend/recv: the tutorial's, then chunked "
                 "(reduce-scatter + all-gather)", "lab.suite.exercises.ring_allreduce", ring.check_ring_allreduce,
                 min_ranks=2),
        Exercise("dsgd", "distributed synchronous SGD: average_gradients with all_reduce, vs one "
                 "process and DistributedDataParallel", "lab.suite.exercises.dsgd", dsgd.check_dsgd),
        Exercise("backends", "which backends each host has; collectives on nccl with a GPU per rank, "
                 "else gloo", "lab.suite.exercises.backends", backends.check_backends),
        Exercise("cross-vpc", "(the cross-VPC lab) MASTER_ADDR external: the store connects, the mesh "
                 "hangs; diagnosed, then passes with peering", "lab.suite.exercises.cross_vpc",
                 basics.check_cross_vpc, "env", min_ranks=2, in_all=False),
    ]
    return {e.name: e for e in items}


EXERCISES: dict[str, Exercise] = _exercises()


def select(names: list[str]) -> list[Exercise]:
    """The exercises named (``all`` for every one), in suite order, each once.

    Raises KeyError with the first unknown name.
    """
    wanted = {e.name for e in EXERCISES.values() if e.in_all} if "all" in names else set()
    wanted |= {n for n in names if n != "all"}
    unknown = [n for n in names if n != "all" and n not in EXERCISES]
    if unknown:
        raise KeyError(unknown[0])
    return [e for e in EXERCISES.values() if e.name in wanted]
