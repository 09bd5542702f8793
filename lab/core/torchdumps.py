"""``--fr-dir DIR``: each rank's torch flight-recorder dump (its ``torchdump`` events: lab.rank.torchfr),
written as ``DIR/rank_N``, a pickle as torch writes its own dumps, so that torch's analyzer reads the
directory as it is: ``torchfrtrace DIR -p rank_`` (``python -m torch.distributed.flight_recorder.fr_trace``).
A dump is the rank's word (untrusted): it came as JSON, so only plain values are pickled, and what is
not an object with a list of entries is left out.
"""
from __future__ import annotations

import pickle
from pathlib import Path

from lab.core.outcome import RunOutcome


def write(directory: str, outcome: RunOutcome) -> list[int]:
    """Write every rank's last dump into ``directory`` (the command line made it); the ranks written."""
    folder = Path(directory)
    written = []
    for state in outcome.ranks:
        dump = state.torch_dump
        if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list):
            continue
        (folder / f"rank_{state.spec.rank}").write_bytes(pickle.dumps({"entries": [], **dump}))
        written.append(state.spec.rank)
    return written
