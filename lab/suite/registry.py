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

``writes`` names the functions a student writes: a ``--solution`` without ``run()`` must define
every one (the reference's ``run`` drives them), and what each one sends is recorded apart. With
``writes_some`` (the bench, which times whichever rings a solution writes) a solution is only ever
those functions: it may define some of them, and a ``run()`` of its own is not used.

``method`` (:mod:`lab.suite.method`) is what the exercise's ranks may and must call, where the
exercise is about the method and not only the values:

* ``p2p``, ``ring-allreduce``: point-to-point calls only (send, recv, isend, irecv,
  batch_isend_irecv, the ``*_object_list`` sends), and ``barrier``, which moves no data; the
  ring's bytes are judged too (:func:`lab.suite.checks.ring.check_ring_traffic`);
* ``p2p-async``: the same, and every rank makes a non-blocking call (isend, irecv or
  batch_isend_irecv);
* the collectives (``broadcast`` ... ``barrier``): every rank calls the collective the exercise
  practises (a rank that computes the expected values itself fails); anything else is allowed,
  e.g. the reference's workarounds where a backend lacks the op;
* the others (process creation, groups, init methods, dsgd, backends): no rule.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from lab.suite.check import PartVerdict, Results, Verdict, World
from lab.suite.checks import backends, basics, bench, collectives, dsgd, p2p, ring
from lab.suite.exercises import ring_cases
from lab.suite.method import (
    Calls,
    Method,
    check_carried,
    check_method,
    combine,
    nonblocking,
    point_to_point,
    read_summaries,
    scoped_calls,
    unwritten,
    uses,
)

# Who forms the process group: nobody, the lab (one group every shared exercise reuses), or the
# program itself with that init method.
Rendezvous = Literal["none", "shared", "env", "tcp", "file"]
Checker = Callable[[Results, World], Verdict]
PartChecker = Callable[[Results, World, str], Verdict]

@dataclass(frozen=True)
class Exercise:
    name: str
    summary: str
    program: str  # dotted module of the reference rank program; it defines run(...)
    check: Checker
    rendezvous: Rendezvous = "shared"
    min_ranks: int = 1
    in_all: bool = True  # part of `run all`
    writes: tuple[str, ...] = ()  # the functions a student writes (a solution without run() defines all)
    writes_some: bool = False  # a solution is some of ``writes``, never a whole program (the bench's rings)
    method: Method | None = None  # the calls its ranks may and must make (None: any)
    check_part: PartChecker | None = None  # one of several parts' values alone (see ``parts``)
    # random values the controller draws for each rank of a run (lab.core.random_inputs): run()'s ``inputs``
    drawn: int = 0

    @property
    def parts(self) -> tuple[str, ...]:
        """The functions a student writes, each graded as a part of its own (partial credit)."""
        return () if self.writes_some else self.writes

    def judge(self, results: Results, summaries: Mapping[int, Any], world: World, part: str | None = None) -> Verdict:
        """The values (``check``) and the method (the calls each rank made) together, and each part's
        verdict: a part passes when its own values and calls do and it is the student's (a function
        the solution took from the reference, or lacks, is not). With ``part``, that part alone. Where the run
        measured its connections, more bytes carried than the records account for fails every part. ``summaries``:
        each rank's calls summary as it came (untrusted), read here once."""
        calls = read_summaries(summaries)
        carried = check_carried(self.name, self.method, calls, world)  # (the whole run's: every part's evidence)
        if part is not None:
            verdict = combine(self._part(part, results, calls, world), carried)
            return replace(verdict, parts=(PartVerdict(part, verdict.passed, verdict.reason),))
        verdict = combine(combine(self.check(results, world), check_method(self.name, self.method, calls, world)),
                          carried)
        parts = tuple(PartVerdict(p, (v := combine(self._part(p, results, calls, world), carried)).passed, v.reason)
                      for p in self.parts)
        failed = [p for p in parts if not p.passed]
        reason = verdict.reason if not verdict.passed else "; ".join(p.reason for p in failed)
        return replace(verdict, passed=verdict.passed and not failed, reason=reason, parts=parts)

    def _part(self, part: str, results: Results, calls: Calls, world: World) -> Verdict:
        if part not in self.parts:
            raise ValueError(f"{self.name} has no part {part!r}")
        not_written = unwritten(calls, world, part)
        if not_written:
            return Verdict(False, f"{part}(): {not_written}")
        values = self.check(results, world) if len(self.parts) == 1 or self.check_part is None else \
            self.check_part(results, world, part)
        verdict = combine(values, check_method(self.name, self.method, scoped_calls(calls, part), world))
        return replace(verdict, reason=f"{part}(): {verdict.reason}" if verdict.reason else "")


def _exercises() -> dict[str, Exercise]:
    items = [
        Exercise("processes", "torch.multiprocessing: Process + join, then mp.spawn; each child reports once",
                 "lab.suite.exercises.processes", basics.check_processes, "none"),
        Exercise("launchers", "RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE as the launcher sets them "
                 "(--launcher lab, torchrun, spawn, srun or srun-torchrun)", "lab.suite.exercises.launchers",
                 basics.check_launchers),
        Exercise("groups", "init_process_group, get_rank/get_world_size, new_group of a subset",
                 "lab.suite.exercises.groups", basics.check_groups),
        Exercise("init-env", "init_method='env://': MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE",
                 "lab.suite.exercises.init_env", basics.check_init, "env"),
        Exercise("init-tcp", "init_method='tcp://ADDR:PORT' with explicit rank and world_size",
                 "lab.suite.exercises.init_tcp", basics.check_init, "tcp"),
        Exercise("init-file", "init_method='file:///PATH' on a path every rank shares",
                 "lab.suite.exercises.init_file", basics.check_init, "file"),
        Exercise("p2p", "blocking send/recv: 0 -> 1, then a pass around the ring",
                 "lab.suite.exercises.p2p", p2p.check_p2p, min_ranks=2, method=point_to_point()),
        Exercise("p2p-async", "non-blocking isend/irecv and wait()",
                 "lab.suite.exercises.p2p_async", p2p.check_p2p_async, min_ranks=2, method=nonblocking()),
        Exercise("broadcast", "broadcast from rank 0 (and from the last rank)",
                 "lab.suite.exercises.broadcast", collectives.check_broadcast,
                 method=uses("broadcast", "ProcessGroup.broadcast")),
        Exercise("reduce", "reduce to rank 0 with SUM, PRODUCT, MAX, MIN",
                 "lab.suite.exercises.reduce", collectives.check_reduce, method=uses("reduce", "ProcessGroup.reduce")),
        Exercise("all-reduce", "all_reduce with SUM, PRODUCT, MAX, MIN",
                 "lab.suite.exercises.all_reduce", collectives.check_all_reduce,
                 method=uses("all_reduce", "ProcessGroup.allreduce")),
        Exercise("scatter", "scatter a list of tensors from rank 0",
                 "lab.suite.exercises.scatter", collectives.check_scatter,
                 method=uses("scatter", "ProcessGroup.scatter")),
        Exercise("gather", "gather every rank's tensor on rank 0",
                 "lab.suite.exercises.gather", collectives.check_gather, method=uses("gather", "ProcessGroup.gather")),
        Exercise("all-gather", "all_gather every rank's tensor on every rank",
                 "lab.suite.exercises.all_gather", collectives.check_all_gather,
                 method=uses("all_gather", "all_gather_into_tensor", "ProcessGroup.allgather")),
        Exercise("reduce-scatter", "reduce_scatter of [1,10,100,1000]*rank (the tutorial's example)",
                 "lab.suite.exercises.reduce_scatter", collectives.check_reduce_scatter,
                 method=uses("reduce_scatter", "reduce_scatter_tensor", "ProcessGroup.reduce_scatter")),
        Exercise("barrier", "barrier: no rank leaves before the last one arrives",
                 "lab.suite.exercises.barrier", collectives.check_barrier,
                 method=uses("barrier", "monitored_barrier", "ProcessGroup.barrier")),
        Exercise("ring-allreduce", "ring all-reduce from isend/recv: the tutorial's, then chunked "
                 "(reduce-scatter + all-gather)", "lab.suite.exercises.ring_allreduce", ring.check_ring_allreduce,
                 min_ranks=2, writes=("allreduce", "ring_allreduce"),
                 method=point_to_point(ring.check_ring_traffic, ring.ring_budget), check_part=ring.check_ring_part,
                 drawn=ring_cases.DRAWN),
        Exercise("dsgd", "distributed synchronous SGD: average_gradients with all_reduce, vs one "
                 "process and DistributedDataParallel", "lab.suite.exercises.dsgd", dsgd.check_dsgd,
                 writes=("average_gradients",)),
        Exercise("backends", "which backends each host has; collectives on nccl with a GPU per rank, "
                 "else gloo", "lab.suite.exercises.backends", backends.check_backends),
        Exercise("cross-vpc", "(the cross-VPC lab) MASTER_ADDR external: the store connects, the mesh "
                 "hangs; diagnosed, then passes with peering", "lab.suite.exercises.cross_vpc",
                 basics.check_cross_vpc, "env", min_ranks=2, in_all=False),
        Exercise("bench", "(python -m lab bench) the collectives and p2p timed on each size, every result "
                 "checked", "lab.suite.exercises.bench", bench.check_bench, min_ranks=2, in_all=False,
                 writes=("allreduce", "ring_allreduce"), writes_some=True,
                 method=Method("times rings built from point-to-point calls", traffic=bench.check_ring_calls)),
    ]
    return {e.name: e for e in items}


EXERCISES: dict[str, Exercise] = _exercises()


def select(names: list[str]) -> list[Exercise]:
    """The exercises named, in the order given (``all``: every one of the suite's, in its order,
    where it stands), each once.

    Raises KeyError with the first unknown name.
    """
    unknown = [n for n in names if n != "all" and n not in EXERCISES]
    if unknown:
        raise KeyError(unknown[0])
    chosen: dict[str, Exercise] = {}
    for name in names:
        for exercise in [e for e in EXERCISES.values() if e.in_all] if name == "all" else [EXERCISES[name]]:
            chosen.setdefault(exercise.name, exercise)
    return list(chosen.values())
