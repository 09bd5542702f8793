"""Who starts the ranks: each launcher a class (``lab.core.launchers.base.Launcher``) in a module
of its own, found here by the name ``--launcher`` gives. To add one, write its module and list
its class in :data:`LAUNCHERS` (docs/extending.md)."""
from __future__ import annotations

from lab.core.launchers.base import Launcher
from lab.core.launchers.own import OwnLauncher
from lab.core.launchers.spawn import Spawn
from lab.core.launchers.srun import Srun, SrunTorchrun
from lab.core.launchers.torchrun import Torchrun
from lab.errors import UsageError

LAUNCHERS: dict[str, Launcher] = {launcher.name: launcher for launcher in (
    OwnLauncher(), Torchrun(), Spawn(), Srun(), SrunTorchrun())}
NAMES: tuple[str, ...] = tuple(LAUNCHERS)
DEFAULT = OwnLauncher.name
ON_ALLOCATION = Srun.name  # the default on the nodes of a Slurm allocation (--hosts slurm) and in a batch job


def find(name: str) -> Launcher:
    """The launcher ``name``; UsageError when there is none."""
    if name not in LAUNCHERS:
        raise UsageError(f"--launcher must be one of {', '.join(NAMES)}, got {name!r}")
    return LAUNCHERS[name]


__all__ = ["DEFAULT", "LAUNCHERS", "NAMES", "ON_ALLOCATION", "Launcher", "find"]
