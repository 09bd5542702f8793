"""Slurm in the container lab (``lab up --scheduler slurm``): real slurmctld, slurmd and munge in
unprivileged lab hosts, a job across them; the pieces ``lab up`` writes, without a cluster."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from lab.containerlab import resources, slurm, state
from lab.containerlab.topology import Topology
from lab.errors import UsageError

from .conftest import DDP_SERIES, REPO, Lab, assert_ddp_series_trained
from .test_lab_docker import _client, inventory_variant, workers_on
from .test_notebook import run_notebook
from .test_train_programs import OTHER_LAUNCHERS
from .test_why_fixtures import assert_report_names_the_cause
from .tutorials import assert_prints_as_shown, tutorial_scripts

NAME = "slurmt"


def test_slurm_conf_describes_the_labs_hosts() -> None:
    conf = slurm.slurm_conf(Topology(3, 2, lab="class-a", scheduler="slurm"))
    lines = conf.splitlines()
    assert "ClusterName=class-a" in lines and "SlurmctldHost=node1" in lines
    assert "NodeName=node[1-3] CPUs=2 State=UNKNOWN" in lines
    assert "PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP" in lines
    assert "AuthType=auth/munge" in lines and "ProctrackType=proctrack/linuxproc" in lines
    assert "NodeName=node1 CPUs=1 State=UNKNOWN" in slurm.slurm_conf(Topology(1, 1, scheduler="slurm"))


def test_the_munge_key_is_made_once_and_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(state.STATE_VAR, str(tmp_path / "state"))
    key = slurm.ensure_munge_key(state.lab_dir("x") / "munge.key")
    first = key.read_bytes()
    assert len(first) == slurm.MUNGE_KEY_BYTES and os.stat(key).st_mode & 0o777 == 0o600
    assert slurm.ensure_munge_key(key).read_bytes() == first  # kept
    os.chmod(key, 0o644)  # (others could have read it: refused, not quietly made private again)
    with pytest.raises(state.StateError, match="has mode 0644: others may reach it"):
        slurm.ensure_munge_key(key)


def test_slurm_needs_the_plain_topology() -> None:
    with pytest.raises(UsageError, match="--scheduler slurm needs --topology plain"):
        Topology(2, 1, "cross-vpc", scheduler="slurm")


@pytest.fixture(scope="module")
def slurm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Path]]:
    client = _client()
    lab = Lab()
    inventory = tmp_path_factory.mktemp("slurm") / "slurmt.inventory.yaml"
    result = lab("up", "--name", NAME, "--hosts", "2", "--slots", "2", "--scheduler", "slurm", "--no-smoke",
                 "--inventory", str(inventory), timeout=1500)
    assert result.code == 0, result.text[-4000:]
    yield lab, inventory
    result = lab("down", "--name", NAME, timeout=300)
    assert result.code == 0, result.text
    assert resources.lab_containers(client, NAME) == []


def in_host(node: int, *command: str, user: str = "root") -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", "exec", "--user", user, f"{NAME}-node{node}", *command], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.docker
def test_every_host_is_an_idle_slurm_node_and_a_job_runs_across_them(slurm_lab: tuple[Lab, Path]) -> None:
    sinfo = in_host(1, *slurm.SINFO)
    assert sorted(sinfo.stdout.split()) == sorted(["node1", "idle", "node2", "idle"]), sinfo
    daemons = {node: in_host(node, "ps", "-eo", "user=,comm=").stdout.split("\n") for node in (1, 2)}
    for node, lines in daemons.items():
        running = {tuple(line.split()) for line in lines if line.strip()}
        assert ("munge", "munged") in running and ("root", "slurmd") in running, (node, running)
        assert (("slurm", "slurmctld") in running) == (node == 1), (node, running)
    job = in_host(1, "srun", "--nodes", "2", "--ntasks-per-node", "2", "sh", "-c",
                  'echo "$(hostname) $SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $(id -un)"', user="lab")
    assert job.returncode == 0, job.stderr
    assert sorted(job.stdout.splitlines()) == ["node1 0 0 0 lab", "node1 1 1 0 lab", "node2 2 0 1 lab",
                                               "node2 3 1 1 lab"]


@pytest.mark.docker
def test_the_munge_key_is_the_labs_own_and_nobody_elses(slurm_lab: tuple[Lab, Path]) -> None:
    _, inventory = slurm_lab
    key = state.lab_dir(NAME) / "munge.key"
    assert os.stat(key).st_mode & 0o777 == 0o600
    packaged = in_host(1, "ls", "-A", "/etc/munge", user="munge")  # (root here may not read munge's own)
    assert packaged.returncode == 0 and packaged.stdout == "", packaged  # no key in the image
    assert in_host(1, "stat", "-c", "%U %a", "/run/lab-munge/munge.key").stdout.split() == ["munge", "400"]
    assert in_host(2, "cat", "/run/lab-munge/munge.key", user="lab").returncode != 0
    same = {in_host(node, "md5sum", "/run/lab-munge/munge.key", user="munge").stdout.split()[0] for node in (1, 2)}
    assert same == {hashlib.md5(key.read_bytes()).hexdigest()}  # the lab's key, on every host
    listed = slurm_lab[0]("ls")
    rows = [[cell for cell in line.split() if cell != "\u2502"] for line in listed.out.splitlines()]
    assert [NAME, "plain", "slurm"] in [row[:3] for row in rows], listed.out


def doctor(lab: Lab, inventory: Path) -> tuple[int, dict]:
    result = lab("doctor", "--hosts", str(inventory), "--json")
    return result.code, json.loads(result.out)


@pytest.mark.docker
def test_status_and_doctor_name_a_host_with_another_munge_key_and_up_mends_it(slurm_lab: tuple[Lab, Path]) -> None:
    lab, inventory = slurm_lab
    status = ("status", "--name", NAME)
    healthy = lab(*status)
    assert healthy.code == 0 and healthy.out.count("the lab's") == 2, healthy.text
    code, diagnosis = doctor(lab, inventory)
    assert code == 0 and "Slurm: slurmctld on node1 answers; 2 node(s) idle" in json.dumps(diagnosis)
    other_key = subprocess.run(["docker", "exec", "-i", f"{NAME}-node2", "/usr/local/bin/lab-slurm-start"],
                               input=os.urandom(slurm.MUNGE_KEY_BYTES), capture_output=True, timeout=60)
    try:
        assert other_key.returncode == 0, other_key.stderr
        broken = lab(*status)
        assert broken.code == 3, broken.text
        assert "lab: node2: its munge key is not the lab's" in " ".join(broken.out.split()), broken.out
        code, diagnosis = doctor(lab, inventory)
        assert code == 1
        assert [(f["subject"], f["message"]) for f in diagnosis["findings"] if f["check"] == "slurm"] == [
            ("node2", "munge there cannot decode a credential made on node1: unmunge: Error: Invalid credential")]
    finally:  # (mended whatever was asserted: the module's other tests share this lab)
        mended = lab("up", "--name", NAME, "--hosts", "2", "--slots", "2", "--scheduler", "slurm", "--no-smoke",
                     "--inventory", str(inventory), timeout=600)
    assert mended.code == 0, mended.text[-3000:]
    assert lab(*status).code == 0
    job = in_host(1, "srun", "--nodes", "2", "hostname", user="lab")
    assert sorted(job.stdout.split()) == ["node1", "node2"], job


def assert_nothing_left() -> None:
    """No job in squeue (one that ended may be completing for some seconds), no process of a run
    on either host (a task of a job that ended may take as long to exit, on a busy machine)."""
    deadline = time.monotonic() + 30
    while (listed := in_host(1, "squeue", "--noheader").stdout.strip()) and time.monotonic() < deadline:
        assert all(line.split()[4] == "CG" for line in listed.splitlines()), listed  # (ended, completing)
        time.sleep(1)
    assert listed == ""
    while (left := {node: workers_on(f"{NAME}-node{node}") for node in (1, 2)}) != {1: [], 2: []} and \
            time.monotonic() < deadline + 30:
        time.sleep(1)
    assert left == {1: [], 2: []}


@pytest.mark.docker
@pytest.mark.parametrize("launcher", ["srun", "srun-torchrun"])
def test_run_all_with_the_ranks_as_slurm_tasks(slurm_lab: tuple[Lab, Path], launcher: str) -> None:
    lab, inventory = slurm_lab
    result = lab("run", "all", "--hosts", str(inventory), "--launcher", launcher, "--json", timeout=600)
    report = json.loads(result.out)
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (result.code, failed) == (0, {}), result.err[-3000:]
    # srun placed two tasks on each node (or one torchrun per node started two ranks), block by block
    placed = [(r["host"], r["hostname"]) for r in sorted(report["ranks"], key=lambda r: r["rank"])]
    assert placed == [("node1", "node1")] * 2 + [("node2", "node2")] * 2
    assert_nothing_left()


@pytest.mark.docker
def test_the_tutorials_scripts_run_unchanged_under_srun_torchrun(slurm_lab: tuple[Lab, Path],
                                                                 tmp_path: Path) -> None:
    """Tutorial 002's own form: ``srun torchrun --nnodes=2 --nproc_per_node=N/2 --rdzv_backend c10d``."""
    lab, inventory = slurm_lab
    for script in tutorial_scripts(tmp_path):
        n = script.nproc
        hosts = inventory_variant(tmp_path, 2, n // 2, source=inventory)
        result = lab("launch", "--hosts", str(hosts), "--launcher", "srun-torchrun", "--timeout", "120",
                     str(script.path), timeout=300)
        assert result.code == 0, result.text[-3000:]
        assert f"{script.name}: {n} of {n} ranks succeeded" in result.out
        assert f"[node2 r{n - 1}] " in result.out
        assert_prints_as_shown(script, result.out)
    assert_nothing_left()


@pytest.mark.docker
def test_a_real_project_runs_as_slurm_tasks(slurm_lab: tuple[Lab, Path], tmp_path: Path) -> None:
    """tests/projects/ddp_series (a package, a config and a data file beside its script) under srun."""
    lab, inventory = slurm_lab
    result = lab("launch", "--hosts", str(inventory_variant(tmp_path, 2, 1, source=inventory)), "--launcher", "srun",
                 "--env", "SERIES_TAG=series-1", "--timeout", "120", str(DDP_SERIES / "train.py"), "--epochs", "2",
                 timeout=300)
    assert result.code == 0, result.text[-3000:]
    assert_ddp_series_trained(result.out, 2)
    assert_nothing_left()


@pytest.mark.docker
@pytest.mark.parametrize("launcher", ["srun", "srun-torchrun"])
def test_a_notebooks_ranks_are_the_tasks_of_a_slurm_job_and_a_hang_among_them_is_named(
        slurm_lab: tuple[Lab, Path], tmp_path: Path, launcher: str) -> None:
    """%lab start --launcher srun (srun-torchrun): the ranks are one Slurm job's tasks (or its torchrun
    agents' ranks); srun passes the notebook's line to every task, each task's launcher on to its ranks."""
    _, inventory = slurm_lab
    said = run_notebook([
        f"%load_ext lab.notebook\n%lab start --hosts {inventory} --launcher {launcher} --hang-after 3",
        "%%dist\nimport socket\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\n"
        "print(socket.gethostname(), x.item())",
        "%%dist\nif rank == 0:\n    dist.all_reduce(x)",
    ], tmp_path, f"slurm-notebook-{launcher}", timeout=240)
    start, summed, hung = said
    assert start["error"] is None and "4 rank(s) on node1, node2 formed their group (gloo, env://)" in start["out"], \
        start
    assert sorted(re.findall(r"\[node\d r(\d)\] (node\d) 10\.0", summed["out"])) == [
        ("0", "node1"), ("1", "node1"), ("2", "node2"), ("3", "node2")], summed
    assert re.search(rf"Rank 0 waits in all_reduce #\d+ for ranks 1-3, which have ended cell \[{hung['count']}\] "
                     "without it", hung["error"] or ""), hung
    assert_nothing_left()


HANGS = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(3600)
dist.barrier()
"""


@pytest.mark.docker
def test_a_hung_job_is_stopped_at_the_timeout_and_cancelled(slurm_lab: tuple[Lab, Path], tmp_path: Path) -> None:
    lab, inventory = slurm_lab
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    result = lab("launch", "--hosts", str(inventory), "--launcher", "srun", "--timeout", "20", str(script))
    assert result.code == 4, result.text[-3000:]
    assert "rank 1 (node1) stopped after 20s at hangs.py:6 in <module>: time.sleep(3600)" in result.out
    assert "rank 3 (node2) stopped after 20s at hangs.py:7 in <module>: dist.barrier()" in result.out
    assert_nothing_left()


@pytest.mark.docker
@pytest.mark.parametrize("path", OTHER_LAUNCHERS, ids=lambda p: p.stem)
def test_why_a_job_of_slurm_tasks_hangs_or_crashes_is_named(slurm_lab: tuple[Lab, Path], path: Path) -> None:
    """Issues 27 and 40 with the ranks as the tasks of one Slurm job (2 nodes, 2 tasks each)."""
    lab, inventory = slurm_lab
    assert_report_names_the_cause(lab, path, "--hosts", str(inventory), "--launcher", "srun")
    assert_nothing_left()


@pytest.mark.docker
def test_a_task_that_exits_fails_its_rank_and_ends_the_job(slurm_lab: tuple[Lab, Path]) -> None:
    lab, inventory = slurm_lab
    exits = REPO / "tests" / "class" / "ring" / "grace.py"  # rank 1 leaves with os._exit(0) mid-exercise
    result = lab("run", "ring-allreduce", "--solution", str(exits), "--hosts", str(inventory), "--launcher", "srun")
    assert result.code == 1, result.text[-3000:]
    assert "rank 1 (node1) exited with status 0 during ring-allreduce, before reporting its result" in result.out
    assert_nothing_left()


@pytest.mark.docker
def test_ctrl_c_cancels_the_job(slurm_lab: tuple[Lab, Path], tmp_path: Path) -> None:
    lab, inventory = slurm_lab
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    proc = subprocess.Popen(lab.argv("launch", "--hosts", str(inventory), "--launcher", "srun-torchrun",
                                     "--timeout", "300", str(script)), cwd=REPO, env=lab.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while "R" not in in_host(1, "squeue", "--noheader", "--format=%t").stdout.split():
            assert time.monotonic() < deadline and proc.poll() is None, "the job never ran"
            time.sleep(0.5)
        time.sleep(3)  # (the ranks are in the rendezvous, or past it)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert_nothing_left()


@pytest.mark.docker
def test_slurms_refusals_are_one_line_each_with_its_exit_code(slurm_lab: tuple[Lab, Path]) -> None:
    lab, inventory = slurm_lab
    no_partition = lab("run", "p2p", "--hosts", str(inventory), "--launcher", "srun", "--partition", "nosuch")
    assert no_partition.code == 2, no_partition.text
    assert no_partition.err.strip().splitlines()[-1] == \
        "lab: error: host node1: Slurm refused the job: Invalid partition name specified"
    assert in_host(1, "scontrol", "update", "nodename=node2", "state=drain", "reason=lab-test").returncode == 0
    try:
        drained = lab("run", "p2p", "--hosts", str(inventory), "--launcher", "srun", "--timeout", "5")
        code, diagnosis = doctor(lab, inventory)
    finally:
        assert in_host(1, "scontrol", "update", "nodename=node2", "state=resume").returncode == 0
    assert drained.code == 3, drained.text
    error = drained.err.strip().splitlines()[-1]
    assert error.startswith("lab: error: host node1: Slurm refused the job: ") and "drained" in error, error
    found = [f for f in diagnosis["findings"] if f["check"] == "slurm"]
    assert code == 1 and [(f["subject"], f["message"]) for f in found] == [("node2", "Slurm has the node drained")]
    assert "scontrol update nodename=node2 state=resume" in found[0]["fix"]
    assert_nothing_left()


def controller_archive(path: Path) -> Path:
    """The lab as a clone of it holds it (the package and requirements.txt) with the controller's
    dependencies (requirements.txt's but what the hosts have and `bench --plot`'s matplotlib) from
    this interpreter's site-packages (the hosts' Python is this one's minor version: a cluster's
    users install them with pip), as a tar to unpack on a host."""
    needed = [re.split(r"[ ;<>=!~\[(]", line)[0] for line in (REPO / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    files, seen, wanted = [], set(), [n for n in needed if n not in ("torch", "numpy", "matplotlib")]  # (hosts'; lazy)
    while wanted:
        try:
            dist = metadata.distribution(wanted.pop())
        except metadata.PackageNotFoundError:  # (a dependency of another platform's)
            continue
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        wanted += [re.split(r"[ ;<>=!~\[(]", r)[0] for r in dist.requires or [] if "extra ==" not in r]
        files += [(Path(str(f.locate())), str(f)) for f in dist.files or [] if not str(f).startswith("..")]
    with tarfile.open(path, "w") as tar:
        for local, name in files:
            if local.is_file():
                tar.add(str(local), arcname=name)
        tar.add(str(REPO / "lab"), arcname="lab", filter=lambda t: None if "__pycache__" in t.name else t)
        tar.add(str(REPO / "requirements.txt"), arcname="requirements.txt")
    return path


CONTROLLER = "/tmp/ctl"  # where node1 has the lab itself (the controller), for the lab user


@pytest.fixture(scope="module")
def controller_on_node1(slurm_lab: tuple[Lab, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The lab and its dependencies on node1, as a cluster's user has them on the login host."""
    info = sys.version_info
    assert in_host(1, "lab-python", "-c", "import sys; print(sys.version_info[:2])").stdout.strip() == \
        str((info.major, info.minor)), "the controller's dependencies are copied from this Python's"
    archive = controller_archive(tmp_path_factory.mktemp("controller") / "lab.tar")
    unpack = subprocess.run(["docker", "exec", "-i", "--user", "lab", f"{NAME}-node1", "sh", "-c",
                             f"rm -rf {CONTROLLER} && mkdir {CONTROLLER} && tar -x -C {CONTROLLER}"],
                            input=archive.read_bytes(), capture_output=True, timeout=300)
    assert unpack.returncode == 0, unpack.stderr
    yield
    in_host(1, "rm", "-rf", CONTROLLER, "/shared/jobs", user="lab")


def lab_on_node1(*args: str, before: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``python -m lab ARGS`` on node1 as the lab user (after ``before``: salloc, timeout...)."""
    return in_host(1, *before, "env", f"PYTHONPATH={CONTROLLER}", f"XDG_STATE_HOME={CONTROLLER}/state",
                   "LAB_SHARED_DIR=/shared", "lab-python", "-m", "lab", *args, user="lab")


@pytest.mark.docker
@pytest.mark.usefixtures("controller_on_node1")
def test_hosts_slurm_runs_on_the_nodes_of_an_allocation() -> None:
    """The lab itself on node1, as the lab user inside ``salloc -N2 --ntasks-per-node=2``: the
    allocation's nodes are the hosts, reached by job steps; the ranks are Slurm tasks (the default
    there) or forked by the lab's zygote on each node."""
    for launcher, exercises in ((None, ["all"]), ("lab", ["p2p", "launchers", "init-file"])):
        run = lab_on_node1("run", *exercises, "--hosts", "slurm", *(("--launcher", launcher) if launcher else ()),
                           "--json", before=("salloc", "--nodes=2", "--ntasks-per-node=2"))
        assert run.returncode == 0, run.stderr[-3000:]
        report = json.loads(run.stdout)
        assert report["plan"]["launcher"] == (launcher or "srun")
        assert [e["name"] for e in report["exercises"] if e["status"] == "pass"] == \
            [e["name"] for e in report["exercises"]] and len(report["exercises"]) >= 3
        assert [h["connection"] for h in report["plan"]["hosts"]] == ["slurm", "slurm"]
        placed = [r["hostname"] for r in sorted(report["ranks"], key=lambda r: r["rank"])]
        assert placed == ["node1", "node1", "node2", "node2"]
    assert_nothing_left()


NOTEBOOK_ON_NODE1 = """\
import nbformat
from nbclient import NotebookClient
notebook = nbformat.v4.new_notebook()
notebook.cells = [nbformat.v4.new_code_cell(source) for source in (
    "%load_ext lab.notebook\\n%lab start --hosts slurm --hang-after 3",
    "%%dist\\nimport socket\\nx = torch.tensor([rank + 1.0])\\ndist.all_reduce(x)\\n"
    "print(socket.gethostname(), x.item())",
    "%lab stop")]
NotebookClient(notebook, timeout=180, kernel_name="python3", allow_errors=True).execute()
for cell in notebook.cells:
    for output in cell.outputs:
        print(output.get("text") or output.get("data", {}).get("text/plain") or "\\n".join(output.get("traceback", [])))
"""


@pytest.mark.docker
@pytest.mark.usefixtures("controller_on_node1")
def test_a_notebook_inside_an_allocation_runs_its_cells_on_the_allocations_nodes() -> None:
    """A notebook's kernel on node1 as the lab user inside ``salloc -N2 --ntasks-per-node=2`` (nbclient, a
    real IPython kernel): `%lab start --hosts slurm` starts the ranks as the allocation's tasks (srun,
    the default there), and a cell runs on all four."""
    done = in_host(1, "salloc", "--nodes=2", "--ntasks-per-node=2", "sh", "-c",
                   f"mkdir -p /tmp/nb && cd /tmp/nb && echo '{{}}' > lesson.ipynb && exec env PYTHONPATH={CONTROLLER} "
                   f"XDG_STATE_HOME={CONTROLLER}/state LAB_SHARED_DIR=/shared lab-python -c \"$0\"", NOTEBOOK_ON_NODE1,
                   user="lab")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4 rank(s) on node1, node2 formed their group (gloo, env://)" in done.stdout, done.stdout[-3000:]
    assert sorted(re.findall(r"\[node\d r(\d)\] (node\d) 10\.0", done.stdout)) == [
        ("0", "node1"), ("1", "node1"), ("2", "node2"), ("3", "node2")], done.stdout[-3000:]
    assert "the notebook's 4 rank(s) ended" in done.stdout, done.stdout[-3000:]
    in_host(1, "rm", "-rf", "/tmp/nb", user="lab")
    assert_nothing_left()


@pytest.mark.docker
@pytest.mark.usefixtures("controller_on_node1")
def test_submit_runs_the_exercises_as_a_batch_job() -> None:
    waited = lab_on_node1("submit", "p2p", "all-reduce", "--nodes", "2", "--ntasks-per-node", "2",
                          "--out", "/shared/jobs", "--wait")
    assert waited.returncode == 0, waited.stderr[-3000:]
    job = re.search(r"submitted batch job (\d+)", waited.stderr)
    assert job, waited.stderr
    assert "PASS    p2p" in waited.stdout and "2 passed, 0 failed" in waited.stdout  # the run's report
    junit = in_host(1, "cat", f"/shared/jobs/lab-{job[1]}.xml", user="lab").stdout
    assert 'tests="2"' in junit and 'failures="0"' in junit, junit
    queued = lab_on_node1("submit", "p2p", "--nodes", "2", "--out", "/shared/jobs")
    assert queued.returncode == 0 and (job := re.search(r"submitted batch job (\d+)", queued.stderr)), queued.stderr
    deadline = time.monotonic() + 120  # it runs without anyone waiting for it
    while in_host(1, "squeue", "--noheader", f"--jobs={job[1]}", "--format=%t").stdout.strip() not in ("", "CG"):
        assert time.monotonic() < deadline, "the batch job did not end"
        time.sleep(1)
    assert_nothing_left()
    assert "1 passed, 0 failed" in in_host(1, "cat", f"/shared/jobs/slurm-{job[1]}.out", user="lab").stdout


@pytest.mark.docker
@pytest.mark.usefixtures("controller_on_node1")
def test_submit_never_waits_for_a_job_that_cannot_run_and_ctrl_c_cancels_one() -> None:
    refused = lab_on_node1("submit", "p2p", "--partition", "nosuch", "--out", "/shared/jobs", "--wait")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == \
        "lab: error: sbatch: Slurm refused the job: Invalid partition name specified"
    too_big = lab_on_node1("submit", "p2p", "--nodes", "3", "--out", "/shared/jobs", "--wait")
    assert too_big.returncode == 2, too_big.stderr
    # (slurmctld gives either reason for more nodes than the partition has, as its scheduler sees it first)
    assert re.search(r"Slurm can never run it as asked \((PartitionNodeLimit|PartitionConfig)\): it was cancelled",
                     too_big.stderr), too_big.stderr
    assert in_host(1, "salloc", "--no-shell", "--nodes=2", "--ntasks-per-node=2", "--job-name=blocker",
                   user="lab").returncode == 0
    try:  # the job waits for nodes another job holds, and Ctrl-C (SIGINT) comes
        interrupted = lab_on_node1("submit", "p2p", "--out", "/shared/jobs", "--wait",
                                   before=("timeout", "--signal=INT", "8"))
        assert "lab: interrupted" in interrupted.stderr, interrupted.stderr
        assert in_host(1, "squeue", "--noheader", "--format=%j").stdout.split() == ["blocker"]
    finally:
        in_host(1, "scancel", "--name=blocker", user="lab")
    assert_nothing_left()
