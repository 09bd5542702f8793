"""The lab on a machine with a GPU: nccl picked and checked with a GPU per rank, more ranks than
GPUs refused or run with gloo and said, a public project's GPU trainer (pytorch/examples' DDP
series, tests/projects/ddp_tutorial_series) stopped and resumed, and a notebook's ranks on the GPU.

Skipped where torch sees no CUDA GPU: CI has none. Run on a machine with one (docs/engineers.md:
"On a GPU machine"); one GPU is enough, since nccl takes one GPU a rank, and these tests are made
for one (world size 1 on nccl, more ranks on gloo).
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lab.transport.local import local_gpu_count

from .conftest import REPO, Lab
from .test_notebook import PID, interrupt_when, marker, run_notebook  # noqa: F401  (marker: a fixture)

pytestmark = [pytest.mark.gpu, pytest.mark.local,
              pytest.mark.skipif(local_gpu_count() == 0, reason="no CUDA GPU that torch can use here")]

DDP_TUTORIAL = REPO / "tests" / "projects" / "ddp_tutorial_series"
AT_WORLD_SIZE_ONE = ["processes", "launchers", "groups", "init-env", "init-tcp", "init-file", "broadcast", "reduce",
                     "all-reduce", "scatter", "gather", "all-gather", "reduce-scatter", "barrier", "dsgd", "backends"]


def test_with_a_gpu_a_rank_the_exercises_run_on_nccl_and_more_ranks_than_gpus_are_refused_or_run_on_gloo(
        lab: Lab) -> None:
    gpus = local_gpu_count()
    result = lab("run", *AT_WORLD_SIZE_ONE, "--nproc", "1")
    assert result.code == 0, result.text[-3000:]
    assert f"{len(AT_WORLD_SIZE_ONE)} passed, 0 failed" in result.out and "(world size 1, nccl, init env)" in result.out
    assert f"{gpus} GPU(s); the collectives run with nccl on cuda:0" in result.out, result.out[-3000:]

    refused = lab("run", "all-reduce", "--nproc", str(gpus + 1), "--backend", "nccl")
    assert refused.code == 2, refused.text
    assert refused.err.strip() == (f"lab: error: host local: nccl needs one GPU per rank, but it has {gpus} GPU(s) "
                                   f"for {gpus + 1} slot(s); use --backend gloo"), refused.err

    shared = lab("run", "all-reduce", "backends", "--nproc", str(gpus + 1))
    assert shared.code == 0, shared.text[-3000:]
    assert f"(world size {gpus + 1}, gloo, init env)" in shared.out, shared.out[-2000:]
    assert "host(s) local have fewer GPUs than ranks: nccl needs one GPU per rank, so the collectives ran with " \
           "gloo" in shared.out, shared.out[-2000:]
    assert lab.leftovers() == []


def saved_epochs(out: str) -> list[int]:
    return [int(n) for n in re.findall(r"Epoch (\d+) \| Training snapshot saved at snapshot\.pt", out)]


def test_a_public_projects_gpu_trainer_launched_as_torchrun_would_is_stopped_and_resumes_from_its_snapshot(
        lab: Lab, tmp_path: Path) -> None:
    """multigpu_torchrun.py as upstream has it: `lab launch --nproc-per-node 1` (LOCAL_RANK, env://,
    nccl), Ctrl-C'd once it saved a few snapshots; the snapshot is in the project, where torchrun
    leaves it, and the next launch resumes from it and trains to the end."""
    project = tmp_path / "ddp-tutorial-series"
    shutil.copytree(DDP_TUTORIAL, project)
    first = lab.popen("launch", "--nproc-per-node", "1", str(project / "multigpu_torchrun.py"), "100000", "1")
    assert first.stdout is not None
    out, deadline = [], time.monotonic() + 180
    while time.monotonic() < deadline:
        line = first.stdout.readline()
        if not line:
            break
        out.append(line)
        if len(saved_epochs("".join(out))) >= 3:
            first.send_signal(signal.SIGINT)
            break
    try:
        rest, _ = first.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        first.kill()
        rest, _ = first.communicate()
    said = "".join(out) + rest
    assert first.returncode == 130, said[-3000:]
    assert "[GPU0] Epoch 0 | Batchsize: 32 | Steps: 64" in said, said[-3000:]
    last = max(saved_epochs(said))
    assert (project / "snapshot.pt").is_file() and lab.leftovers() == []

    resumed = lab("launch", "--nproc-per-node", "1", str(project / "multigpu_torchrun.py"), str(last + 3), "1")
    assert resumed.code == 0, resumed.text[-3000:]
    assert "Loading snapshot" in resumed.out and f"Resuming training from snapshot at Epoch {last}" in resumed.out, \
        resumed.out[-3000:]
    assert re.findall(r"\[GPU0\] Epoch (\d+) \|", resumed.out) == [str(e) for e in range(last, last + 3)], resumed.out
    assert lab.leftovers() == []


def test_a_notebooks_ranks_use_the_gpu_and_a_cell_stuck_on_it_is_ended_at_the_interrupt(tmp_path: Path,
                                                                                      marker: str) -> None:  # noqa: F811
    """One rank a GPU: nccl and the rank's device in the cells; a value pulled from the GPU arrives on
    the CPU; a CUDA out-of-memory fails its cell and the rank goes on; a kernel that spins on the GPU
    (the rank stuck in C++, past Ctrl-C) ends the ranks, and a restart brings the cells' values back."""
    interrupter = interrupt_when(tmp_path, "spinning")
    said = run_notebook([
        PID,
        "%load_ext lab.notebook\n%lab start --nproc 1 --hang-after 10",
        "%%dist\nx = torch.arange(4.0, device=device) + rank\ndist.all_reduce(x)\n"
        "print('on', dist.get_backend(), x.device, x.tolist())",
        "%lab trace",
        "xs = %lab pull x\nprint(xs[0].device, xs[0].tolist())",
        "%%dist\nhuge = torch.empty(2 ** 50, device=device)",
        "%%dist\nprint('went on', torch.cuda.memory_allocated(device) < 2 ** 30)",
        "%%dist\nimport pathlib\npathlib.Path('spinning').touch()\ntorch.cuda._sleep(2 ** 42)\n"
        "torch.cuda.synchronize()",
        "%lab restart",
        "%%dist\nprint('after', x.device, x.tolist())",
        "%lab stop",
    ], tmp_path, marker, timeout=240)
    interrupter.join()
    _, start, summed, trace, pulled, oom, went_on, spun, restarted, after, stop = said
    assert start["error"] is None and "1 rank(s) on local formed their group (nccl, env://)" in start["out"], start
    assert "[local r0] on nccl cuda:0 [0.0, 1.0, 2.0, 3.0]" in summed["out"], summed
    assert re.search(r"^  rank 0 \(local\): all_reduce #\d+ [\d.]+-[\d.]+$", trace["out"], re.M), trace
    assert pulled["error"] is None and pulled["out"] == "cpu [0.0, 1.0, 2.0, 3.0]\n", pulled
    assert oom["error"] is not None and "rank 0 raised OutOfMemoryError: CUDA out of memory" in oom["error"], oom
    assert went_on["error"] is None and "[local r0] went on True" in went_on["out"], went_on
    assert spun["error"] is not None and "interrupted; where each rank was:" in spun["error"], spun
    where = f"rank 0 (local): not in a torch.distributed call at cell [{spun['count']}]:5 in <module>"
    assert where in spun["error"], spun
    assert restarted["error"] is None, restarted
    assert f"replayed 2 cell(s): cell [{summed['count']}], cell [{went_on['count']}]" in restarted["out"], restarted
    assert "[local r0] after cuda:0 [0.0, 1.0, 2.0, 3.0]" in after["out"], after
    assert stop["error"] is None, stop


def test_a_public_projects_trainer_trains_in_a_notebook_cell_on_the_gpu_under_torchrun(tmp_path: Path,
                                                                                      marker: str) -> None:  # noqa: F811
    """pytorch/examples' Trainer imported and trained in a cell, its rank started as torchrun starts it
    (--launcher torchrun: LOCAL_RANK, the nccl group formed, the cells relayed by the host's process);
    its snapshot in the notebook's folder, its model kept on the GPU for the next cell."""
    shutil.copytree(DDP_TUTORIAL, tmp_path / "tutorial")
    said = run_notebook([
        "%load_ext lab.notebook\n%lab start --nproc 1 --launcher torchrun",
        "%%dist\nimport sys\nsys.path.insert(0, 'tutorial')\n"
        "from multigpu_torchrun import Trainer, load_train_objs, prepare_dataloader\n"
        "dataset, model, optimizer = load_train_objs()\n"
        "trainer = Trainer(model, prepare_dataloader(dataset, 32), optimizer, 1, 'snapshot.pt')\n"
        "trainer.train(2)",
        "%%dist\nprint('weights on', next(trainer.model.parameters()).device)",
        "%lab stop",
    ], tmp_path, marker, timeout=240)
    start, trained, kept, stop = said
    assert start["error"] is None and "1 rank(s) on local formed their group (nccl, env://)" in start["out"], start
    assert trained["error"] is None, trained
    assert re.findall(r"\[GPU0\] Epoch (\d) \| Batchsize: 32 \| Steps: 64", trained["out"]) == ["0", "1"], trained
    assert "Epoch 1 | Training snapshot saved at snapshot.pt" in trained["out"], trained
    assert (tmp_path / "snapshot.pt").is_file()
    assert "[local r0] weights on cuda:0" in kept["out"], kept
    assert stop["error"] is None, stop
