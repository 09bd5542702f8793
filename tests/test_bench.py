"""`lab bench`: the settings, the rows as nccl-tests prints them, the checker; and a real bench of
every op on a local cluster."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from PIL import Image

from lab.errors import UsageError
from lab.jobs import bench
from lab.suite.check import World
from lab.suite.checks.bench import check_bench, check_ring_calls
from lab.suite.method import read_summaries

from .conftest import REPO, Lab

SOLUTIONS, WRONG = REPO / "tests" / "solutions", REPO / "tests" / "wrong"


def test_sizes_ops_and_bus_factors() -> None:
    assert bench.parse_sizes("8,1K,64k,1M,1G") == [8, 1024, 65536, 1 << 20, 1 << 30]
    for bad in ("3X", "2", "2G", ""):
        with pytest.raises(UsageError, match="--sizes"):
            bench.parse_sizes(bad)
    assert bench.parse_ops("all") == list(bench.OPS) and bench.parse_ops("p2p,reduce") == ["p2p", "reduce"]
    with pytest.raises(UsageError, match="unknown alltoall"):
        bench.parse_ops("all_reduce,alltoall")
    assert [bench.bus_factor(op, 4) for op in bench.OPS] == [1.5, 0.75, 0.75, 1.0, 1.0, 1.0]
    assert bench.parse_ops("ring,p2p,ring") == ["ring", "p2p"] and bench.bus_factor("chunked_ring", 4) == 1.5


def test_a_solutions_rings_are_read_from_its_text_and_added_to_the_ops(tmp_path: Path) -> None:
    assert bench.solution_rings(SOLUTIONS / "ring_allreduce_only.py") == ["chunked_ring"]
    assert bench.solution_rings(WRONG / "ring_drops_remainder.py") == ["ring", "chunked_ring"]  # (one imported)
    assert bench.solution_ops(["all_reduce", "broadcast"], ["ring"], chosen=False) == ["all_reduce", "p2p", "ring"]
    assert bench.solution_ops(["broadcast", "ring"], ["ring"], chosen=True) == ["broadcast", "ring"]
    broken, neither = tmp_path / "broken.py", tmp_path / "neither.py"
    broken.write_text("import torch\n\ndef ring_allreduce(tensor)\n    pass\n")
    neither.write_text("def run():\n    raise SystemExit('never run here')\n")
    with pytest.raises(UsageError, match=rf"^--solution {broken}:3: expected ':'$"):
        bench.solution_rings(broken)
    with pytest.raises(UsageError, match="defines neither allreduce"):
        bench.solution_rings(neither)
    nested = tmp_path / "nested.py"
    nested.write_text("x = " + "1+" * 200_000 + "1\n")
    with pytest.raises(UsageError, match=rf"^--solution {nested}: too deeply nested to read$"):
        bench.solution_rings(nested)


def test_a_ring_that_calls_a_collective_fails_and_an_honest_ones_bytes_are_noted() -> None:
    world = World(2, "gloo", ("a", "b"), (0, 1))

    def calls(counts: dict[str, int]) -> dict[str, object]:
        return {"counts": counts, "functions": {"ring_allreduce": {
            "calls": 3, "tensor_bytes": 3000, "counts": counts, "sent": {"1": 1500} if "isend" in counts else {}}}}

    cheat = check_ring_calls(read_summaries({0: calls({"all_reduce": 3}), 1: calls({"all_reduce": 3})}), world)
    assert not cheat.passed and cheat.reason.startswith("ring_allreduce(tensor) called all_reduce on ranks 0, 1: "
                                                         "its time is gloo's")
    honest = check_ring_calls(read_summaries({0: calls({"isend": 3, "recv": 3}), 1: calls({"isend": 3, "recv": 3})}),
                              world)
    assert honest.passed and any("0.50x the bytes of its tensor" in n for n in honest.notes), honest.notes


def test_the_controller_and_the_ranks_name_the_settings_alike() -> None:
    program = REPO / "lab" / "suite" / "exercises" / "bench.py"  # (it imports torch: read, not imported)
    assert f'SETTINGS_VAR = "{bench.SETTINGS_VAR}"' in program.read_text()
    assert json.loads(bench.rank_env(["p2p"], [8], 3, 1)[bench.SETTINGS_VAR]) == {
        "ops": ["p2p"], "sizes": [8], "iters": 3, "warmup": 1}
    with pytest.raises(UsageError, match="--iters"):
        bench.rank_env(["p2p"], [8], 0, 1)


def row(op: str, seconds: float, wrong: int = 0) -> dict[str, object]:
    return {"op": op, "count": 1024, "bytes": 4096, "seconds": seconds, "wrong": wrong}


def test_a_rows_time_is_the_slowest_ranks_and_busbw_scales_algbw() -> None:
    results = {0: {"rows": [row("all_reduce", 0.001), row("p2p", 0.002)]},
               1: {"rows": [row("all_reduce", 0.004, wrong=3), row("p2p", 0.001)]}}
    reduce_row, p2p_row = bench.rows(results, 2)
    assert (reduce_row.seconds, reduce_row.wrong, p2p_row.seconds) == (0.004, 3, 0.002)
    assert reduce_row.algbw == pytest.approx(4096 / 0.004 / 1e9)
    assert reduce_row.busbw == pytest.approx(reduce_row.algbw * 2 * (2 - 1) / 2)
    assert reduce_row.to_json()["redop"] == "sum" and p2p_row.to_json()["redop"] == "none"


def test_the_checker_fails_a_wrong_result_and_notes_an_op_the_backend_lacks() -> None:
    world = World(2, "gloo", ("a", "a"), (0, 1))
    wrong = check_bench({0: {"rows": [row("all_reduce", 0.001)]}, 1: {"rows": [row("all_reduce", 0.001, wrong=7)]}},
                        world)
    assert not wrong.passed and "rank 1: #wrong of all_reduce on 4096 bytes: expected 0, got 7" in wrong.reason
    lacking = {"op": "reduce_scatter", "count": 1024, "bytes": 4096, "unsupported": "gloo does not support it"}
    tcp = {"hosts": ["a", "a"], "rtt": 1e-5, "bytes": 10, "seconds": 1.0}
    noted = check_bench({0: {"rows": [lacking]}, 1: {"rows": [lacking], "tcp": tcp}}, world)
    assert noted.passed and any("reduce_scatter is not supported here" in n for n in noted.notes)
    assert not check_bench({0: {"rows": "no"}, 1: {"rows": []}}, world).passed


def p2p(nbytes: int, seconds: float) -> bench.Row:
    return bench.Row("p2p", nbytes, nbytes // 4, seconds, 0, 4)


def test_the_alpha_beta_fit_recovers_a_line_and_predicts_both_rings() -> None:
    alpha, beta = 50e-6, 1e-9  # 50 us, 1 GB/s
    fitted = bench.fit([p2p(size, alpha + size * beta) for size in (8, 1024, 1 << 16, 1 << 20, 1 << 24)])
    assert fitted is not None
    assert (fitted.alpha, fitted.beta) == (pytest.approx(alpha), pytest.approx(beta))
    assert fitted.ring(1 << 20, 4) == pytest.approx(3 * (alpha + (1 << 20) * beta))
    assert fitted.chunked_ring(1 << 20, 4) == pytest.approx(6 * (alpha + (1 << 18) * beta))
    crossover = fitted.crossover(4)
    assert crossover == pytest.approx(100_000)  # alpha / (beta / 2): where the two rings take as long
    assert fitted.ring(int(crossover), 4) == pytest.approx(fitted.chunked_ring(int(crossover), 4), rel=1e-4)
    assert fitted.crossover(2) is None  # with two ranks the chunked ring only adds messages
    assert bench.fit([p2p(8, 1e-3), p2p(8, 2e-3)]) is None  # one size fits no line


def test_the_tcp_baseline_is_one_ranks_and_checked() -> None:
    world = World(2, "gloo", ("a", "b"), (0, 1))
    tcp = {"hosts": ["a", "b"], "rtt": 1e-4, "bytes": 2_000_000_000, "seconds": 1.0}
    results = {0: {"rows": [row("p2p", 0.001)]}, 1: {"rows": [row("p2p", 0.001)], "tcp": tcp}}
    assert check_bench(results, world).passed
    assert bench.baseline(results) == bench.Baseline(("a", "b"), 1e-4, 2_000_000_000, 1.0)
    assert bench.baseline(results).gbs == 2.0  # type: ignore[union-attr]
    missing = check_bench({0: {"rows": [row("p2p", 0.001)]}, 1: {"rows": [row("p2p", 0.001)]}}, world)
    assert not missing.passed and "the TCP baseline" in missing.reason
    broken = {**results, 1: {"rows": [row("p2p", 0.001)], "tcp": {**tcp, "seconds": 0}}}
    assert not check_bench(broken, world).passed


@pytest.mark.local
def test_bench_times_and_checks_every_op_on_a_local_cluster(lab: Lab, tmp_path: Path) -> None:
    table, picture = tmp_path / "bench.csv", tmp_path / "bench.png"
    result = lab("bench", "--nproc", "3", "--sizes", "8,64K", "--iters", "2", "--json", "--csv", str(table),
                 "--plot", str(picture))
    assert result.code == 0, result.text[-3000:]
    report = json.loads(result.out)
    written = list(csv.DictReader(table.open()))
    assert [(r["op"], int(r["bytes"]), float(r["busbw_gbs"]), float(r["tcp_gbs"])) for r in written] == [
        (r["op"], r["bytes"], pytest.approx(r["busbw_gbs"]), pytest.approx(report["tcp"]["gbs"]))
        for r in report["rows"]]
    with Image.open(picture) as image:  # (Pillow: matplotlib's own dependency)
        assert image.format == "PNG" and image.size[0] > 400 and len(image.getcolors(maxcolors=1 << 16) or ()) > 10
    assert report["ranks"] == 3
    assert report["tcp"]["gbs"] > 0 and report["tcp"]["rtt_us"] > 0  # (ranks on one machine: loopback)
    assert report["fit"]["alpha_us"] >= 0 and report["fit"]["beta_ns_per_byte"] >= 0
    rows = report["rows"]
    assert [(r["op"], r["bytes"]) for r in rows] == [(op, size) for op in bench.OPS for size in (12, 65532)]
    for r in rows:  # (sizes are whole elements, a multiple of the ranks: as nccl-tests rounds them)
        assert r["wrong"] == 0 and r["time_us"] > 0, r
        assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * bench.bus_factor(r["op"], 3))
    nowhere = lab("bench", "--nproc", "2", "--plot", str(tmp_path / "no" / "such.png"))
    assert (nowhere.code, nowhere.err.strip()) == (2, f"lab: error: --plot {tmp_path / 'no' / 'such.png'}: no such "
                                                      f"directory")
    table = lab("bench", "--nproc", "2", "--ops", "all_reduce", "--sizes", "1K", "--iters", "1")
    assert table.code == 0 and "busbw" in table.out and "all_reduce" in table.out and "1024" in table.out
    assert "raw TCP" in table.out and "of tcp" in table.out and "p2p fit" not in table.out  # (no p2p sweep)


@pytest.mark.local
def test_bench_times_a_students_ring_beside_gloos_and_holds_it_to_the_method(lab: Lab, tmp_path: Path) -> None:
    args = ("bench", "--nproc", "3", "--sizes", "12,48K", "--iters", "2")
    result = lab(*args, "--json", "--solution", str(SOLUTIONS / "ring_allreduce_only.py"))
    assert result.code == 0, result.text[-3000:]
    report = json.loads(result.out)
    assert [(r["op"], r["bytes"]) for r in report["rows"]] == [
        (op, size) for op in ("all_reduce", "p2p", "chunked_ring") for size in (12, 49152)]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in report["rows"])
    assert any(n.startswith("ring_allreduce(tensor): each rank sent 1.33x") for n in report["notes"]), report["notes"]
    cheat = lab(*args, "--solution", str(WRONG / "ring_calls_all_reduce.py"))
    assert cheat.code == 1 and "allreduce(send, recv) called all_reduce on ranks 0, 1, 2: its time is gloo's" \
        in cheat.out, cheat.text[-3000:]
    lazy = tmp_path / "lazy.py"  # passes each tensor on, never adding it: wrong sums, counted
    lazy.write_text("import torch.distributed as dist\n\n\ndef allreduce(send, recv):\n"
                    "    rank, size = dist.get_rank(), dist.get_world_size()\n"
                    "    request = dist.isend(send, (rank + 1) % size)\n"
                    "    dist.recv(recv, (rank - 1) % size)\n    request.wait()\n")
    wrong = lab(*args, "--ops", "ring", "--solution", str(lazy))
    assert wrong.code == 1 and "#wrong of ring on 12 bytes: expected 0, got 3" in wrong.out, wrong.text[-3000:]
    neither = lab(*args, "--solution", str(REPO / "tests" / "solutions" / "nothing_to_grade.py"))
    assert (neither.code, len(neither.err.strip().splitlines())) == (2, 1), neither.text
