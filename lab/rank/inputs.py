"""A rank's own drawn inputs, and nothing of another rank's.

Where an exercise computes from inputs (the ring all-reduce), the controller draws fresh random
values for every rank of every run (``lab.core.random_inputs``), and the checker expects what those values
give. Each host's run directory gets the file of each of its ranks (``inputs/rank-R``); a rank
reads its own before any exercise program loads, and unlinks it. So no rank can know another's
values without receiving them, and no submission can compute a result it was meant to communicate.

Under ``--launcher lab`` the host's zygote opens its ranks' files and unlinks them before it
forks any rank; each rank keeps only its own descriptor (:data:`FD_VAR` names it), and the zygote,
which never reads them, is not dumpable: a rank can reach neither the zygote's descriptors nor its
memory (``/proc/PID/fd``, ``/proc/PID/mem``), nor another rank's, however it tries. Under torchrun
and ``spawn`` each rank opens its own file as it starts: until every rank of a host has, one that
starts first could read another's (docs/classroom.md says so).
"""
from __future__ import annotations

import ctypes
import os

INPUTS_DIR = "inputs"  # in the run directory
FD_VAR = "LAB_INPUTS_FD"  # a rank forked by the zygote: the descriptor of its inputs' (unlinked) file
PR_SET_DUMPABLE = 4


def file_of(rank: int) -> str:
    """Rank ``rank``'s inputs, relative to the run directory."""
    return f"{INPUTS_DIR}/rank-{rank}"


def hold(ranks: range) -> dict[int, int]:
    """Open the inputs of ``ranks`` (those drawn: a run without inputs has none) and unlink them:
    rank -> descriptor, for the zygote to hand each rank its own."""
    held = {}
    for rank in ranks:
        try:
            held[rank] = os.open(file_of(rank), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        os.unlink(file_of(rank))
    return held


def take(rank: int) -> bytes | None:
    """This rank's inputs (None when the run drew none): from the descriptor the zygote left it, else
    from its file, which it unlinks."""
    fd = os.environ.pop(FD_VAR, None)
    if fd is not None:
        with os.fdopen(int(fd), "rb") as f:
            return f.read()
    try:
        with open(file_of(rank), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    os.unlink(file_of(rank))
    return data


def not_dumpable() -> None:
    """Keep other processes of this user out of this one (its ``/proc/PID/fd``, ``mem``, ``environ``:
    no ptrace); a child forked from it starts so too."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: nothing to set
        pass
