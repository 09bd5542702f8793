"""What ``lab bench`` shows: nccl-tests' table, raw TCP's speed, the alpha-beta fit of the p2p sweep
and the two rings' times as it predicts them, the notes."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from lab.cli.views import screen
from lab.jobs import bench
from lab.rank.text import printable


def console(stderr: bool) -> Console:
    """A console at least 100 columns wide: the table's numbers whole, never cut, on a narrow
    terminal too."""
    made = screen.console(stderr)
    made.width = max(made.width, 100)
    return made


def print_bench(console: Console, title: str, rows: list[bench.Row], tcp: bench.Baseline | None) -> None:
    """nccl-tests' table, with each op's busbw as a share of raw TCP's when the ranks measured it."""
    table = Table("op", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
                  *(("of tcp",) if tcp else ()), box=box.SIMPLE_HEAD,
                  title=f"{title}: size in bytes, time in us, algbw and busbw in GB/s")
    for column in table.columns:
        column.no_wrap = True
        column.justify = "left" if column.header in ("op", "type", "redop") else "right"
    for row in rows:
        timed = row.seconds is not None
        busbw = row.busbw if timed else None
        table.add_row(row.op, f"{row.bytes}", f"{row.count}", "float", bench.REDOPS.get(row.op, "none"),
                      f"{row.seconds * 1e6:.1f}" if row.seconds is not None else "n/a",
                      f"{row.algbw:.3f}" if timed and row.algbw is not None else "n/a",
                      f"{busbw:.3f}" if busbw is not None else "n/a", str(row.wrong),
                      *((f"{busbw / tcp.gbs:.0%}" if busbw is not None else "n/a",) if tcp else ()))
    console.print(table)
    if tcp is not None:
        console.print(f"raw TCP, {tcp.hosts[1]} -> {tcp.hosts[0]}: {tcp.gbs:.3f} GB/s in one stream, "
                      f"round trip {tcp.rtt * 1e6:.0f} us")


def print_model(console: Console, fitted: bench.Fit, rows: list[bench.Row], ranks: int) -> None:
    """The alpha-beta fit of the p2p sweep, and the two rings' times as it predicts them."""
    console.print(f"p2p fit, t = alpha + S*beta: alpha = {fitted.alpha * 1e6:.1f} us, beta = {fitted.beta * 1e9:.3f} "
                  f"ns/byte ({1 / fitted.beta / 1e9 if fitted.beta else float('inf'):.3f} GB/s)")
    measured = {(row.op, row.bytes): row.seconds for row in rows if row.seconds}
    timed = [op for op in ("ring", "chunked_ring", "all_reduce") if any(o == op for o, _ in measured)]
    table = Table("size", "tutorial's ring", "chunked ring", *(f"{op} measured" for op in timed),
                  box=box.SIMPLE_HEAD, title=f"ring all-reduce on {ranks} ranks as the fit predicts it (us): "
                                             "(n-1)(alpha+S*beta) and 2(n-1)(alpha+S*beta/n)")
    for column in table.columns:
        column.justify = "right"
    for size in sorted({row.bytes for row in rows if row.op == "p2p"}):
        times = [measured.get((op, size)) for op in timed]
        table.add_row(str(size), f"{fitted.ring(size, ranks) * 1e6:.1f}",
                      f"{fitted.chunked_ring(size, ranks) * 1e6:.1f}",
                      *(f"{seconds * 1e6:.1f}" if seconds else "n/a" for seconds in times))
    console.print(table)
    crossover = fitted.crossover(ranks)
    if crossover:
        console.print(f"the chunked ring wins above {crossover:.0f} bytes: alpha / (beta (1 - 2/n))")
    elif ranks <= 2:
        console.print(f"on {ranks} ranks the chunked ring never wins: as many bytes, in more messages")
    else:
        console.print("the fit found no cost per byte (the sizes are too small to show one): time larger sizes "
                      "to see where the chunked ring wins")


def print_notes(console: Console, notes: tuple[str, ...]) -> None:
    """What the rings sent, with a solution's."""
    for note in notes:
        console.print(Text(f"note: {printable(note)}"))
