"""torch's own flight recorder, read inside the rank: the collectives the process group issued, from
the program's calls and from torch's C++ alike (DDP's reducer in ``backward()``, the functional
collectives), as torch records them (``TORCH_FR_BUFFER_SIZE`` entries, on by default; 0 turns it off).

On gloo an entry's ``state`` stays "scheduled" and its completion times stay empty: ``retired`` is what
says it completed. No send or receive is recorded. The dump is read as JSON, without the entries' Python
frames: torch's first dump with frames costs seconds; the rank's own stack says where a call it is in
was made (``lab.rank.torchcalls``, which merges the entries with the rank's records). A read costs
about 20 us an entry, so the rank reads it only when it must (a call blocks, a dump is sent) and
torch keeps BUFFER_DEFAULT entries unless the program's environment says otherwise. Standard
library only until :func:`read` is called (torch is imported by then).
"""
from __future__ import annotations

import json
import os
from typing import Any

from lab.rank.ops import canonical

BUFFER_VAR = "TORCH_FR_BUFFER_SIZE"
BUFFER_DEFAULT = "256"  # entries torch keeps, where the environment does not say (torch's default: 2000)
PREFIX_MAX = 16  # characters of a profiling name's backend prefix ("gloo:")

# The ScalarType names torch's entries give dtypes in, as torch.dtype names them.
DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
          "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool",
          "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def default_buffer() -> None:
    """Keep torch's recorder short (each read costs per entry) unless the environment sizes it."""
    os.environ.setdefault(BUFFER_VAR, BUFFER_DEFAULT)


def read() -> dict[str, Any]:
    """torch's dump as a dict (``entries``, ``pg_config``, ``pg_status``, ...); empty when the recorder
    is off, or this torch has none."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]

        dump = json.loads(_dump_fr_trace_json(True, False))
    except Exception:  # (no recorder in this torch, or one that cannot say: nothing is known)
        return {}
    return dump if isinstance(dump, dict) else {}


def analyzable(dump: dict[str, Any], groups: dict[str, list[int]]) -> dict[str, Any]:
    """``dump`` as torch's own analyzer (``torchfrtrace DIR -p rank_``) reads it: gloo leaves its
    ``pg_config`` keyed "" with no ranks (``groups``: each group's global ranks by torch's name for it),
    and the JSON dump has no frames."""
    descs = {group_name(e): str(e["process_group"][1]) for e in dump.get("entries") or []
             if isinstance(e, dict) and isinstance(e.get("process_group"), list) and len(e["process_group"]) > 1}
    config = {name: {"name": name, "desc": descs.get(name, "default_pg" if name == "0" else "undefined"),
                     "ranks": str(ranks)} for name, ranks in groups.items()}
    entries = [{"frames": [], **e} for e in dump.get("entries") or [] if isinstance(e, dict)]
    return {**dump, "pg_config": config, "entries": entries}


def op_of(entry: dict[str, Any]) -> str:
    """The operation an entry names, as torch.distributed's function does: ``gloo:all_reduce`` is
    ``all_reduce``, ``gloo:allreduce_coalesced`` is ``all_reduce_coalesced``."""
    name = str(entry.get("profiling_name") or "")
    backend, colon, rest = name.partition(":")
    return canonical(rest if colon and len(backend) <= PREFIX_MAX else name)


def shape_of(entry: dict[str, Any]) -> list[int] | None:
    """The first input's shape."""
    sizes = entry.get("input_sizes")
    if isinstance(sizes, list) and sizes and isinstance(sizes[0], list):
        return [n for n in sizes[0] if isinstance(n, int)]
    return None


def dtype_of(entry: dict[str, Any]) -> str | None:
    dtypes = entry.get("input_dtypes")
    if isinstance(dtypes, list) and dtypes and isinstance(dtypes[0], str):
        return DTYPES.get(dtypes[0], dtypes[0].lower())
    return None


def group_name(entry: dict[str, Any]) -> str | None:
    group = entry.get("process_group")
    return str(group[0]) if isinstance(group, list) and group else None
