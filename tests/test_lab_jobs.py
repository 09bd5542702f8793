"""The container lab's hosts running jobs: every exercise, the tutorials' scripts, a real project,
torchrun's restarts, another transport and a class graded on shares, across the four hosts of a lab
of their own name (``jobs``). These tests only run jobs on it and leave it as they found it, so they
run beside the tests of the default lab, which change that one (up, down, faults, shaped links): see
test_lab_docker, whose helpers they share.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lab.containerlab import containers, resources, sharehosts, topology

from .conftest import DDP_SERIES, REPO, TOKENIZED, WRONG, Lab, assert_ddp_series_trained
from .test_lab_docker import _client, assert_no_workers_anywhere, inventory_variant, run_json
from .test_launchers import FAILS_IN_ITS_FIRST_ATTEMPTS
from .test_local_run import STDIN_ECHO
from .test_notebook import NOTEBOOKS, PID, interrupt_when, run_notebook, run_tutorial
from .tutorials import assert_prints_as_shown, tutorial_scripts
from .wheels import tokenized_project

pytestmark = pytest.mark.docker
RESUME = REPO / "tests" / "projects" / "resume"  # a trainer that checkpoints and resumes
NAME = "jobs"
NAMED = ("up", "down", "status", "net")  # the commands about a lab, which name it


class JobsLab(Lab):
    """The CLI on this module's lab: every command about a lab names it."""

    def argv(self, *args: str) -> list[str]:
        return super().argv(*args, *(("--name", NAME) if args and args[0] in NAMED else ()))


@dataclass(frozen=True)
class Jobs:
    lab: JobsLab
    inventory: Path  # the one its `lab up` wrote
    topology: topology.Topology  # as it runs (its subnet the engine's choice)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    client = _client()
    inventory = tmp_path_factory.mktemp("jobs") / "inventory.yaml"
    lab = JobsLab()
    result = lab("up", "--inventory", str(inventory), timeout=1500)
    assert result.code == 0, result.text[-4000:]
    assert "PASS" in result.out and "p2p" in result.out  # the smoke check ran across the hosts
    yield Jobs(lab, inventory, containers.running_topology(client, NAME))
    result = lab("down", timeout=300)
    assert result.code == 0, result.text
    assert resources.lab_containers(client, NAME) == [] and resources.lab_networks(client, NAME) == []
    assert resources.lab_volumes(client, NAME) == []


def test_run_all_across_four_hosts(jobs: Jobs) -> None:
    code, report = run_json(jobs.lab, "all", "--hosts", str(jobs.inventory))
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    assert [(r["host"], r["hostname"]) for r in report["ranks"]] == [
        (f"node{i}", f"node{i}") for i in jobs.topology.indices()]  # each rank in its own container
    assert_no_workers_anywhere(jobs.topology)


def test_run_all_on_two_hosts_with_two_slots(jobs: Jobs, tmp_path: Path) -> None:
    code, report = run_json(jobs.lab, "all", "--hosts", str(inventory_variant(tmp_path, 2, 2, jobs.inventory)))
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    assert [r["hostname"] for r in report["ranks"]] == ["node1", "node1", "node2", "node2"]
    assert report["plan"]["master_addr"] == jobs.topology.address(1)


def test_the_docker_transport_runs_ranks_by_docker_exec(jobs: Jobs, tmp_path: Path) -> None:
    inventory = tmp_path / "docker.yaml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "docker", "ansible_python_interpreter": topology.PYTHON,
                 "shared_dir": topology.SHARED_DIR, "slots": 2},
        "hosts": {jobs.topology.name(i): {"docker_container": jobs.topology.container(i),
                                          "data_address": jobs.topology.address(i)} for i in (1, 2)}}}))
    code, report = run_json(jobs.lab, "p2p", "all-reduce", "init-file", "--hosts", str(inventory))
    assert code == 0, report
    assert [r["hostname"] for r in report["ranks"]] == ["node1", "node1", "node2", "node2"]
    code, report = run_json(jobs.lab, "p2p", "--hosts", str(inventory), "--timeout", "15",
                            "--solution", str(WRONG / "p2p_never_sends.py"))
    assert code == 4 and "p2p_never_sends.py" in report["exercises"][0]["reason"]
    assert_no_workers_anywhere(jobs.topology)


def test_a_rank_that_raised_on_a_host_is_the_cause_at_its_own_line_never_the_warm_starts(jobs: Jobs) -> None:
    """Each host's launch is forked from its warm server, whose copy of the lab (the image's) lies
    below the run's own in every rank's stack: those frames are the lab's too. Rank 1's exception is
    the cause, at the student's line, not a mismatch against the lab's own barrier "at warm.py"."""
    result = jobs.lab("run", "dsgd", "--hosts", str(jobs.inventory), "--solution",
                      str(WRONG / "dsgd_raises_on_one_rank.py"), "--timeout", "30", "--hang-after", "3", timeout=180)
    headline = next(line for line in result.out.splitlines() if line.startswith("lab: "))
    assert headline.startswith("lab: Rank 1 (node2) failed first: it raised ValueError: rank 1 gives up at "
                               "dsgd_raises_on_one_rank.py:14; "), result.out
    assert "warm.py" not in result.out, result.out
    assert_no_workers_anywhere(jobs.topology)


def test_a_notebook_runs_its_cells_on_the_four_hosts_and_a_hang_across_them_says_why(jobs: Jobs,
                                                                                    tmp_path: Path) -> None:
    """The notebook's ranks on the container lab, reached over SSH as a launch's are: each rank in its own
    container (first started by torchrun's agents, each host's process relaying the cells to its rank;
    then by the lab's own launcher), a value pulled from each, a hang named across the hosts, and
    nothing left on any."""
    said = run_notebook([
        f"%load_ext lab.notebook\n%lab start --hosts {jobs.inventory} --hang-after 3 --launcher torchrun",
        "%%dist\nimport socket\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\n"
        "print(socket.gethostname(), x.item())",
        "xs = %lab pull x\nprint([v.item() for v in xs])",
        "%%dist\nimport pathlib\npathlib.Path(f'from-{rank}.txt').write_text(socket.gethostname())",
        "%lab stop",
        f"%lab start --hosts {jobs.inventory} --hang-after 3 --init file",
        "%%dist\nif rank == 3:\n    dist.all_reduce(torch.ones(1))",
    ], tmp_path, "jobs-notebook")
    started, summed, pulled, wrote, stopped, by_file, hung = said
    assert "formed their group (gloo, file://)" in by_file["out"], by_file  # (a file in the hosts' shared folder)
    # what the ranks wrote in their copies of the notebook's folder came back into it
    assert wrote["error"] is None and "brought back" in stopped["out"], stopped
    assert sorted(p.read_text() for p in tmp_path.glob("from-*.txt")) == ["node1", "node2", "node3", "node4"]
    assert "4 rank(s) on node1, node2, node3, node4 formed their group (gloo, env://)" in started["out"], started
    assert sorted(re.findall(r"\[(node\d) r\d\] (node\d) 10\.0", summed["out"])) == [
        (f"node{i}", f"node{i}") for i in jobs.topology.indices()], summed
    assert pulled["out"] == "[10.0, 10.0, 10.0, 10.0]\n", pulled
    cell = f"cell [{hung['count']}]"
    assert f"Rank 3 waits in all_reduce #2 for ranks 0-2, which have ended {cell} without it" in hung["error"]
    assert f"rank 3 (node4): all_reduce #2, SUM, 1 float at {cell}:3" in hung["error"], hung
    assert_no_workers_anywhere(jobs.topology)


def test_a_notebook_s_rank_stuck_across_the_hosts_is_ended_at_ctrl_c_and_a_restart_replays_the_cells(
        jobs: Jobs, tmp_path: Path) -> None:
    interrupter = interrupt_when(tmp_path, "go", after=3)  # (the kernel's own cell says when the next one starts)
    said = run_notebook([
        PID, f"%load_ext lab.notebook\n%lab start --hosts {jobs.inventory} --hang-after 60",
        "%%dist\nx = torch.tensor([rank + 1.0])\ndist.all_reduce(x)",
        "import pathlib\npathlib.Path('go').touch()",
        "%%dist\nif rank == 0:\n    dist.all_reduce(x)",
        "%lab restart",
        "%%dist\nimport socket\nprint('restored', x.item(), socket.gethostname())",
        "%lab stop",
    ], tmp_path, "jobs-notebook-restart", timeout=240)
    interrupter.join()
    stuck, restarted, restored = said[4], said[5], said[6]
    assert "interrupted; where each rank was:" in stuck["error"], stuck
    assert f"rank 0 (node1): all_reduce #3, SUM, 1 float at cell [{stuck['count']}]:3" in stuck["error"], stuck
    assert f"replayed 1 cell(s): cell [{said[2]['count']}]" in restarted["out"], restarted
    assert sorted(re.findall(r"restored 10\.0 (node\d)", restored["out"])) == [
        f"node{i}" for i in jobs.topology.indices()], restored
    assert_no_workers_anywhere(jobs.topology)


def test_the_tutorial_notebooks_run_top_to_bottom_on_the_four_hosts(jobs: Jobs, tmp_path: Path) -> None:
    for path in NOTEBOOKS:
        folder = tmp_path / path.stem
        folder.mkdir()
        checks = run_tutorial(path, folder, {"LAB_NOTEBOOK_CLUSTER": f"--hosts {jobs.inventory}"})
        assert checks and all(f"PASS    {exercise}" in said for exercise, said in checks), (path.name, checks)
        assert "world size 4" in checks[0][1], checks
    assert_no_workers_anywhere(jobs.topology)


# As root on a host: what of the share users is still there (a file of theirs anywhere they may write, a System V
# IPC object they own or made, memory over 32 MB still charged to a share's group), one line each.
SHARE_REMAINS = r"""
users=$(seq -f 'share%g' 8 | tr '\n' ' ')
for u in $users; do
  uid=$(id -u "$u" 2>/dev/null) || continue
  find /tmp /var/tmp /dev/shm /shared -xdev -mindepth 1 -user "$u" -printf "file: %p\n" 2>/dev/null | head -3
  for f in /proc/sysvipc/shm /proc/sysvipc/sem /proc/sysvipc/msg; do
    awk -v uid="$uid" -v u="$u" 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
      $c["uid"] == uid || $c["cuid"] == uid { print "ipc: " u " " FILENAME " " $2 }' "$f"
  done
  m=/run/lab-groups/memory/$u/memory.usage_in_bytes
  [ ! -r "$m" ] || [ "$(cat "$m")" -le $((32 << 20)) ] || echo "memory: $u holds $(cat "$m") bytes"
done
"""


def share_remains(lab: topology.Topology, i: int) -> str:
    """What the share users left on lab host i, as root there sees it, and in each of its share hosts
    (in the host's mount namespace and the share host's own IPC namespace) ("" when nothing)."""
    doors = [door.container.name for door in sharehosts.running(_client(), lab.lab) if door.host == i]
    return "".join(subprocess.run(["docker", "exec", "-u", "root", container, *enter, "sh", "-c", SHARE_REMAINS],
                                  capture_output=True, text=True, timeout=60).stdout.strip()
                   for container, enter in [(lab.container(i), []), *((door, ["nsenter", "-t", "1", "-m", "--"])
                                                                        for door in doors)])


def test_a_class_graded_across_the_lab_two_shares_at_once(jobs: Jobs, tmp_path: Path) -> None:
    """`lab grade --hosts`: the 4 hosts split in two shares of 2 ranks, a submission on each at
    once; the memory hog stopped by its rank's limit, the fork bomb by its share user's, the
    dishonest ones named for what they did, the daemons gone from every host."""
    from .test_grade import CLASS, EXPECTED, read_grades

    submissions = tmp_path / "class"
    submissions.mkdir()
    expected = {"alice": ("pass", ""), "carol": ("timeout", "carol.py:11 in ring_allreduce"),
                "dave": ("fail", "out of memory (the limit is 768 MB per rank)"), "frank": ("pass", ""),
                "grace": ("fail", "exited with status 0 during ring-allreduce"),
                "ivan": ("fail", "called all_reduce")}
    section_1 = ("mallory", "olga", "peggy", "trent", "victor", "walter", "sybil")
    # (ursula is not among them: with 2 ranks the records she forges are what gloo's all-reduce carries)
    section_2 = ("quentin", "rupert")
    expected.update({s: EXPECTED[s] for s in section_1 + section_2})
    for student in expected:
        (submissions / f"{student}.py").write_text((CLASS / f"{student}.py").read_text())
    # nell hands in a notebook: graded on a share as a .py hand-in is, its other cells never run
    (submissions / "nell.ipynb").write_bytes((CLASS / "nell.ipynb").read_bytes())
    expected["nell"] = EXPECTED["nell"]
    # mallet would kill the reaper above its sleeper, but /proc shows it none of its ancestors (hidepid):
    # it kills its rank, the reaper takes in the sleeper and ends it with the launch (none left below)
    (submissions / "mallet.py").write_text((CLASS.parent / "hosts" / "mallet.py").read_text())
    expected["mallet"] = ("fail", "was killed by SIGKILL during ring-allreduce")
    # oscar forks until its share user's process limit stops it; its children go with its rank
    (submissions / "oscar.py").write_text((CLASS.parent / "hosts" / "oscar.py").read_text())
    expected["oscar"] = ("fail", "raised BlockingIOError: [Errno 11] Resource temporarily unavailable at oscar.py")
    # kate signals every process her share user may, her SSH sessions to the host too: her ranks end
    # (a fail of hers, not a lost host), and she, who outlives her own signal, is swept. Her rank 0 is the
    # cause, whether the word that it began the exercise got out before its launcher went ("during
    # ring-allreduce") or not ("while the others ran ring-allreduce, last heard in the rendezvous")
    (submissions / "kate.py").write_text((CLASS.parent / "hosts" / "kate.py").read_text())
    expected["kate"] = ("fail", "was killed by a signal or lost its connection (no exit status)")
    # nina leaves unreadable folders of memory in /tmp and on the shared volume and a shared memory segment:
    # root's sweep takes them all, and her share grades the next submission as if she had never been
    (submissions / "nina.py").write_text((CLASS.parent / "hosts" / "nina.py").read_text())
    expected["nina"] = ("pass", "")
    out = tmp_path / "book"
    result = jobs.lab("grade", str(submissions), "--exercise", "ring-allreduce", "--hosts", str(jobs.inventory),
                      "--parallel", "2", "--timeout", "15", "--memory", "768", "--out", str(out), timeout=600)
    assert result.code == 0, result.text[-4000:]
    grades = read_grades(out)
    assert {s: grades[s]["verdict"] for s in expected} == {s: v for s, (v, _) in expected.items()}, grades
    for student, (_, words) in expected.items():
        assert words in grades[student]["reason"], grades[student]
    assert grades["kate"]["reason"].startswith("rank 0 (node"), grades["kate"]
    assert_no_workers_anywhere(jobs.topology)
    assert "taken out" not in result.out, result.out
    for i in jobs.topology.indices():
        left = subprocess.run(["docker", "exec", jobs.topology.container(i), "pgrep", "-af", "sleep 90[07]"],
                              capture_output=True, text=True, timeout=30).stdout
        assert left.strip() == "", f"{jobs.topology.container(i)}: {left}"
        assert share_remains(jobs.topology, i) == "", jobs.topology.container(i)
    # each share ran through share hosts of its own (a network namespace each): nodes 1-2, then 3-4
    assert sorted((door.host, door.user) for door in sharehosts.running(_client(), jobs.topology.lab)) == \
        [(1, "share1"), (2, "share1"), (3, "share2"), (4, "share2")]
    # nor can a submission leave a file in the lab user's home for the next one (a .bashrc...)
    planted = subprocess.run(["docker", "exec", "--user", "lab", jobs.topology.container(1), "sh", "-c",
                              "echo exit >> ~/.bashrc"], capture_output=True, text=True, timeout=30)
    assert planted.returncode != 0 and "Permission denied" in planted.stderr


@pytest.mark.parametrize("launcher", ["torchrun", "spawn"])
def test_run_all_across_hosts_under_each_host_launcher(jobs: Jobs, tmp_path: Path, launcher: str) -> None:
    code, report = run_json(jobs.lab, "all", "--hosts", str(inventory_variant(tmp_path, 2, 2, jobs.inventory)),
                            "--launcher", launcher)
    failed = {e["name"]: e["reason"] for e in report["exercises"] if e["status"] != "pass"}
    assert (code, failed) == (0, {})
    # Each host's launcher started its two ranks; c10d orders the hosts by address, as the inventory does.
    assert [r["host"] for r in sorted(report["ranks"], key=lambda r: r["rank"])] == ["node1", "node1", "node2", "node2"]
    assert len({r["hostname"] for r in report["ranks"]}) == 2
    assert_no_workers_anywhere(jobs.topology)


@pytest.mark.parametrize("launcher", ["lab", "torchrun", "spawn"])
def test_the_tutorials_scripts_run_unchanged_across_hosts(jobs: Jobs, tmp_path: Path, launcher: str) -> None:
    for script in tutorial_scripts(tmp_path):
        n = script.nproc  # on 2 hosts, as the tutorial's 2 nodes (ranks 0..n/2-1 on node1)
        inventory = inventory_variant(tmp_path, 2, n // 2, jobs.inventory)
        result = jobs.lab("launch", "--hosts", str(inventory), "--launcher", launcher, "--timeout", "120",
                        str(script.path))
        assert result.code == 0, result.text
        assert f"{script.name}: {n} of {n} ranks succeeded" in result.out
        assert f"[node2 r{n - 1}] " in result.out  # the last rank ran, and printed, on the second host
        assert_prints_as_shown(script, result.out)
    assert_no_workers_anywhere(jobs.topology)


def test_a_real_project_runs_across_hosts_under_torchrun(jobs: Jobs, tmp_path: Path) -> None:
    """tests/projects/ddp_series (a package, a config and a data file beside its script) on two
    hosts of two ranks each, torchrun starting them; a second launch finds the project kept."""
    for kept in (False, True):
        result = jobs.lab("launch", "--hosts", str(jobs.inventory), "--nnodes", "2", "--nproc-per-node", "2",
                          "--launcher", "torchrun", "--env", "SERIES_TAG=series-1", "-v", str(DDP_SERIES / "train.py"),
                          "--epochs", "2", timeout=300)
        assert result.code == 0, result.text[-3000:]
        assert_ddp_series_trained(result.out, 4)
        assert result.err.count("as the host kept it, unchanged") == (2 if kept else 0), result.err[-3000:]
    assert_no_workers_anywhere(jobs.topology)


def test_a_trainer_stopped_on_the_hosts_resumes_from_the_checkpoint_that_came_back(jobs: Jobs, tmp_path: Path) -> None:
    """tests/projects/resume (a config file, a checkpoint to a relative out_dir, --init-from resume) on
    two hosts: 6 steps under torchrun; then 3 steps, and 3 more resumed from the checkpoint the first
    part wrote on the hosts, which came back into the project: the same losses, step for step. Each
    host's own note of where it ran comes back too, rank 0's host's in its place, the other's beside."""
    project = tmp_path / "resume"
    shutil.copytree(RESUME, project)
    on_hosts = ("launch", "--hosts", str(jobs.inventory), "--nnodes", "2", "--nproc-per-node", "1")

    def losses(*args: str) -> list[str]:
        result = jobs.lab(*on_hosts, *args, timeout=300)
        assert result.code == 0, result.text[-3000:]
        assert "brought back 3 file(s)" in result.out and "out/ckpt.pt" in result.out, result.out[-2000:]
        return re.findall(r"step \d+ loss \d+\.\d+", result.out)

    whole = losses("--launcher", "torchrun", str(project / "train.py"), "--steps", "6")
    first = losses(str(project / "train.py"), "--steps", "3")
    resumed = losses(str(project / "train.py"), "--steps", "6", "--init-from", "resume")
    assert len(whole) == 6 and first + resumed == whole, (whole, first, resumed)
    assert torch_step(project / "out" / "ckpt.pt") == 6
    assert (project / "out" / "ran-on.txt").read_text() == "node1"  # (rank 0's host's, in its place)
    assert (project / ".lab" / "hosts" / "node2" / "out" / "ran-on.txt").read_text() == "node2"
    assert_no_workers_anywhere(jobs.topology)


def test_a_trainer_that_needs_a_package_gets_it_on_every_host_once_and_resumes_as_torchrun_trains(
        jobs: Jobs, tmp_path: Path) -> None:
    """tests/projects/tokenized on two hosts, its tokenizer a package they lack: under torchrun, 4
    steps, the package installed on each host from the wheels this machine carried (said); under the
    lab, the inventory's `requirements:` naming the file, 2 steps and 2 more resumed from the
    checkpoint that came back (each host's environment kept: nothing said): the same losses."""
    project = tmp_path / "tokenized"
    shutil.copytree(TOKENIZED, project)
    version = tokenized_project(project)
    inventory = inventory_variant(tmp_path, 2, 1, jobs.inventory, requirements=str(project / "requirements.txt"))
    jobs.lab.env, before = {**jobs.lab.env, "XDG_CACHE_HOME": str(tmp_path / "cache")}, jobs.lab.env
    try:
        whole = jobs.lab("launch", "--hosts", str(jobs.inventory), "--nnodes", "2", "--nproc-per-node", "1",
                         "--launcher", "torchrun", "--requirements", str(project / "requirements.txt"),
                         str(project / "train.py"), "--steps", "4", timeout=300)
        first = jobs.lab("launch", "--hosts", str(inventory), str(project / "train.py"), "--steps", "2", timeout=300)
        resumed = jobs.lab("launch", "--hosts", str(inventory), str(project / "train.py"), "--steps", "4",
                           "--init-from", "resume", timeout=300)
    finally:
        jobs.lab.env = before
    for result in (whole, first, resumed):
        assert result.code == 0, result.text[-3000:]
    assert "installed the requirements on node1, node2: kept there for the next launches" in whole.err, whole.err
    assert "installed the requirements" not in first.err + resumed.err, first.err + resumed.err
    steps = re.compile(r"step \d+ loss \d+\.\d+")
    assert len(steps.findall(whole.out)) == 4 and steps.findall(first.out) + steps.findall(resumed.out) == \
        steps.findall(whole.out), (whole.out, first.out, resumed.out)
    assert f"labtok {version} from /tmp/lab-run-" in resumed.out and "/requirements-env/labtok/" in resumed.out
    assert torch_step(project / "out" / "ckpt.pt") == 4
    assert_no_workers_anywhere(jobs.topology)


@pytest.mark.parametrize("launcher", ["lab", "torchrun"])
def test_rank_0_on_its_host_reads_the_launchs_stdin(jobs: Jobs, tmp_path: Path, launcher: str) -> None:
    """Across hosts as on this machine: what `lab launch` reads on its stdin goes over SSH, after the
    preflight, to rank 0 on node1, whole (under torchrun through node1's relay); rank 1 on node2 reads
    nothing."""
    script = tmp_path / "echo.py"
    script.write_text(STDIN_ECHO)
    text = "".join(f"line {i} of the launch's stdin\n" for i in range(100_000))
    result = jobs.lab("launch", "--hosts", str(jobs.inventory), "--nnodes", "2", "--nproc-per-node", "1",
                      "--launcher", launcher, str(script), stdin=text, timeout=120)
    assert result.code == 0, result.text[-3000:]
    assert f"[node1 r0] rank 0 read {len(text)} bytes {hashlib.sha256(text.encode()).hexdigest()[:16]}" in result.out
    assert "[node2 r1] rank 1 read 0 bytes" in result.out, result.out
    assert_no_workers_anywhere(jobs.topology)


def torch_step(checkpoint: Path) -> int:
    import torch

    return int(torch.load(checkpoint)["step"])


def test_data_a_projects_gitignore_lists_is_named_at_launch_and_include_carries_it(jobs: Jobs, tmp_path: Path) -> None:
    """Prepared data the project's .gitignore lists: the launch says in one line what it left out and
    how to carry it; with --include the hosts have it."""
    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    (project / ".gitignore").write_text("*.bin\n")
    (project / "data" / "train.bin").write_bytes(b"\0" * 4096)
    (project / "train.py").write_text("import os\nprint('data', 'found' if os.path.exists('data/train.bin') else "
                                      "'missing')\n")
    launch = ("launch", "--hosts", str(jobs.inventory), "--nnodes", "1", "--nproc-per-node", "1")
    left = jobs.lab(*launch, str(project / "train.py"), timeout=120)
    assert left.code == 0 and "data missing" in left.out, left.text[-3000:]
    assert ("left out by the workdir's ignore rules (.gitignore), and a program may read them: data/train.bin "
            "(0.0 MiB); carry them with --include PATTERN (e.g. --include '*.bin')") in left.err, left.err
    brought = jobs.lab(*launch, "--include", "*.bin", str(project / "train.py"), timeout=120)
    assert brought.code == 0 and "data found" in brought.out and "left out" not in brought.err, brought.text[-3000:]


def test_torchruns_agents_restart_every_hosts_ranks_and_the_restart_is_said(jobs: Jobs, tmp_path: Path) -> None:
    """A rank that fails in the first attempt: every host's agent restarts its ranks, the job ends
    well in the second, and the restart is said with the failure that caused it."""
    script = tmp_path / "flaky.py"
    script.write_text(FAILS_IN_ITS_FIRST_ATTEMPTS)
    result = jobs.lab("launch", "--hosts", str(jobs.inventory), "--nnodes", "2", "--launcher", "torchrun",
                      "--max-restarts", "1", "--env", "FAILING_ATTEMPTS=1", str(script), timeout=300)
    assert result.code == 0, result.text[-3000:]
    assert re.search(r"torchrun restarted the ranks \(1 of --max-restarts 1\) after attempt 1 ran \d+\.\ds: rank 1 "
                     r"\(node\d\) raised ValueError: "
                     r"boom in attempt 0 at flaky.py:6", result.out), result.out
    assert result.out.count("trained in attempt 1") == 2, result.out[-3000:]
    assert_no_workers_anywhere(jobs.topology)
