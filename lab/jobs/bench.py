"""``lab bench``: the settings the ranks measure with, and their rows as nccl-tests prints them.

The ranks time every op and size and check each result (``lab.suite.exercises.bench``); here each
op's time is the slowest rank's (a collective ends when its last rank does), algbw is the bytes
over that time, and busbw scales it by nccl-tests' factor for the op, so that it compares with the
link's own speed whatever the number of ranks: 2(n-1)/n for all_reduce, (n-1)/n for all_gather and
reduce_scatter, 1 for broadcast, reduce and p2p.

Beside them: the link's own speed (raw TCP between two of the hosts, measured by the ranks in the
same run), and the alpha-beta model fitted to the p2p sweep (a message of S bytes takes
alpha + S*beta), with what it predicts for the two rings of the exercises: the tutorial's, which
passes the whole tensor n-1 times, (n-1)(alpha + S*beta), and the chunked one, 2(n-1)(alpha + S*beta/n):
more messages, fewer bytes each, so it wins above S = alpha / (beta (1 - 2/n)).

The two rings themselves can be timed too (ops ``ring`` and ``chunked_ring``): the exercise's, or
a student's ``allreduce`` and ``ring_allreduce`` (``--solution``), beside gloo's all_reduce; they
are all-reduces, so their busbw has its factor.
"""
from __future__ import annotations

import ast
import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab.errors import UsageError
from lab.suite.checks.bench import rows_of, tcp_of

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "p2p")  # --ops all
RINGS = {"allreduce": "ring", "ring_allreduce": "chunked_ring"}  # a solution's function -> its op
REDOPS = {"all_reduce": "sum", "reduce_scatter": "sum", "reduce": "sum", "ring": "sum", "chunked_ring": "sum"}
DEFAULT_SIZES = "8,1K,64K,1M,16M"
SETTINGS_VAR = "LAB_BENCH"  # = lab.suite.exercises.bench.SETTINGS_VAR
_SIZE = re.compile(r"(\d+)([KMG]?)", re.I)
SIZE_MAX = 1 << 30  # bytes: a bigger buffer per rank is a mistake, not a benchmark


def bus_factor(op: str, ranks: int) -> float:
    if op in ("all_reduce", *RINGS.values()):
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0


def parse_sizes(text: str) -> list[int]:
    """``8,1K,1M``: bytes (K, M, G: powers of 1024)."""
    sizes = []
    for part in text.split(","):
        found = _SIZE.fullmatch(part.strip())
        if found is None:
            raise UsageError(f"--sizes: {part.strip()!r} is not a size (a number of bytes, with K, M or G)")
        size = int(found[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[found[2].upper()]
        if not 4 <= size <= SIZE_MAX:
            raise UsageError(f"--sizes: {part.strip()} is not between 4 bytes and 1G")
        sizes.append(size)
    return sizes


def parse_ops(text: str) -> list[str]:
    ops = [op.strip() for op in text.split(",")] if text != "all" else list(OPS)
    unknown = [op for op in ops if op not in (*OPS, *RINGS.values())]
    if unknown:
        raise UsageError(f"--ops: unknown {', '.join(unknown)}; the ops are {', '.join(OPS)} (or all), "
                         f"and {', '.join(RINGS.values())}")
    return list(dict.fromkeys(ops))


def solution_rings(path: Path) -> list[str]:
    """The ring ops a ``--solution`` file writes: those of ``allreduce`` and ``ring_allreduce`` it
    defines (or imports) at its top level. Read, never run, here: it runs on the ranks."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except SyntaxError as exc:
        raise UsageError(f"--solution {path}:{exc.lineno}: {exc.msg}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--solution {path}: {exc}") from None
    except (RecursionError, MemoryError):  # (an expression nested past the parser's stack)
        raise UsageError(f"--solution {path}: too deeply nested to read") from None
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Assign):
            defined |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    rings = [op for function, op in RINGS.items() if function in defined]
    if not rings:
        raise UsageError(f"--solution {path}: defines neither allreduce(send, recv) nor ring_allreduce(tensor), "
                         f"the rings lab bench times")
    return rings


def solution_ops(ops: list[str], rings: list[str], chosen: bool) -> list[str]:
    """The ops to time with a solution: its rings added to those asked for (``chosen``), else to
    gloo's all_reduce, to compare with, and p2p, whose fit predicts the rings."""
    return list(dict.fromkeys([*(ops if chosen else ["all_reduce", "p2p"]), *rings]))


def rank_env(ops: list[str], sizes: list[int], iters: int, warmup: int) -> dict[str, str]:
    if iters < 1 or warmup < 0:
        raise UsageError("--iters must be at least 1 and --warmup at least 0")
    return {SETTINGS_VAR: json.dumps({"ops": ops, "sizes": sizes, "iters": iters, "warmup": warmup})}


@dataclass(frozen=True)
class Row:
    op: str
    bytes: int
    count: int
    seconds: float | None  # the slowest rank's time per call (None: the backend lacks the op)
    wrong: int
    ranks: int

    @property
    def algbw(self) -> float | None:
        """GB/s (1e9 bytes)."""
        return self.bytes / self.seconds / 1e9 if self.seconds else None

    @property
    def busbw(self) -> float | None:
        return self.algbw * bus_factor(self.op, self.ranks) if self.algbw is not None else None

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "bytes": self.bytes, "count": self.count, "type": "float32",
                "redop": REDOPS.get(self.op, "none"), "time_us": None if self.seconds is None else self.seconds * 1e6,
                "algbw_gbs": self.algbw, "busbw_gbs": self.busbw, "wrong": self.wrong}


def rows(results: dict[int, Any], ranks: int) -> list[Row]:
    """One row per op and size from every rank's (checked) results."""
    per_rank = [rows_of(result) or [] for _, result in sorted(results.items())]
    out = []
    for measured in zip(*per_rank):
        first = measured[0]
        times = [r["seconds"] for r in measured if "seconds" in r]
        out.append(Row(first["op"], first["bytes"], first["count"], max(times) if len(times) == len(measured) else None,
                       sum(int(r.get("wrong", 0)) for r in measured), ranks))
    return out


@dataclass(frozen=True)
class Baseline:
    """Raw TCP between two hosts: one byte's round trip, and one stream's throughput."""

    hosts: tuple[str, str]
    rtt: float  # seconds
    bytes: int
    seconds: float

    @property
    def gbs(self) -> float:
        return self.bytes / self.seconds / 1e9

    def to_json(self) -> dict[str, Any]:
        return {"hosts": list(self.hosts), "rtt_us": self.rtt * 1e6, "gbs": self.gbs}


def baseline(results: dict[int, Any]) -> Baseline | None:
    for result in results.values():
        tcp = tcp_of(result)
        if tcp is not None:
            first, second = (str(h) for h in tcp["hosts"])
            return Baseline((first, second), float(tcp["rtt"]), int(tcp["bytes"]), float(tcp["seconds"]))
    return None


@dataclass(frozen=True)
class Fit:
    """t = alpha + S * beta, fitted to the p2p rows (seconds, seconds per byte)."""

    alpha: float
    beta: float

    def ring(self, nbytes: int, ranks: int) -> float:
        """The tutorial's ring all-reduce: the whole tensor, n-1 times."""
        return (ranks - 1) * (self.alpha + nbytes * self.beta)

    def chunked_ring(self, nbytes: int, ranks: int) -> float:
        """The chunked ring: reduce-scatter then all-gather, 2(n-1) messages of S/n."""
        return 2 * (ranks - 1) * (self.alpha + nbytes * self.beta / ranks)

    def crossover(self, ranks: int) -> float | None:
        """Bytes above which the chunked ring wins (None: it never does, with n <= 2 or no beta)."""
        return self.alpha / (self.beta * (1 - 2 / ranks)) if ranks > 2 and self.beta > 0 else None

    def to_json(self, ranks: int) -> dict[str, Any]:
        return {"alpha_us": self.alpha * 1e6, "beta_ns_per_byte": self.beta * 1e9,
                "crossover_bytes": self.crossover(ranks)}


def fit(measured: list[Row]) -> Fit | None:
    """The alpha-beta fit of the timed p2p rows, each size weighted by its own time (relative error),
    so the small sizes set alpha and the large ones beta; None without two sizes."""
    points = [(row.bytes, row.seconds) for row in measured if row.op == "p2p" and row.seconds]
    if len({size for size, _ in points}) < 2:
        return None
    w = [1 / t ** 2 for _, t in points]
    sw, sx, sy = sum(w), sum(wi * x for wi, (x, _) in zip(w, points)), sum(wi * t for wi, (_, t) in zip(w, points))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, points))
    sxy = sum(wi * x * t for wi, (x, t) in zip(w, points))
    beta = max(0.0, (sw * sxy - sx * sy) / (sw * sxx - sx * sx))
    return Fit(max(0.0, (sy - beta * sx) / sw), beta)


def csv_text(measured: list[Row], tcp: Baseline | None) -> str:
    """The rows as CSV, with raw TCP's throughput in every row when the ranks measured it."""
    out = io.StringIO()
    fields = ["op", "bytes", "count", "type", "redop", "time_us", "algbw_gbs", "busbw_gbs", "wrong", "tcp_gbs"]
    writer = csv.DictWriter(out, fields, lineterminator="\n")
    writer.writeheader()
    for row in measured:
        writer.writerow({**row.to_json(), "tcp_gbs": tcp.gbs if tcp else None})
    return out.getvalue()


def check_plotting() -> None:
    """--plot needs matplotlib (a dependency of the lab: one line, not a traceback, if it is gone)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib (make venv installs it)") from None


def plot(measured: list[Row], tcp: Baseline | None, path: Path, title: str) -> None:
    """busbw against size on log axes, one line per op, and raw TCP's throughput as a line across."""
    import matplotlib
    matplotlib.use("Agg")  # (no display: a file)
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8, 5))
    for op in dict.fromkeys(row.op for row in measured):
        points = [(row.bytes, row.busbw) for row in measured if row.op == op and row.busbw]
        if points:
            axes.plot(*zip(*points), marker="o", label=op)
    if tcp is not None:
        axes.axhline(tcp.gbs, color="grey", linestyle="--", label=f"raw TCP {tcp.hosts[1]} -> {tcp.hosts[0]}")
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("size (bytes)")
    axes.set_ylabel("busbw (GB/s)")
    axes.set_title(f"lab bench: {title}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=100, bbox_inches="tight")
    pyplot.close(figure)
