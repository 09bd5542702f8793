"""Checker of the ring all-reduce: the tutorial's ``allreduce(send, recv)`` and the chunked
``ring_allreduce(tensor)``, on every case of :mod:`lab.suite.exercises.ring_cases`.

The expected SUM at each position is the sum of the values drawn for every rank of the run
(``World.inputs``), in plain Python. Every value is an integer exact in every dtype, so results
compare exactly.

:func:`check_ring_traffic` judges the bytes each rank sent inside each function (recorded by
the rank, see :mod:`lab.suite.method`), per byte of the tensor it was given: the tutorial's
ring passes n - 1 whole tensors (a note says so); the chunked ring, the bandwidth-optimal
homework, 2(n-1)/n. A ``ring_allreduce`` above :data:`NOT_OPTIMAL` times that fails: it is not
the homework's ring (whole tensors passed n - 1 times are n/2 times the optimal: 1.5x with 3
ranks; with 2 ranks both send one tensor, so they cannot be told apart). Between
:data:`OPTIMAL_SLACK` and that, a note says it sends more than the optimal.

Where ``lab grade`` measures what the connections carried (outside the ranks), :func:`ring_budget`
bounds it without a rank's word: an all-reduce of n tensors moves at least 2(n-1) of them over all
ranks (each value must reach a sum, and the sums every rank), whatever the algorithm; the tutorial's
ring whole tensors to each of the n-1 others, n(n-1), at most; the chunked ring at most
:data:`NOT_OPTIMAL` times its 2(n-1); and gloo's headers and the lab's own traffic beside them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache, partial
from typing import Any

from lab.suite.check import Expect, Mismatch, Results, Verdict, World, ranks_named
from lab.suite.checks import reported
from lab.suite.exercises import ring_cases
from lab.suite.exercises.ring_cases import DRAWN, DTYPES, case_name, digest, numel, starts
from lab.suite.method import CARRIED_SLACK, Calls, Recorded, WireBudget, function_summary, lab_overhead

FUNCTIONS = {"allreduce": "allreduce(send, recv)", "ring_allreduce": "ring_allreduce(tensor)"}
SHOW = 6  # wrong positions named in a reason
INPUTS_SHOWN = 4  # ranks whose inputs at the wrong positions a reason shows
OPTIMAL_SLACK = 1.05  # up to this times 2(n-1)/n is bandwidth-optimal (chunks of unequal size)
NOT_OPTIMAL = 1.25  # ring_allreduce fails above this times 2(n-1)/n
MESSAGES_SLACK = 4  # a function may send its tensors in up to this many times the chunked ring's messages


Draws = tuple[tuple[int, ...], ...]  # each rank's drawn values, by rank
Cases = dict[tuple[int, ...], tuple[list[int], dict[str, Any]]]  # shape -> its expected sums and their digest


def _draws(world: World) -> Draws:
    return tuple(tuple(world.inputs.get(rank, ())) for rank in range(world.world_size))


@lru_cache(maxsize=2)
def _expected(draws: Draws) -> dict[str, Cases] | None:
    """Each function's cases' expected sums and their digest, for one draw (None when the run did not
    draw each rank's: a run that was not the lab's): the judge checks the whole exercise, then each
    part, against the same draw, which is summed once."""
    if any(len(d) != DRAWN for d in draws):
        return None
    sums = [sum(column) for column in zip(*draws)]
    expected: dict[str, Cases] = {}
    for function in FUNCTIONS:
        cases = {shape: sums[start:start + numel(shape)] for shape, start in starts(function).items()}
        expected[function] = {shape: (values, digest(values, len(draws))) for shape, values in cases.items()}
    return expected


def check_ring_allreduce(results: Results, world: World, functions: tuple[str, ...] = tuple(FUNCTIONS)) -> Verdict:
    """Every rank holds, for each case and each of ``functions``, the SUM over the ranks' inputs."""
    draws = _draws(world)
    expected = _expected(draws)
    if expected is None:
        return Verdict(False, "no inputs were drawn for the ranks: nothing to check the sums against")
    e = Expect()
    for rank, result in reported(e, results, world).items():
        for function, label in FUNCTIONS.items():
            if function not in functions:
                continue
            cases: Any = result.get(function)  # untrusted: checked below
            if not e.true(rank, f"{label} results", isinstance(cases, Mapping),
                          expected="a dict of case -> result", got=cases):
                continue
            first = starts(function)
            for shape, want in expected[function].items():
                for dtype in DTYPES:
                    name = case_name(shape, dtype)
                    _check_case(e, rank, f"{label}, {name}", shape, dtype, want, cases.get(name),
                                partial(_inputs, draws, first[shape]))
    return e.verdict()


def _check_case(e: Expect, rank: int, what: str, shape: tuple[int, ...], dtype: str,
                expected: tuple[list[int], dict[str, Any]], got: Any, inputs: Inputs) -> None:
    """One case's result against the expected sums (``expected``: the values and their digest);
    ``inputs`` says what the ranks' inputs were at some of its positions."""
    if not e.true(rank, what, isinstance(got, Mapping), expected="a result", got=got):
        return
    if not (e.equal(rank, f"{what}: shape", list(shape), got.get("shape"))
            & e.equal(rank, f"{what}: dtype", dtype, got.get("dtype"))):
        return
    sums, want = expected
    as_dtype = float if dtype.startswith("float") else int  # show 55000.0 for a float tensor
    if "values" in want:
        values = got.get("values")
        if not e.true(rank, f"{what}: values", isinstance(values, list) and len(values) == len(want["values"]),
                      expected=f"a list of {len(want['values'])}", got=values):
            return
        _positions(e, rank, what, [(i, as_dtype(w), g) for i, (w, g) in enumerate(zip(want["values"], values))],
                   len(shape) > 1, inputs)
        return
    samples = got.get("samples")
    if not e.true(rank, f"{what}: samples", _are_samples(samples, want["samples"]),
                  expected=f"[position, value] at {[p for p, _ in want['samples']][:8]}...", got=samples):
        return
    wrong = _positions(e, rank, what, [(p, as_dtype(sums[p]), v) for p, v in samples], len(shape) > 1, inputs)
    if not wrong:  # the samples were right: the sums tell whether something between them was not
        e.equal(rank, f"{what}: sum of all {want['numel']} values", as_dtype(want["sum"]), got.get("sum"), tol=0)
        e.equal(rank, f"{what}: weighted sum (position i weighs i % 13 + 1)", as_dtype(want["weighted"]),
                got.get("weighted"), tol=0)


def _positions(e: Expect, rank: int, what: str, triples: list[tuple[int, Any, Any]], flattened: bool,
               inputs: Inputs) -> bool:
    """One mismatch naming the wrong positions (the first few, in the flattened tensor) and the
    ranks' inputs there, expected vs got; True if any."""
    wrong = [(i, w, g) for i, w, g in triples if not _same(w, g)]
    if wrong:
        shown = wrong[:SHOW]
        more = f" (of {len(wrong)} wrong)" if len(wrong) > SHOW else ""
        positions = [i for i, _, _ in shown]
        e.equal(rank, f"{what}: positions{' (flattened)' if flattened else ''} {positions}{more} "
                      f"({inputs(positions)})", [w for _, w, _ in shown], [g for _, _, g in shown], tol=0)
    return bool(wrong)


Inputs = Callable[[list[int]], str]  # what the ranks' inputs were at a case's positions


def _inputs(draws: Draws, start: int, positions: list[int]) -> str:
    """``the inputs there: rank 0 [5, -3]; rank 1 [...]`` (the first INPUTS_SHOWN ranks')."""
    shown = "; ".join(f"rank {r} {[d[start + p] for p in positions]}" for r, d in enumerate(draws[:INPUTS_SHOWN]))
    more = f"; and {len(draws) - INPUTS_SHOWN} more rank(s)" if len(draws) > INPUTS_SHOWN else ""
    return f"the inputs there: {shown}{more}"


def _same(want: float, got: Any) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and got == want


def _are_samples(samples: Any, want: list[list[int]]) -> bool:
    return (isinstance(samples, list) and len(samples) == len(want)
            and all(isinstance(s, list) and len(s) == 2 and s[0] == p for s, (p, _) in zip(samples, want)))


def check_ring_part(results: Results, world: World, part: str) -> Verdict:
    """One function's values alone (a part of the exercise: lab.suite.registry)."""
    return check_ring_allreduce(results, world, (part,))


def check_ring_traffic(calls: Calls, world: World) -> Verdict:
    """The bytes each rank sent inside each function, per byte of its tensor, and to whom: a note
    per function; a failure if ``ring_allreduce`` sent more than :data:`NOT_OPTIMAL` times the
    bandwidth-optimal 2(n-1)/n."""
    n = world.world_size
    optimal = 2 * (n - 1) / n
    notes: list[str] = []
    mismatches: list[Mismatch] = []
    reason = ""
    for function, label in FUNCTIONS.items():
        sent = {rank: f for rank in range(n) if (f := _traffic(calls.get(rank), function)) is not None}
        if not sent:
            continue
        ratios = {rank: sum(to.values()) / size for rank, (size, to, _) in sent.items()}
        times = sorted({count for _, _, count in sent.values()})
        low, high = min(ratios.values()), max(ratios.values())
        shown = f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}x to {high:.2f}x"
        where = _destinations({rank: to for rank, (_, to, _) in sent.items()}, n)
        if function == "allreduce":
            verdict = (f"the tutorial's ring: n-1 = {n - 1} whole tensors; the chunked ring sends "
                       f"2(n-1)/n = {optimal:.2f}x")
        elif high <= optimal * OPTIMAL_SLACK:
            verdict = f"bandwidth-optimal: 2(n-1)/n = {optimal:.2f}x"
        else:
            verdict = f"more than the bandwidth-optimal 2(n-1)/n = {optimal:.2f}x"
        over_calls = f" over {times[0]} calls" if len(times) == 1 else ""
        notes.append(f"{label}: each rank sent {shown} the bytes of its tensor{over_calls} ({verdict}), {where}")
        over = sorted(rank for rank, ratio in ratios.items() if ratio > optimal * NOT_OPTIMAL)
        if function == "ring_allreduce" and over:
            for rank in over:
                mismatches.append(Mismatch(rank, f"{label}: bytes sent per byte of the tensor",
                                           round(optimal, 2), round(ratios[rank], 2)))
            reason = (f"{label} is not bandwidth-optimal: {ranks_named(over)} sent up to {high:.2f}x the tensor, over "
                      f"{NOT_OPTIMAL:g}x the chunked ring's 2(n-1)/n = {optimal:.2f}x (the tutorial's ring "
                      f"sends n-1 = {n - 1}x): cut the tensor into n chunks, reduce-scatter them round the "
                      f"ring, then all-gather them")
    return Verdict(not mismatches, reason, tuple(mismatches), tuple(notes))


def _traffic(summary: Recorded | None, function: str) -> tuple[int, dict[int, int], int] | None:
    """(bytes of the tensors the function was given, bytes sent to each rank inside it, times it
    was called), from a rank's calls summary; None when it was not recorded (or sent nothing)."""
    f = function_summary(summary, function)
    if f is None or not f.tensor_bytes or f.sent is None:
        return None
    to = {int(dst): n for dst, n in f.sent.items() if dst.lstrip("-").isdigit()}
    return (f.tensor_bytes, to, f.calls) if to else None


def _destinations(sent: dict[int, dict[int, int]], n: int) -> str:
    """To whom each rank sent, and how many bytes: "to rank r+1 only: rank 0 2,265,728 B to 1, ..."."""
    ring = all(set(to) == {(rank + 1) % n} for rank, to in sent.items())
    each = "; ".join(f"rank {rank} " + ", ".join(f"{b:,} B to {dst}" for dst, b in sorted(to.items()))
                     for rank, to in sorted(sent.items()))
    return f"to rank r+1 only ({each})" if ring else f"not only to rank r+1 ({each})"


def ring_budget(world: World) -> WireBudget:
    """What the run's connections must and may carry over all its ranks, for both functions' cases
    (see the module): computed from the cases and the world size alone."""
    n, tensors = world.world_size, ring_cases.TENSOR_BYTES
    cases = len(ring_cases.SHAPES) * len(DTYPES)
    messages = MESSAGES_SLACK * 2 * (n - 1) * n * cases * len(FUNCTIONS)  # the chunked ring's: 2(n-1) a rank a case
    least = 2 * (n - 1) * tensors * len(FUNCTIONS)
    most = (n * (n - 1) * tensors + int(NOT_OPTIMAL * 2 * (n - 1) * tensors)) * (1 + CARRIED_SLACK)
    return WireBudget(least, f"2(n-1) = {2 * (n - 1)} times the {tensors:,} bytes of each function's tensors on "
                             f"a rank, for each of the {len(FUNCTIONS)} functions",
                      int(most) + lab_overhead(n, messages),
                      f"allreduce(): whole tensors to each of the n-1 others, n(n-1) = {n * (n - 1)} times the "
                      f"{tensors:,} bytes of a rank's; ring_allreduce(): {NOT_OPTIMAL:g} times 2(n-1) = "
                      f"{2 * (n - 1)} times them; and the headers and the lab's own")

