"""Checker of the ring all-reduce: the tutorial's ``allreduce(send, recv)`` and the chunked
``ring_allreduce(tensor)``, on every case of :mod:`lab.checks.ring_cases`.

The expected SUM at each position comes from the input formula, summed over the ranks in
plain Python. Every value is an integer exact in every dtype, so results compare exactly.
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from lab.suite.check import Expect, Results, Verdict, World
from lab.suite.checks import reported
from lab.suite.checks.ring_cases import (
    DTYPES,
    SHAPES,
    case_name,
    expected_digest,
    expected_value,
)

FUNCTIONS = {"allreduce": "allreduce(send, recv)", "ring_allreduce": "ring_allreduce(tensor)"}
SHOW = 6  # wrong positions named in a reason


@cache
def _expected(shape: tuple[int, ...], world_size: int) -> dict[str, Any]:
    return expected_digest(shape, world_size)


def check_ring_allreduce(results: Results, world: World) -> Verdict:
    """Every rank holds, for each case and each function, the SUM over the ranks' inputs."""
    e = Expect()
    n = world.world_size
    for rank, result in reported(e, results, world).items():
        for function, label in FUNCTIONS.items():
            cases: Any = result.get(function)  # untrusted: checked below
            if not e.true(rank, f"{label} results", isinstance(cases, Mapping),
                          expected="a dict of case -> result", got=cases):
                continue
            for shape in SHAPES:
                for dtype in DTYPES:
                    name = case_name(shape, dtype)
                    _check_case(e, rank, f"{label}, {name}", shape, dtype, n, cases.get(name))
    return e.verdict()


def _check_case(e: Expect, rank: int, what: str, shape: tuple[int, ...], dtype: str, n: int, got: Any) -> None:
    if not e.true(rank, what, isinstance(got, Mapping), expected="a result", got=got):
        return
    if not (e.equal(rank, f"{what}: shape", list(shape), got.get("shape"))
            & e.equal(rank, f"{what}: dtype", dtype, got.get("dtype"))):
        return
    want = _expected(shape, n)
    as_dtype = float if dtype.startswith("float") else int  # show 55000.0 for a float tensor
    if "values" in want:
        values = got.get("values")
        if not e.true(rank, f"{what}: values", isinstance(values, list) and len(values) == len(want["values"]),
                      expected=f"a list of {len(want['values'])}", got=values):
            return
        _positions(e, rank, what, [(i, as_dtype(w), g) for i, (w, g) in enumerate(zip(want["values"], values))],
                   len(shape) > 1)
        return
    samples = got.get("samples")
    if not e.true(rank, f"{what}: samples", _are_samples(samples, want["samples"]),
                  expected=f"[position, value] at {[p for p, _ in want['samples']][:8]}...", got=samples):
        return
    wrong = _positions(e, rank, what, [(p, as_dtype(expected_value(n, p)), v) for p, v in samples], len(shape) > 1)
    if not wrong:  # the samples were right: the sums tell whether something between them was not
        e.equal(rank, f"{what}: sum of all {want['numel']} values", as_dtype(want["sum"]), got.get("sum"), tol=0)
        e.equal(rank, f"{what}: weighted sum (position i weighs i % 13 + 1)", as_dtype(want["weighted"]),
                got.get("weighted"), tol=0)


def _positions(e: Expect, rank: int, what: str, triples: list[tuple[int, Any, Any]], flattened: bool) -> bool:
    """One mismatch naming the wrong positions (the first few, in the flattened tensor),
    expected vs got; True if any."""
    wrong = [(i, w, g) for i, w, g in triples if not _same(w, g)]
    if wrong:
        shown = wrong[:SHOW]
        more = f" (of {len(wrong)} wrong)" if len(wrong) > SHOW else ""
        e.equal(rank, f"{what}: positions{' (flattened)' if flattened else ''} {[i for i, _, _ in shown]}{more}",
                [w for _, w, _ in shown], [g for _, _, g in shown], tol=0)
    return bool(wrong)


def _same(want: float, got: Any) -> bool:
    return isinstance(got, (int, float)) and not isinstance(got, bool) and got == want


def _are_samples(samples: Any, want: list[list[int]]) -> bool:
    return (isinstance(samples, list) and len(samples) == len(want)
            and all(isinstance(s, list) and len(s) == 2 and s[0] == p for s, (p, _) in zip(samples, want)))
