"""The tutorials' own scripts, taken verbatim from ../shared/seeds (for `lab launch`)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import REPO

SEEDS = REPO.parent / "shared" / "seeds"
# Tutorial 002 (large-scale-lm): whole scripts, launched with torchrun, reading the rendezvous
# from the environment. These two are valid for current torch on a CPU with gloo.
RUN_UNCHANGED = ("p2p_communication.py", "p2p_communication_non_blocking.py")


def tutorial_scripts(directory: Path) -> dict[str, Path]:
    """Write tutorial 002's ``src/ch2/*.py`` code blocks that run on a CPU into ``directory``."""
    seeds = sorted(SEEDS.glob("002_*.txt"))
    if not seeds:
        pytest.skip(f"the tutorials are not at {SEEDS}")
    blocks = dict(re.findall(r'```\n"""\nsrc/ch2/(\S+\.py)\n"""\n(.*?)```', seeds[0].read_text(), re.S))
    scripts = {}
    for name in RUN_UNCHANGED:
        scripts[name] = directory / name
        scripts[name].write_text(f'"""\nsrc/ch2/{name}\n"""\n' + blocks[name])
    return scripts
