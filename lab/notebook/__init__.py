"""The lab in a notebook: ``%load_ext lab.notebook`` in any IPython kernel (JupyterLab, Notebook,
VS Code, nbclient), then

* ``%lab start --nproc 4`` (this machine) or ``%lab start --hosts inventory.yaml`` (the container
  lab, VMs over SSH, Slurm: every cluster the lab knows): ranks started as ``lab launch`` starts
  them, the rendezvous injected, the process group formed (``lab.notebook.session``);
* ``%%dist`` cells, run on every rank (``--ranks 0,2``: on some), which keep their variables
  between cells; their output comes back as it is printed, ``[host rN]`` first; an exception a
  rank raised fails the cell and is named; a cell that hangs ends within ``--hang-after`` seconds
  with the lab's why, as a run's; ``%lab status``, ``%lab stop``.
"""
from __future__ import annotations

import atexit
from typing import Any

_MAGICS: list[Any] = []  # the kernel's (one, once loaded)


def load_ipython_extension(ipython: Any) -> None:
    from lab.notebook.magics import LabMagics

    if _MAGICS:
        return
    magics = LabMagics(ipython)
    ipython.register_magic_function(magics.lab, magic_kind="line", magic_name="lab")
    ipython.register_magic_function(magics.dist, magic_kind="cell", magic_name="dist")
    atexit.register(magics.stop_all)  # (the kernel ends: its ranks too; closing their line does it anyway)
    _MAGICS.append(magics)


def unload_ipython_extension(ipython: Any) -> None:
    for magics in _MAGICS:
        magics.stop_all()
