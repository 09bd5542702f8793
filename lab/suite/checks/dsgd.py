"""Checker of distributed synchronous SGD (its settings: lab.suite.exercises.dsgd_settings).

Each rank trains three copies of the same seeded model and reports, after every step, a
digest of the parameters (each tensor's sum, and the sum of squares of all of them):

* ``dsgd``: the tutorial's loop on the rank's partition, with ``average_gradients``;
* ``reference``: ONE process, no collective, training on the union of every rank's batch
  of the step (the rank computes it on its own, so it does not depend on the collective
  under test);
* ``ddp``: the same loop with ``torch.nn.parallel.DistributedDataParallel``.

Averaging the ranks' gradients of equal-sized batches is the gradient of the union, so all
three must agree: the same on every rank after every step, and equal (within float32
rounding) to one process. The checker compares; it never imports torch.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from lab.suite.check import Expect, Results, Verdict, World
from lab.suite.checks import is_number, reported
from lab.suite.exercises.dsgd_settings import (
    EPOCHS,
    PARAMETERS,
    batch_per_rank,
    samples_per_rank,
    steps_per_epoch,
)

SAME_TOLERANCE = 1e-5  # across ranks: the same reduction everywhere gives the same bits; allow summation order
REFERENCE_TOLERANCE = 1e-4  # against one process: float32 sums in another order, over a few dozen steps
MODELS = {"dsgd": "dsgd", "ddp": "DistributedDataParallel", "reference": "one process"}


def check_dsgd(results: Results, world: World) -> Verdict:
    """The same parameters on every rank after every step, equal to one process training on
    the full batch, and DistributedDataParallel's the same."""
    e = Expect()
    n = world.world_size
    bsz, steps = batch_per_rank(n), EPOCHS * steps_per_epoch(n)
    ranks: dict[int, Mapping[str, Any]] = {}
    for rank, result in reported(e, results, world).items():
        e.equal(rank, "batch per rank (global batch // world size)", bsz, result.get("batch_per_rank"))
        e.equal(rank, "samples in the rank's partition", samples_per_rank(n), result.get("samples_per_rank"))
        if _well_formed(e, rank, result, steps):
            ranks[rank] = result
    if not ranks:
        return e.verdict()
    first = min(ranks)
    names = ranks[first]["names"]
    for rank, result in ranks.items():  # the seeded init, and every model, the same on every rank
        if rank == first:
            continue
        e.equal(rank, f"initial parameters (as rank {first}'s: the same seed)", ranks[first]["initial"],
                result["initial"], tol=SAME_TOLERANCE)
        for model, label in MODELS.items():
            step = _compare_steps(e, rank, f"{label} parameters", f"as on rank {first}", names,
                                  ranks[first][model]["steps"], result[model]["steps"], SAME_TOLERANCE)
            if model == "dsgd" and step == 1:
                e.note("the ranks' parameters differ from the first step on: average_gradients did not "
                       "leave the same gradient on every rank")
    for rank, result in ranks.items():  # each against one process on the full batch
        reference = result["reference"]
        for model in ("dsgd", "ddp"):
            label = MODELS[model]
            _first_step(e, rank, label, n, result["initial"], reference["first"], result[model]["first"])
            _compare_steps(e, rank, f"{label} parameters", f"as one process on the batch of {bsz * n}", names,
                           reference["steps"], result[model]["steps"], REFERENCE_TOLERANCE)
            _compare_final(e, rank, label, names, result["sizes"], reference["final"], result[model]["final"])
    if len(ranks) == n:  # the ranks' mean loss of an epoch is one process's loss of the epoch
        for epoch in range(EPOCHS):
            mean = sum(r["dsgd"]["losses"][epoch] for r in ranks.values()) / n
            e.equal(None, f"dsgd loss of epoch {epoch}, the mean over the ranks (= one process's)",
                    ranks[first]["reference"]["losses"][epoch], mean, tol=REFERENCE_TOLERANCE)
    return e.verdict()


def _well_formed(e: Expect, rank: int, result: Mapping[str, Any], steps: int) -> bool:
    names, sizes = result.get("names"), result.get("sizes")
    ok = e.true(rank, "parameter names and sizes", isinstance(names, list) and isinstance(sizes, list)
                and len(names) == len(sizes) and all(isinstance(s, int) for s in sizes)
                and sum(sizes) == PARAMETERS, expected=f"lists naming {PARAMETERS} parameters", got=[names, sizes])
    ok &= e.true(rank, "initial parameters", _numbers(result.get("initial"), PARAMETERS),
                 expected=f"{PARAMETERS} numbers", got=result.get("initial"))
    for model, label in MODELS.items():
        report: Any = result.get(model)  # untrusted: checked below
        if not e.true(rank, f"{label}: report", isinstance(report, Mapping), expected="a dict", got=report):
            ok = False
            continue
        width = len(names) + 1 if isinstance(names, list) else 0
        got_steps = report.get("steps")
        ok &= e.true(rank, f"{label}: number of steps ({EPOCHS} epochs)", isinstance(got_steps, list)
                     and len(got_steps) == steps, expected=steps,
                     got=len(got_steps) if isinstance(got_steps, list) else got_steps)
        ok &= e.true(rank, f"{label}: parameter digest of every step", isinstance(got_steps, list)
                     and all(_numbers(s, width) for s in got_steps),
                     expected=f"lists of {width} numbers", got=(got_steps or [None])[0])
        ok &= e.true(rank, f"{label}: loss of every epoch", _numbers(report.get("losses"), EPOCHS),
                     expected=f"{EPOCHS} numbers", got=report.get("losses"))
        for which in ("first", "final"):
            ok &= e.true(rank, f"{label}: parameters after the {which} step", _numbers(report.get(which), PARAMETERS),
                         expected=f"{PARAMETERS} numbers", got=report.get(which))
    return ok


def _compare_steps(e: Expect, rank: int, what: str, like: str, names: list[str],
                   want: list[list[float]], got: list[list[float]], tol: float) -> int | None:
    """One mismatch at the first step where the digests differ; that step (from 1), if any."""
    labels = [f"{name} sum" for name in names] + ["sum of squares of all parameters"]
    per_epoch = len(want) // EPOCHS
    for step, (w, g) in enumerate(zip(want, got)):
        for label, a, b in zip(labels, w, g):
            if not math.isclose(a, b, rel_tol=tol, abs_tol=tol):
                e.equal(rank, f"{what} after step {step + 1} (epoch {step // per_epoch}, batch "
                        f"{step % per_epoch + 1}) {like}: {label}", a, b, tol=tol)
                return step + 1
    return None


def _first_step(e: Expect, rank: int, label: str, n: int, initial: list[float], want: list[float],
                got: list[float]) -> None:
    """The first update as a multiple of one process's: n means the gradients were summed."""
    d_want = [w - i for w, i in zip(want, initial)]
    d_got = [g - i for g, i in zip(got, initial)]
    norm = sum(d * d for d in d_want)
    if norm == 0:
        return
    ratio = sum(a * b for a, b in zip(d_got, d_want)) / norm
    if not e.equal(rank, f"{label}'s first step, in units of one process's step on the full batch", 1.0,
                   round(ratio, 4), tol=1e-3) and n > 1 and abs(ratio - n) < 0.01 * n:
        e.note(f"the first step was {n}x one process's: the gradients were summed over the {n} ranks "
               f"but not divided by the world size")


def _compare_final(e: Expect, rank: int, label: str, names: list[str], sizes: list[int], want: list[float],
                   got: list[float]) -> None:
    wrong = [i for i, (w, g) in enumerate(zip(want, got))
             if not math.isclose(w, g, rel_tol=REFERENCE_TOLERANCE, abs_tol=REFERENCE_TOLERANCE)]
    if wrong:
        i = wrong[0]
        e.equal(rank, f"{label} parameters after training as one process's: {_where(i, names, sizes)} "
                f"({len(wrong)} of {len(want)} differ)", want[i], got[i], tol=REFERENCE_TOLERANCE)


def _where(index: int, names: list[str], sizes: list[int]) -> str:
    for name, size in zip(names, sizes):
        if index < size:
            return f"{name}[{index}] (flattened)"
        index -= size
    return f"[{index}]"


def _numbers(value: Any, count: int) -> bool:
    return isinstance(value, list) and len(value) == count and all(is_number(v) for v in value)
