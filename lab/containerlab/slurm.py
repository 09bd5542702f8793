"""A Slurm cluster on the lab's hosts (``lab up --scheduler slurm``).

slurmctld runs on node1 and slurmd on every host, authenticated with munge; the image has the
packages (Debian's slurm-wlm and munge), never a key. ``lab up`` makes the lab's munge key
(random, 0600, in the lab's state beside its SSH key: :func:`ensure_munge_key`) and its
slurm.conf (:func:`slurm_conf`: one node per host with CPUs = its slots, one partition ``lab``),
mounts the conf read-only at /etc/slurm/slurm.conf, and hands each host the key on the standard
input of ``lab-slurm-start`` (images/lab-host/slurm-start.sh), which installs it for munged and
starts the daemons; then it waits until ``sinfo`` shows every node idle.

What works in an unprivileged container (../shared/ENVIRONMENT.md), and so what the conf says:
no cgroups (processes tracked from /proc, no task plugin, no accounting), no PMIx
(MpiDefault=none), resource limits not propagated (raising one needs a capability the hosts do
not have), and the configured CPUs trusted over those the container sees (a lab may give the
hosts of a 2-core machine 4 slots each).
"""
from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lab.containerlab import state
from lab.containerlab.engine import EngineError, Say
from lab.containerlab.topology import LabPaths, Topology
from lab.core.slurm import WORKING

MUNGE_KEY_BYTES = 1024
CONTROLLER = 1  # the host slurmctld runs on
PARTITION = "lab"
CONF_PATH = "/etc/slurm/slurm.conf"  # where a host finds the lab's slurm.conf (mounted read-only)
START_TIMEOUT = 30.0  # seconds for one host's lab-slurm-start
IDLE_TIMEOUT = 180.0  # seconds for every node to be idle after the daemons start (a busy machine: 90 fell short)
SINFO = ["sinfo", "--noheader", "--Node", "--format", "%N %T"]
KEY_IN_HOST = "/run/lab-munge/munge.key"  # where lab-slurm-start puts the lab's key (munge's, 0400)


def ensure_munge_key(path: Path) -> Path:
    """The lab's munge key: made once, private (a new file, 0600), kept across ``lab up``s of the lab
    (one found there must be a regular file of the user's, closed to others: ``lab.containerlab.state``)."""
    if not state.check_file(path):
        state.write_new(path, secrets.token_bytes(MUNGE_KEY_BYTES))
    return path


def slurm_conf(topology: Topology) -> str:
    """The lab's slurm.conf."""
    nodes = f"node[1-{topology.hosts}]" if topology.hosts > 1 else topology.name(1)
    return "\n".join([
        f"# slurm.conf of lab {topology.lab}, written by `python -m lab up --scheduler slurm` (it rewrites it)",
        f"ClusterName={topology.lab}",
        f"SlurmctldHost={topology.name(CONTROLLER)}",
        "SlurmUser=slurm",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SlurmdParameters=config_overrides",
        "PropagateResourceLimits=NONE",
        "ReturnToService=2",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldPidFile=/run/slurm/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurmd.log",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "KillWait=5",
        "MinJobAge=30",
        f"NodeName={nodes} CPUs={topology.slots} State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def write_files(topology: Topology, paths: LabPaths) -> None:
    """The munge key and slurm.conf, before the hosts that mount the conf start."""
    ensure_munge_key(paths.munge_key)
    state.write(paths.slurm_conf, slurm_conf(topology).encode(), 0o644)  # (mounted: slurm reads it)


def _docker_cli() -> str:
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        raise EngineError("the docker command is needed for Slurm in the lab")
    return docker_cli


def start(topology: Topology, paths: LabPaths, say: Say) -> None:
    """Start munged and slurmd on every host (slurmctld on node1 first), each given the key on
    its stdin (a host whose key was another gets the lab's, and its munged restarts); then wait
    until every node is idle."""
    docker_cli = _docker_cli()
    key = paths.munge_key.read_bytes()
    say(f"starting Slurm: slurmctld on {topology.name(CONTROLLER)}, slurmd on {topology.hosts} host(s)")
    for i in topology.indices():
        try:
            done = subprocess.run([docker_cli, "exec", "-i", topology.container(i), "/usr/local/bin/lab-slurm-start"],
                                  input=key, capture_output=True, timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise EngineError(f"host {topology.name(i)}: starting Slurm took over {START_TIMEOUT:g}s") from None
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines() or [f"exit {done.returncode}"]
            raise EngineError(f"host {topology.name(i)}: cannot start Slurm: {said[-1]}")
    wait_idle(topology, docker_cli)


def node_states(topology: Topology, docker_cli: str) -> dict[str, str]:
    """Each node's state as slurmctld has it (``idle``, ``down*``...); empty when it does not answer."""
    try:
        done = subprocess.run([docker_cli, "exec", topology.container(CONTROLLER), *SINFO], capture_output=True,
                              text=True, timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {}
    return dict(line.split(None, 1) for line in done.stdout.splitlines() if " " in line)


def wait_idle(topology: Topology, docker_cli: str) -> None:
    wanted = {topology.name(i) for i in topology.indices()}
    deadline = time.monotonic() + IDLE_TIMEOUT
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(topology, docker_cli)
        if wanted <= {node for node, state in states.items() if state in WORKING}:
            return
        time.sleep(1)
    shown = ", ".join(f"{node} {states.get(node, 'unknown')}" for node in sorted(wanted)) if states else \
        "slurmctld does not answer"
    raise EngineError(f"Slurm did not come up within {IDLE_TIMEOUT:g}s ({shown}): see /var/log/slurmd.log on the "
                      f"hosts and /var/log/slurm/slurmctld.log on {topology.name(CONTROLLER)}")


@dataclass(frozen=True)
class Health:
    """The lab's Slurm cluster as ``lab status`` shows it: each node's state as slurmctld has it
    (none: slurmctld does not answer), whether each host's munge key is the lab's, and each
    problem with its fix."""

    states: dict[str, str]
    keys: dict[str, bool | None]  # None: the host's key could not be read
    problems: tuple[str, ...]


def health(topology: Topology, paths: LabPaths) -> Health:
    docker_cli = _docker_cli()
    again = f"`python -m lab up --name {topology.lab} --scheduler slurm` (with the same --hosts and --slots)"
    states = node_states(topology, docker_cli)
    lab_key = hashlib.sha256(paths.munge_key.read_bytes()).hexdigest() if paths.munge_key.exists() else None
    keys = {topology.name(i): _key_is(topology.container(i), lab_key, docker_cli) for i in topology.indices()}
    problems = []
    if lab_key is None:
        problems.append(f"the lab's munge key is not at {paths.munge_key}: run status from where `lab up` "
                        f"wrote the lab's inventory (--inventory)")
    if not states:
        problems.append(f"slurmctld on {topology.name(CONTROLLER)} does not answer: {again} starts it again "
                        f"(its log: /var/log/slurm/slurmctld.log there)")
    for node, same in keys.items():
        if same is False:
            problems.append(f"{node}: its munge key is not the lab's, so slurmctld rejects what it sends: {again} "
                            f"gives every host the lab's key")
        state = states.get(node)
        if states and state not in WORKING:
            problems.append(f"{node}: {state or 'not in slurm.conf'} in Slurm: slurmd there does not answer "
                            f"slurmctld; {again} starts it again (its log: /var/log/slurmd.log there)")
    return Health(states, keys, tuple(problems))


def _key_is(container: str, lab_key: str | None, docker_cli: str) -> bool | None:
    """Whether the host's munge key is the lab's (None: unknown)."""
    try:
        done = subprocess.run([docker_cli, "exec", "--user", "munge", container, "sha256sum", KEY_IN_HOST],
                              capture_output=True, text=True, timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None
    if done.returncode != 0 or lab_key is None:
        return None
    return done.stdout.split()[0] == lab_key
