"""The lab in a notebook (lab.notebook): real notebooks run by nbclient in a real IPython kernel, their
%%dist cells on real ranks of this machine; what each cell shows is read from the notebook's outputs."""
from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from lab.core.outcome import Output, RankState, between_cells
from lab.core.plan import RankSpec
from lab.errors import UsageError
from lab.grading.notebooks import NotebookCell, extract, read_cells
from lab.rank.events import Cell, MalformedEvent, parse_event
from lab.rank.protocol import event_line

from .conftest import live_pids_with


@pytest.fixture
def marker() -> Iterator[str]:
    """A mark in the kernel's environment, which every rank inherits: what is left of a notebook is found by it."""
    mark = uuid.uuid4().hex
    yield mark
    deadline = time.monotonic() + 10
    while live_pids_with(f"LAB_TEST_MARKER={mark}") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_pids_with(f"LAB_TEST_MARKER={mark}") == []


def run_notebook(cells: list[str], folder: Path, marker: str, timeout: float = 120) -> list[dict[str, Any]]:
    """Run ``cells`` as a notebook in a kernel of its own (in ``folder``) and return each cell's outputs:
    {"out": stdout, "err": stderr, "error": what the failed cell showed}."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder)}})
    client.execute(env={**os.environ, "LAB_TEST_MARKER": marker})
    shown = []
    for cell in notebook.cells:
        said: dict[str, Any] = {"out": "", "err": "", "error": None, "count": cell.execution_count}
        for output in cell.outputs:
            if output.output_type == "stream":
                said["out" if output.name == "stdout" else "err"] += output.text
            elif output.output_type == "display_data":  # (a %%dist cell's lines, text and HTML; a picture)
                said["out"] += output.data["text/plain"] + "\n"
                said["html"] = output.data.get("text/html", "")
                said["svg"] = output.data.get("image/svg+xml", "")
            elif output.output_type == "error":
                said["error"] = "\n".join(output.traceback)
        shown.append(said)
    return shown


START = "%load_ext lab.notebook\n%lab start --nproc 3 --hang-after 3"


@pytest.mark.local
def test_cells_run_on_every_rank_keep_their_variables_and_name_the_rank_that_raised(tmp_path: Path,
                                                                                     marker: str) -> None:
    said = run_notebook([
        START,
        "%%dist\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\nprint('sum', x.item())",
        "%%dist\nprint('kept', (x * rank).item())",
        "%%dist --ranks 1,2\nprint('only', rank)",
        "%%dist\nif rank == 1:\n    raise ValueError('rank one says no')\nprint('went on', rank)",
        "%%dist\ny = torch.ones(2) * rank\ndist.broadcast(y, src=2)\nprint('after the error', y.tolist())",
        "%lab trace",
        "%lab status",
        "xs = %lab pull x\nprint(xs)\nys = %lab pull y --ranks 0,2\nprint(ys)",
        "%lab pull nothing",
        "%%dist\nimport sys\nfor step in range(1, 4):\n    sys.stderr.write(f'\\rstep {step}/3')\n"
        "    sys.stderr.flush()\nsys.stderr.write('\\n')",
        "%lab stop",
    ], tmp_path, marker)
    start, summed, kept, some, raised, after, trace, status, pulled, nothing, bar, stop = said
    assert start["error"] is None and "3 rank(s) on local formed their group (gloo, env://)" in start["out"], start
    assert sorted(re.findall(r"\[local r(\d)\] sum 6\.0", summed["out"])) == ["0", "1", "2"], summed
    assert sorted(re.findall(r"\[local r(\d)\] kept (\d+)\.0", kept["out"])) == [("0", "0"), ("1", "6"), ("2", "12")]
    assert sorted(re.findall(r"\[local r(\d)\] only", some["out"])) == ["1", "2"], some
    # the rank that raised is named with the cell's own line; the others went on, and so does the notebook
    assert f"rank 1 raised ValueError: rank one says no at cell [{raised['count']}]:3" in raised["error"], raised
    assert f'[local r1]   File "cell [{raised["count"]}]", line 3, in <module>' in raised["out"], raised
    assert '<span style="color:#c00">ValueError: rank one says no</span>' in raised["html"], raised  # (stderr)
    assert raised["html"].count("<details open>") == 3 and "<b>local r2</b>" in raised["html"], raised
    assert sorted(re.findall(r"\[local r(\d)\] went on", raised["out"])) == ["0", "2"], raised
    assert after["error"] is None and after["out"].count("after the error [2.0, 2.0]") == 3, after
    # the last cell's calls, a row a rank: in text, and as a picture
    drawn = re.findall(r"rank (\d) \(local\): broadcast #\d+ [\d.]+-[\d.]+$", trace["out"], re.M)
    assert drawn == ["0", "1", "2"], trace
    assert trace["svg"].startswith("<svg") and trace["svg"].count("<rect") == 3, trace
    assert "3 rank(s) on local, 5 cell(s) run, running" in status["out"], status
    assert pulled["error"] is None, pulled
    assert pulled["out"] == "[tensor([6.]), tensor([6.]), tensor([6.])]\n[tensor([2., 2.]), tensor([2., 2.])]\n", pulled
    assert nothing["error"] == ("lab: rank 0 raised NameError: name 'nothing' is not defined\n"
                                "lab: rank 1 raised NameError: name 'nothing' is not defined\n"
                                "lab: rank 2 raised NameError: name 'nothing' is not defined"), nothing
    # a progress bar, redrawn with carriage returns (as tqdm draws one), shows as it was drawn last
    assert bar["out"].count("step 3/3") == 3 and "step 1/3" not in bar["out"], bar
    assert "the notebook's 3 rank(s) ended" in stop["out"] and stop["error"] is None, stop


@pytest.mark.local
def test_a_cell_that_hangs_ends_with_the_why_across_the_ranks_and_its_own_line(tmp_path: Path, marker: str) -> None:
    said = run_notebook([
        START,
        "%%dist\nx = torch.ones(1)\nif rank == 0:\n    dist.all_reduce(x)",
        "%lab status",
        "%%dist\nprint('never')",
        "%lab stop",
    ], tmp_path, marker)
    _, hung, status, after, _ = said
    error, cell = hung["error"], f"cell [{hung['count']}]"
    assert error is not None, hung
    assert f"all_reduce #2, SUM, 1 float at {cell}:4" in error, error
    assert f"rank 1 (local): ended {cell} without it and waits for the next cell" in error, error
    assert f"rank 2 (local): ended {cell} without it and waits for the next cell" in error, error
    assert "fix: Every rank of the group must make each of its collectives in the same cell" in error, error
    assert "hung: nothing moved on any rank's connections for 3s" in error, error
    assert "ended: %lab restart starts fresh ones" in status["out"], status
    assert "the notebook's ranks have ended" in after["error"] and "never" not in after["out"], after


@pytest.mark.local
@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_ranks_started_by_torchrun_or_mp_spawn_take_the_cells_and_a_hang_is_named(tmp_path: Path, marker: str,
                                                                                   launcher: str) -> None:
    """Their agents start the ranks with stdin of their own: each host's process relays the notebook's
    line to every rank (lab.rank.stdin.Relay). The rest is as under the lab's launcher."""
    said = run_notebook([
        f"%load_ext lab.notebook\n%lab start --nproc 3 --hang-after 3 --launcher {launcher}",
        "%%dist\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\nprint('sum', x.item())",
        "%%dist\nimport os\nprint('kept', (x * rank).item(), os.environ['LOCAL_RANK'])",
        "%%dist\nif rank == 2:\n    dist.all_reduce(x)",
    ], tmp_path, marker)
    start, summed, kept, hung = said
    assert start["error"] is None and "3 rank(s) on local formed their group (gloo, env://)" in start["out"], start
    assert sorted(re.findall(r"\[local r(\d)\] sum 6\.0", summed["out"])) == ["0", "1", "2"], summed
    assert sorted(re.findall(r"\[local r\d\] kept (\d+)\.0 (\d)", kept["out"])) == [("0", "0"), ("12", "2"), ("6", "1")]
    assert f"Rank 2 waits in all_reduce #3 for ranks 0, 1, which have ended cell [{hung['count']}] without it" in \
        (hung["error"] or ""), hung


def interrupt_when(folder: Path, name: str, after: float = 0.5) -> threading.Thread:
    """Ctrl-C the notebook's kernel (its pid in ``folder``/kernel.pid) ``after`` seconds once ``folder``/``name``
    is there."""
    def interrupt() -> None:
        deadline = time.monotonic() + 90
        while not (folder / name).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(after)
        os.kill(int((folder / "kernel.pid").read_text()), signal.SIGINT)

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    return thread


PID = "import os, pathlib\npathlib.Path('kernel.pid').write_text(str(os.getpid()))"


@pytest.mark.local
def test_ctrl_c_interrupts_the_cell_on_every_rank_which_keeps_its_variables(tmp_path: Path, marker: str) -> None:
    interrupter = interrupt_when(tmp_path, "sleeping-2")
    said = run_notebook([
        PID, START,
        "%%dist\nimport pathlib, time\nx = 40 + rank\npathlib.Path(f'sleeping-{rank}').touch()\ntime.sleep(60)",
        "%%dist\nprint('kept', x)",
        "%lab stop",
    ], tmp_path, marker)
    interrupter.join()
    _, _, slept, kept, _ = said
    cell = f"cell [{slept['count']}]"
    assert slept["error"] == (f"lab: interrupted: rank 0 at {cell}:5, rank 1 at {cell}:5, rank 2 at {cell}:5; the "
                              "ranks keep their variables"), slept
    assert sorted(re.findall(r"\[local r\d\] kept (\d+)", kept["out"])) == ["40", "41", "42"], kept


@pytest.mark.local
def test_ranks_stuck_past_the_interrupt_are_ended_said_where_each_was_and_a_restart_replays_the_cells(
        tmp_path: Path, marker: str) -> None:
    interrupter = interrupt_when(tmp_path, "stuck")
    said = run_notebook([
        PID,
        "%load_ext lab.notebook\n%lab start --nproc 3 --hang-after 60",
        "%%dist\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)",
        "%%dist\nraise RuntimeError('not replayed')",
        "%%dist\nimport pathlib, signal, time\nif rank == 0:\n    while not pathlib.Path('blocked').exists():\n"
        "        time.sleep(0.05)\n    pathlib.Path('stuck').touch()\n    dist.all_reduce(x)\nelif rank == 1:\n"
        "    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])  # (as a rank deep in C++ is)\n"
        "    pathlib.Path('blocked').touch()\n    time.sleep(60)",
        "%lab restart",
        "%%dist\nprint('restored', x.item(), rank)",
        "%lab stop",
    ], tmp_path, marker, timeout=180)
    interrupter.join()
    stuck, restarted, restored = said[4], said[5], said[6]
    cell = f"cell [{stuck['count']}]"
    assert "interrupted; where each rank was:" in stuck["error"], stuck
    assert f"rank 0 (local): all_reduce #3, SUM, 1 float at {cell}:7" in stuck["error"], stuck
    assert f"rank 1 (local): not in a torch.distributed call at {cell}:11 in <module>" in stuck["error"], stuck
    assert "%lab restart starts fresh ones and replays the cells that ran" in stuck["error"], stuck
    assert restarted["error"] is None, restarted
    assert f"replayed 1 cell(s): cell [{said[2]['count']}]" in restarted["out"], restarted
    assert sorted(re.findall(r"restored 6\.0 (\d)", restored["out"])) == ["0", "1", "2"], restored


@pytest.mark.local
@pytest.mark.load
def test_on_a_busy_machine_cells_still_run_and_a_hang_is_named_not_a_healthy_cell(tmp_path: Path, marker: str) -> None:
    """Twice as many busy processes as cores: a slow cell is no hang, and the hang in the next one is named."""
    from .load import cpu_hog

    with cpu_hog(seconds=300):
        said = run_notebook([
            START,
            "%%dist\nimport time\nx = torch.ones(1)\nfor _ in range(20):\n    dist.all_reduce(x)\n"
            "    time.sleep(0.2 * rank)\nprint('sum', x.item())",
            "%%dist\nif rank == 1:\n    dist.all_reduce(x)",
        ], tmp_path, marker, timeout=240)
    _, slow, hung = said
    assert slow["error"] is None and slow["out"].count("sum") == 3, slow
    assert f"Rank 1 waits in all_reduce #22 for ranks 0, 2, which have ended cell [{hung['count']}] without it" in \
        hung["error"], hung


@pytest.mark.local
def test_a_rank_that_dies_in_a_cell_is_named_with_how_and_where(tmp_path: Path, marker: str) -> None:
    said = run_notebook([
        START,
        "%%dist\nimport os\nif rank == 2:\n    os._exit(3)\nx = torch.ones(1)\ndist.all_reduce(x)",
    ], tmp_path, marker)
    error = said[1]["error"]
    assert error is not None, said[1]
    cell = f"cell [{said[1]['count']}]"
    assert f"Rank 2 (local) failed first: it exited with status 3 at {cell}:4" in error, error
    assert f"rank 2 (local): exited with status 3 at {cell}:4" in error, error


@pytest.mark.local
def test_a_kernel_that_goes_away_leaves_no_rank_behind(tmp_path: Path, marker: str) -> None:
    """No %lab stop: the kernel ends, and its ranks with it (the marker fixture finds none left)."""
    said = run_notebook([START, "%%dist\nprint('up', rank)"], tmp_path, marker)
    assert said[1]["out"].count(" up ") == 3, said


@pytest.mark.local
def test_the_ranks_form_their_group_by_the_init_method_asked_for(tmp_path: Path, marker: str) -> None:
    said = run_notebook([
        "%load_ext lab.notebook\n%lab start --nproc 2 --init tcp",
        "%%dist\nx = torch.ones(1)\ndist.all_reduce(x)\nprint('sum', x.item())",
        "%lab stop\n%lab start --nproc 2 --init file",
        "%%dist\nx = torch.ones(1)\ndist.all_reduce(x)\nprint('sum', x.item())",
        "%lab stop",
    ], tmp_path, marker)
    assert "formed their group (gloo, tcp://)" in said[0]["out"] and said[1]["out"].count("sum 2.0") == 2, said
    assert "formed their group (gloo, file://)" in said[2]["out"] and said[3]["out"].count("sum 2.0") == 2, said


def test_a_file_rendezvous_across_hosts_that_share_no_folder_is_refused_in_one_line() -> None:
    from lab.inventory.model import Host, Inventory
    from lab.notebook.session import notebook_plan

    hosts = Inventory("hosts.yaml", (Host("a", "10.0.0.1", slots=1), Host("b", "10.0.0.2", slots=1)))
    with pytest.raises(UsageError, match=r"^--init file: the hosts share no folder"):
        notebook_plan(hosts, init="file")


@pytest.mark.local
def test_a_mistake_in_a_magic_is_one_line_and_no_traceback(tmp_path: Path, marker: str) -> None:
    said = run_notebook([
        "%load_ext lab.notebook",
        "%%dist\nprint(1)",
        "%lab start --nproc 0",
        "%lab launch",
        "%lab start --nproc 2 --hang-after 3\n",
        "%%dist --ranks 5\nprint(1)",
        "%lab start --nproc 2",
        "%lab stop",
    ], tmp_path, marker)
    _, early, zero, unknown, _, beyond, again, _ = said
    assert early["error"] == "lab: no ranks: %lab start --nproc N (or --hosts INVENTORY) first", early
    assert zero["error"] == "lab: --nproc must be at least 1, got 0", zero
    assert unknown["error"] == ("lab: %lab launch: not a command of the notebook's: start, restart, pull, check, "
                                "trace, stop, status"), unknown
    assert beyond["error"] == "lab: --ranks 5: the ranks are 0 to 1", beyond
    assert again["error"] == "lab: the notebook's 2 ranks are running: %lab stop first (or %lab restart)", \
        again


# -- the parts, without a kernel ----------------------------------------------------------------


def _state(rank: int, cell: Cell | None) -> RankState:
    from lab.core.outcome import LaunchState
    from lab.core.plan import Launch

    return RankState(RankSpec(rank, rank, "local", "cpu", {}), LaunchState(Launch("local", (rank,), (), {}), "lab"),
                     cell=cell)


def test_a_rank_waits_for_its_next_cell_once_it_ended_the_newest_or_was_not_sent_it() -> None:
    def cell(rank: int, n: int, ended: bool, ranks: tuple[int, ...] = (0, 1, 2)) -> Cell:
        return Cell(rank, n, f"cell [{n}]", ended, ranks)

    states = [_state(0, cell(0, 4, False)), _state(1, cell(1, 4, True)), _state(2, cell(2, 3, True))]
    assert [r in between_cells(states) for r in range(3)] == [False, True, False]  # (2 has not begun 4)
    states = [_state(0, cell(0, 5, False, (0,))), _state(1, cell(1, 4, True)), _state(2, None)]
    assert [r in between_cells(states) for r in range(3)] == [False, True, False]  # (2: no cell yet)
    assert between_cells([_state(0, None)]) == {}


def test_a_launcher_that_passes_no_stdin_on_cannot_start_a_notebooks_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launcher added (docs/extending.md) whose hosts' processes pass the controller's stdin to no
    rank could never give the ranks their cells: refused in one line, naming those that can."""
    from lab.core import launchers
    from lab.core.launchers.torchrun import Torchrun
    from lab.inventory.hosts import local_inventory
    from lab.notebook.session import notebook_plan

    class Silent(Torchrun):
        name = "silent"
        passes_stdin = False

    monkeypatch.setitem(launchers.LAUNCHERS, "silent", Silent())
    with pytest.raises(UsageError) as refused:
        notebook_plan(local_inventory(2), launcher="silent", in_place=Path.cwd())
    assert str(refused.value) == ("--launcher silent cannot pass the notebook's cells to its ranks; use lab, torchrun, "
                                  "spawn, srun or srun-torchrun")


def test_a_cell_event_is_checked_as_every_event_is() -> None:
    line = event_line("t0k", "cell", rank=1, n=2, name="cell [5]", ended=True, ranks=[0, 1])
    assert parse_event(line.rstrip("\n"), "t0k") == Cell(1, 2, "cell [5]", True, (0, 1))
    with pytest.raises(MalformedEvent, match="ranks"):
        parse_event(event_line("t0k", "cell", rank=1, n=2, name="x", ended=True, ranks=[-1]).rstrip("\n"), "t0k")


def test_each_cell_shows_its_own_lines_within_the_bound() -> None:
    from lab.core.outcome import SHOWN_LINES

    output = Output()
    counts = [output.add("x", 2) for _ in range(SHOWN_LINES + 5)]
    assert counts[-1] == SHOWN_LINES + 5 and output.shown == SHOWN_LINES
    output.new_window()
    assert output.add("y", 2) == 1 and output.shown == SHOWN_LINES + 1 and output.lines == SHOWN_LINES + 6


P2P_RUN = (Path(__file__).parents[1] / "lab" / "suite" / "exercises" / "p2p.py").read_text().split('"""', 2)[2]


@pytest.mark.local
def test_an_exercise_is_checked_from_a_cell_with_the_functions_the_notebook_defined(tmp_path: Path,
                                                                                    marker: str) -> None:
    """%lab check runs the exercise as `lab run --solution` would, with the notebook's definitions, on its cluster."""
    said = run_notebook([
        "%load_ext lab.notebook\n%lab start --nproc 2",
        f"%%dist\n{P2P_RUN}",
        "%lab check p2p",
        "%%dist\ndef run(rank, size, device):\n    return {'pair': 1.0, 'ring': 5.0}",
        "%lab check p2p",
        "%lab check nonesuch",
        "%lab stop",
    ], tmp_path, marker, timeout=200)
    _, _, passed, _, failed, unknown, _ = said
    assert passed["error"] is None and "PASS    p2p" in passed["out"], passed
    assert "FAIL    p2p" in failed["out"] and "expected 1.0, got 5.0" in failed["out"], failed
    assert failed["error"] == "lab: p2p: not passed with this notebook's run (lab run's exit code 1)", failed
    assert unknown["error"].startswith("lab: unknown exercise 'nonesuch'"), unknown


def _cells(*sources: str) -> list[NotebookCell]:
    return [NotebookCell(f"cell [{n}]", source) for n, source in enumerate(sources, 1)]


def test_a_notebook_s_solution_is_its_imports_definitions_and_constants_the_last_definition_winning() -> None:
    taken = extract(_cells("%load_ext lab.notebook\n%lab start --nproc 2",
                           "%%dist\nimport torch\nN = 3\ndef run(rank, size, device):\n    return 1\nrun(0, 1, 'cpu')",
                           "%%bash\nrm -rf /", "def broken(:\n    pass", "import os\nos._exit(3)",
                           "@functools.cache\ndef run(rank, size, device):\n    return N\nlimit = len('x')"),
                    "hw.ipynb")
    assert taken.defines == ("run",)
    assert taken.notes == ("cell [4] is not Python (invalid syntax, line 1): skipped",)
    body = taken.source.split('"""', 2)[2]
    assert body == ("\nimport torch.distributed as dist\nimport torch\nimport os\n\n\n# cell [2]\nN = 3\n\n\n"
                    "# cell [6]\n@functools.cache\ndef run(rank, size, device):\n    return N\n"), body


def test_the_cells_marked_as_the_answer_are_the_only_ones_taken(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("def run():\n    return 'draft'"),
                      nbformat.v4.new_code_cell("def run():\n    return 'answer'", metadata={"tags": ["solution"]}),
                      nbformat.v4.new_code_cell("import math", metadata={"nbgrader": {"solution": True}}),
                      nbformat.v4.new_markdown_cell("def run(): no code of a markdown cell")]
    nbformat.write(notebook, tmp_path / "hw.ipynb")
    taken = extract(read_cells(tmp_path / "hw.ipynb"), "hw.ipynb")
    assert "'answer'" in taken.source and "'draft'" not in taken.source and "import math" in taken.source


def test_a_cell_nested_past_what_python_reads_is_skipped_and_said() -> None:
    taken = extract(_cells("x = " + "[" * 200_000 + "]" * 200_000, "def run():\n    return 1", "a = 1\0"),
                    "hw.ipynb")
    assert taken.defines == ("run",) and len(taken.notes) == 2 and all("skipped" in n for n in taken.notes), taken


@pytest.mark.parametrize("text, said", [
    ("[" * 100_000 + "]" * 100_000, "hw.ipynb: not a notebook (JSON nested too deep to read)"),
    ("{not json", "hw.ipynb: not a notebook (not JSON: "),
    ('{"cells": 3}', "hw.ipynb: not a notebook (no list of cells)"),
    ("[]", "hw.ipynb: not a notebook (no list of cells)"),
])
def test_a_file_that_is_no_notebook_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    (tmp_path / "hw.ipynb").write_text(text)
    with pytest.raises(UsageError) as raised:
        read_cells(tmp_path / "hw.ipynb")
    assert str(raised.value).startswith(said) and "\n" not in str(raised.value)


NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))


def run_tutorial(path: Path, folder: Path, env: dict[str, str]) -> list[tuple[str, str]]:
    """Run a tutorial notebook top to bottom as a student would (a failed cell fails it: CellExecutionError),
    in ``folder``; each ``%lab check`` cell's exercise and what it printed."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(folder)}})
    client.execute(env={**os.environ, **env})
    return [(cell.source.split()[2], "".join(o.get("text", "") for o in cell.outputs))
            for cell in notebook.cells if cell.cell_type == "code" and cell.source.startswith("%lab check")]


@pytest.mark.local
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_tutorial_notebook_runs_top_to_bottom_and_passes_its_checks(path: Path, tmp_path: Path,
                                                                         marker: str) -> None:
    checks = run_tutorial(path, tmp_path, {"LAB_TEST_MARKER": marker})
    assert checks, path
    for exercise, said in checks:
        assert f"PASS    {exercise}" in said, (exercise, said)


@pytest.mark.local
def test_a_dist_cell_run_in_jupyterlab_in_a_real_browser_shows_each_rank_s_lines(tmp_path: Path, marker: str) -> None:
    """JupyterLab's own page, in headless Chromium: Run All, and the page shows each rank's group (the
    screenshot is docs/images/notebook.png's)."""
    from .jupyterlab import run_all_in_jupyterlab
    from .test_grade import chromium

    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
        "%load_ext lab.notebook\n%lab start --nproc 4",
        "%%dist\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\nprint('sum', x.item())",
        "%lab stop")]
    nbformat.write(notebook, tmp_path / "demo.ipynb")
    text, groups = run_all_in_jupyterlab(tmp_path, "demo.ipynb", chromium(), {"LAB_TEST_MARKER": marker},
                                         "rank(s) ended", tmp_path / "notebook.png")
    assert "4 rank(s) on local formed their group (gloo, env://)" in text, text
    assert groups == 4 and [f"local r{r}" in text for r in range(4)] == [True] * 4, text
    assert text.count("sum 10.0") == 4, text
    assert (tmp_path / "notebook.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
