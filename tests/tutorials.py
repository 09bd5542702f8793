"""The tutorials' own scripts, taken verbatim from ../shared/seeds (for `lab launch`), with what
the tutorial shows them print."""
from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import pytest

from .conftest import REPO

SEEDS = REPO.parent / "shared" / "seeds"
# Tutorial 002 (large-scale-lm): whole scripts (``src/ch2/*.py``), each followed by the torchrun
# command that launched it and what it printed. These are valid for current torch on a CPU with gloo.
# The others torchrun launches are not (torch 2.13+cpu, through `lab launch`):
# - process_group_4, reduce_sum, reduce_max, scatter_nccl, allreduce_sum, allreduce_max, allgather,
#   reduce_scatter, barrier: init_process_group("nccl") raises
#   "RuntimeError: Distributed package doesn't have NCCL built in" (and they need a GPU per rank);
# - scatter, gather: gloo, but torch.cuda.set_device(rank) raises
#   "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'".
RUN_UNCHANGED = ("multi_process_3.py", "p2p_communication.py", "p2p_communication_non_blocking.py")

Line = tuple[str, tuple[float, ...]]  # a printed line with its tensors' numbers taken out, and those numbers
NUMBER = r"-?\d+\.?\d*(?:e[-+]?\d+)?"


@dataclass(frozen=True)
class Script:
    name: str
    path: Path
    nproc: int  # the world size the tutorial launches it with
    shown: list[Line]  # what the tutorial shows it print, every rank's lines (see printed())
    random: bool  # its tensors come from torch.randn: the tutorial's numbers cannot come again


def printed(text: str) -> list[Line]:
    """The lines of ``text``, a tensor's continuation lines joined to it, blank lines and warnings
    (Python's, torch's C++ log) left out, as (the line with every number inside ``tensor(...)``
    written ``#`` and its spaces dropped, those numbers); sorted, as the ranks print in any order."""
    lines: list[str] = []
    for line in text.splitlines():
        if line[:1].isspace() and lines:
            lines[-1] += line
        elif line.strip():
            lines.append(line.strip())
    result = []
    for line in lines:
        if "Warning: " in line or re.match(r"\[[WI]\d{4} ", line):
            continue
        numbers = [float(n) for t in re.findall(r"tensor\(.*?\)", line) for n in re.findall(NUMBER, t)]
        shape = re.sub(r"tensor\(.*?\)", lambda t: re.sub(r"\s+", "", re.sub(NUMBER, "#", t[0])), line)
        result.append((shape, tuple(numbers)))
    return sorted(result)


def printed_by_ranks(out: str) -> list[Line]:
    """printed() of what the ranks wrote in `lab launch` output (lines ``[HOST rK] ...``)."""
    streams: dict[str, list[str]] = {}
    for prefix, line in re.findall(r"^(\[\S+ r\d+\]) ?(.*)$", out, re.M):
        streams.setdefault(prefix, []).append(line)
    return sorted(line for stream in streams.values() for line in printed("\n".join(stream)))


def assert_prints_as_shown(script: Script, out: str) -> None:
    """Every rank printed the lines the tutorial shows with the same numbers; for a script of random
    tensors, with equal numbers exactly where the tutorial shows equal ones (what was sent arrived)."""
    got = printed_by_ranks(out)
    assert [shape for shape, _ in got] == [shape for shape, _ in script.shown], out
    if not script.random:
        assert got == script.shown, out
    else:
        def equal(lines: list[Line]) -> list[bool]:
            return [a == b for (_, a), (_, b) in combinations(lines, 2)]
        assert equal(got) == equal(script.shown), out


def tutorial_scripts(directory: Path) -> list[Script]:
    """Write tutorial 002's scripts that run on a CPU, verbatim, into ``directory``."""
    seeds = sorted(SEEDS.glob("002_*.txt"))
    if not seeds:
        pytest.skip(f"the tutorials are not at {SEEDS}")
    blocks = re.findall(r"```\n(.*?)```", seeds[0].read_text(), re.S)
    runs = {re.match(r'"""\nsrc/ch2/(\S+\.py)\n', code)[1]: (code, transcript)
            for code, transcript in zip(blocks, blocks[1:]) if code.startswith('"""\nsrc/ch2/')}
    scripts = []
    for name in RUN_UNCHANGED:
        code, transcript = runs[name]
        nodes, per_node = re.search(r"^[^#\n]*torchrun (?:--nnodes=(\d+) )?--nproc_per_node=(\d+) ",
                                    transcript, re.M).groups()
        shown = re.split(r"\*{10,}\n", transcript)[-1]  # after torchrun's warning about OMP_NUM_THREADS
        (directory / name).write_text(code)
        scripts.append(Script(name, directory / name, int(nodes or 1) * int(per_node), printed(shown),
                              "torch.randn" in code))
    return scripts


def ring_allreduce_fragment() -> str:
    """Tutorial 001's ``allreduce(send, recv)``, its text exactly as the tutorial prints it (dedented),
    as a solution file: the lab's reference program drives it."""
    seeds = sorted(SEEDS.glob("001_*.txt"))
    if not seeds:
        pytest.skip(f"the tutorials are not at {SEEDS}")
    text = seeds[0].read_text(encoding="utf-8")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "def allreduce(send, recv):")
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "recv[:] = accum[:]")
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = "\n".join(line[indent:] for line in lines[start:end + 1])
    return f"import torch.distributed as dist\n\n\n{body}\n"
