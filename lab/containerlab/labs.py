"""Which lab a name is, on this machine's engine or across Docker machines, and the labs there are
(``lab ls``), so that a caller never asks which."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lab.containerlab import containers, engine, state
from lab.containerlab.containers import LabSummary
from lab.containerlab.engine import Say
from lab.containerlab.engine_lab import EngineLab
from lab.containerlab.lifecycle import Lab
from lab.containerlab.machines_lab import MachinesLab, recorded_machines
from lab.containerlab.topology import DEFAULT_LAB, LabPaths, default_inventory
from lab.errors import UsageError


def find_lab(name: str, inventory: str | None = None, machines: str | None = None) -> Lab:
    """The lab ``name`` whose inventory is ``inventory`` (default: as ``lab up`` writes it): across
    the Docker machines of ``machines``, else of the machines file ``lab up --machines`` recorded
    in the lab's state, else on this machine's engine."""
    path = Path(inventory or default_inventory(name))
    recorded = recorded_machines(LabPaths(path.resolve(), name))
    if machines or recorded:
        return MachinesLab(name, path, machines or str(recorded), given=bool(machines))
    return EngineLab(name, path)


def down_every_lab(say: Say, machines: str | None = None) -> int:
    """Remove every lab on this machine's engine, saying so; how many things went. A lab across
    machines goes by its name only (``machines``: refused)."""
    if machines:
        raise UsageError("--all is for the labs on this machine's engine; name the lab with --name")
    removed = containers.down(engine.client(), say, None)
    say(f"every lab is down ({removed} removed)" if removed else
        "every lab: nothing to remove on this machine's engine")
    return removed


@dataclass(frozen=True)
class KnownLabs:
    """The labs ``lab ls`` shows: those on this machine's engine, and those across machines
    whose state this user keeps (name -> their machines file)."""

    on_engine: list[LabSummary]
    across_machines: dict[str, str]


def known_labs() -> KnownLabs:
    """The labs on this machine's engine, and those across machines recorded here."""
    on_engine = containers.labs(engine.client())
    across = {name: machines for name in _recorded_labs()
              if (machines := recorded_machines(LabPaths(Path(default_inventory(name)).resolve(), name))) is not None}
    return KnownLabs(on_engine, across)


def _recorded_labs() -> list[str]:
    """The labs whose state this user keeps (``lab.containerlab.state``)."""
    labs = state.home() / "labs"
    return sorted({DEFAULT_LAB, *(d.name for d in labs.iterdir() if d.is_dir())}) if labs.is_dir() else [DEFAULT_LAB]
