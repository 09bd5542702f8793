"""Training programs shaped like real ones (tests/train/, described in its README.md): DDP and FSDP2
over a small classifier, DataLoaders with a DistributedSampler, checkpoints, evaluation, gradient
accumulation; broken as real reports are, and healthy ones with a straggler. Their collectives come
from DDP's C++ reducer as much as from the program: the lab names each cause from torch's own flight
recorder merged with its records. Each expectation parses (unit); each program through ``lab launch
--hang-after`` gets the report its expectation says (local); the docker and Slurm tiers run some
across hosts (test_lab_docker.py, test_slurm.py), and torchrun here."""
from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Lab
from .test_why_fixtures import (
    KINDS,
    WHY,
    Launched,
    assert_launched_as_expected,
    assert_report_names_the_cause,
    expectation,
    launched_at_once,
    lines_named,
)
from .test_why_fixtures import UNDER_OTHER_LAUNCHERS as FIXTURES_UNDER_OTHER_LAUNCHERS

TRAIN = Path(__file__).resolve().parent / "train"
PROGRAMS = sorted(p for p in TRAIN.glob("*.py") if not p.name.startswith("_"))
# What the other launchers and transports run of them: a hang in DDP's C++ all_reduce, a gloo abort
# (torchrun here runs the first: the second is in the docker and Slurm tiers).
UNDER_OTHER_LAUNCHERS = ("ddp_checkpoint_barrier", "ddp_eval_on_rank_0")
# All that the docker tier runs across hosts over SSH, and the Slurm tier as one job's tasks (4 ranks each)
OTHER_LAUNCHERS = (*(WHY / f"{n}.py" for n in FIXTURES_UNDER_OTHER_LAUNCHERS),
                   *(TRAIN / f"{n}.py" for n in UNDER_OTHER_LAUNCHERS))


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_every_program_has_a_valid_expectation(path: Path) -> None:
    assert lines_named(expectation(path), path.read_text()) == []


def test_the_programs_are_realistic_and_cover_the_causes() -> None:
    found = [expectation(path) for path in PROGRAMS]
    assert len(found) >= 16
    assert {e.kind for e in found} >= set(KINDS) - {"p2p-cycle", "p2p-unmatched"}  # (training has no p2p)
    sources = [path.read_text() for path in PROGRAMS]
    assert sum("DistributedDataParallel" in s for s in sources) >= 12
    assert sum("sharded_classifier()" in s for s in sources) >= 2  # (FSDP2: fully_shard)
    assert sum(e.kind == "healthy" for e in found) >= 4
    assert any("time.monotonic() + 6.5" in s for s in sources)  # a straggler longer than --hang-after


@pytest.fixture(scope="module")
def launches() -> dict[Path, Launched]:
    return launched_at_once(PROGRAMS)


@pytest.mark.local
@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.stem)
def test_the_report_names_the_cause_of_a_training_program(launches: dict[Path, Launched], path: Path) -> None:
    assert_launched_as_expected(launches[path])


@pytest.mark.local
@pytest.mark.parametrize("name", UNDER_OTHER_LAUNCHERS[:1])
def test_the_report_names_the_cause_of_a_training_program_under_torchrun(lab: Lab, name: str) -> None:
    expect = expectation(TRAIN / f"{name}.py")
    assert_report_names_the_cause(lab, TRAIN / f"{name}.py", "--nproc", str(expect.nproc), "--launcher", "torchrun")
