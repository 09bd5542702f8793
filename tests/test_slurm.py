"""Slurm in the container lab (``lab up --scheduler slurm``): real slurmctld, slurmd and munge in
unprivileged lab hosts, a job across them; the pieces ``lab up`` writes, without a cluster."""
from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.containerlab import hosts, slurm
from lab.containerlab.topology import Topology
from lab.errors import UsageError

from .conftest import Lab
from .test_lab_docker import _client

NAME = "slurmt"


def test_slurm_conf_describes_the_labs_hosts() -> None:
    conf = slurm.slurm_conf(Topology(3, 2, lab="class-a", scheduler="slurm"))
    lines = conf.splitlines()
    assert "ClusterName=class-a" in lines and "SlurmctldHost=node1" in lines
    assert "NodeName=node[1-3] CPUs=2 State=UNKNOWN" in lines
    assert "PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP" in lines
    assert "AuthType=auth/munge" in lines and "ProctrackType=proctrack/linuxproc" in lines
    assert "NodeName=node1 CPUs=1 State=UNKNOWN" in slurm.slurm_conf(Topology(1, 1, scheduler="slurm"))


def test_the_munge_key_is_made_once_and_private(tmp_path: Path) -> None:
    key = slurm.ensure_munge_key(tmp_path / "labs" / "x" / "munge.key")
    first = key.read_bytes()
    assert len(first) == slurm.MUNGE_KEY_BYTES and os.stat(key).st_mode & 0o777 == 0o600
    os.chmod(key, 0o644)
    assert slurm.ensure_munge_key(key).read_bytes() == first and os.stat(key).st_mode & 0o777 == 0o600


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
    assert hosts.lab_containers(client, NAME) == []


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
    key = inventory.parent / ".lab" / "labs" / NAME / "munge.key"
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


@pytest.mark.docker
def test_status_names_a_host_with_another_munge_key_and_up_mends_it(slurm_lab: tuple[Lab, Path]) -> None:
    lab, inventory = slurm_lab
    status = ("status", "--name", NAME, "--inventory", str(inventory))
    healthy = lab(*status)
    assert healthy.code == 0 and healthy.out.count("the lab's") == 2, healthy.text
    other_key = subprocess.run(["docker", "exec", "-i", f"{NAME}-node2", "/usr/local/bin/lab-slurm-start"],
                               input=os.urandom(slurm.MUNGE_KEY_BYTES), capture_output=True, timeout=60)
    assert other_key.returncode == 0, other_key.stderr
    broken = lab(*status)
    assert broken.code == 3, broken.text
    assert "lab: node2: its munge key is not the lab's" in " ".join(broken.out.split()), broken.out
    mended = lab("up", "--name", NAME, "--hosts", "2", "--slots", "2", "--scheduler", "slurm", "--no-smoke",
                 "--inventory", str(inventory), timeout=600)
    assert mended.code == 0, mended.text[-3000:]
    assert lab(*status).code == 0
    job = in_host(1, "srun", "--nodes", "2", "hostname", user="lab")
    assert sorted(job.stdout.split()) == ["node1", "node2"], job
