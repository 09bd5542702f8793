"""The plan: what every rank of a run runs, and what starts it, as data.

Nothing here does I/O or imports torch, and ``--dry-run`` prints a plan as YAML. What can
only be known on the hosts is left as a macro, as torchx leaves ``${img_root}``, and the runner
fills it in host by host (:meth:`Launch.bound`):

* ``${run_dir}``: the run's directory on the host a process runs on, made in that host's own
  temp directory when the run starts (``Transport.prepare``);
* ``${port0}``, ``${port1}``...: the rendezvous ports, chosen free and held on rank 0's host for
  as long as the run lasts (``lab.rank.ports``), so runs from any number of controllers never
  pick the same port there.

A plan is a list of ranks (host, rank, local rank, device, the rendezvous settings it
gets), the launches that start them (what the run's launcher, ``lab.core.launchers``, made of
it: one process per host that starts the host's ranks, or one ``srun`` for the whole job), and a
list of stages. A stage is one rendezvous and the exercises that run under it, in one process per
rank: every "shared" exercise reuses a single process group, so ``run all`` pays process
start-up, the torch import and the rendezvous once, while the init-* exercises each form (and
destroy) their own group in the same processes. ``lab.core.planner`` makes plans.
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from lab.core.random_inputs import VALUE_BYTES
from lab.inventory.model import Host
from lab.rank.reaper import RUN_DIR_PREFIX
from lab.rank.saves import SYNC_VAR
from lab.rank.script import MODULE_VAR, WORKDIR_VAR
from lab.rank.watcher import HANG_AFTER_VAR, TORCH_DUMPS_VAR, TRACE_VAR
from lab.rank.wire import Mode as WireMode
from lab.suite.registry import Exercise, Rendezvous

if TYPE_CHECKING:
    from lab.core.requirements import Requirements

Backend = Literal["gloo", "nccl"]
InitMethod = Literal["env", "tcp", "file"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
INIT_METHODS: tuple[InitMethod, ...] = get_args(InitMethod)
DEFAULT_TIMEOUT = 60.0
DEFAULT_HANG_AFTER = 10.0  # seconds every live rank waits in a call, none completing one, before it is a hang
RUN_DIR = "${run_dir}"
WORK_DIR = "work"  # lab launch: the project's copy, in the run directory
REQUIREMENTS_ENV = "requirements-env"  # lab launch: the host's environment of its requirements, linked there
_MACRO = re.compile(r"\$\{(run_dir|port(\d+))\}")


def port_macro(index: int) -> str:
    """The macro of the ``index``-th port held on rank 0's host for the run."""
    return f"${{port{index}}}"


def bind_macros(text: str, run_dir: str, ports: Sequence[int]) -> str:
    """``text`` with ``${run_dir}`` and ``${portN}`` filled in."""
    return _MACRO.sub(lambda m: run_dir if m[1] == "run_dir" else str(ports[int(m[2])]), text)


def new_token() -> str:
    """A run's token: unique per run and known to its processes only, it tags the run's event lines
    (the names others can read are :func:`public_id`'s)."""
    return secrets.token_hex(6)


def public_id(token: str) -> str:
    """The run's name where other users of a host can read it (its directory in /tmp, the Slurm job,
    torchrun's rendezvous id): derived from the token, which it does not reveal."""
    return hashlib.sha256(f"lab-run:{token}".encode()).hexdigest()[:12]


def run_name(token: str) -> str:
    """The name of the run's directory on every host (``Plan.run_name``)."""
    return f"{RUN_DIR_PREFIX}{public_id(token)}"  # (the reaper knows a run directory by it)


@dataclass(frozen=True)
class Options:
    """What the user asked for on the command line."""

    exercises: tuple[Exercise, ...]
    backend: Backend | None = None  # None: nccl when every rank has its own GPU, else gloo
    init: InitMethod = "env"
    timeout: float = DEFAULT_TIMEOUT  # seconds any one step (start-up, rendezvous, an exercise) may take
    solution: str | None = None  # a .py file run in place of the (single) exercise's program
    launcher: str = "lab"  # who starts the ranks (lab.core.launchers)
    memory_mb: int | None = None  # each rank's data memory limit (RLIMIT_DATA), set before its program loads
    # Processes and threads per rank (lab grade: where each submission runs as a user of its own): the
    # rank's user may have this many for each of its ranks on the host (RLIMIT_NPROC), set before its program loads.
    pids: int | None = None
    partition: str | None = None  # the Slurm partition (--launcher srun...); None: the cluster's default
    rank_env: dict[str, str] = field(default_factory=dict, hash=False)  # more settings for every rank (--env...)
    # A hang, found by the runner: every live rank has waited in a torch.distributed call and none has
    # completed one for this many seconds (0: never; the timeout still stops the run).
    hang_after: float = DEFAULT_HANG_AFTER
    # Before the ranks start, each host's launcher checks the network the job will use (lab.rank.preflight):
    # its advertised address reaches every peer, and MASTER_ADDR:MASTER_PORT is reachable (Plan.checks_network).
    preflight: bool = True
    part: str | None = None  # the one part of the (single) exercise to check (lab.suite.registry); None: all
    # the drawn inputs' seed (lab.core.random_inputs; `run --seed`: a replay); None: a fresh one
    seed: str | None = None
    # lab grade: measure what each host's connections carry, outside the ranks (lab.rank.wire), where only
    # the submission's sockets are in that mode's reach: a sandbox's netns, or a user of its own ("uid").
    wire: WireMode | None = None
    # lab grade in a one-container sandbox: each rank runs as user rank_users + its rank, kept apart from the
    # others (its own /tmp, /dev/shm and IPC: lab.rank.isolation) by its host's launcher; None: as the host's user
    rank_users: int | None = None
    # lab launch under torchrun: how many times its agents may restart the ranks after one fails (--max-restarts)
    max_restarts: int = 0
    # --trace, --fr-dir: every rank sends each record as it begins and ends, and torch's own flight recorder
    trace: bool = False
    torch_dumps: bool = False
    # lab launch of a project carried to its hosts: bytes of what the ranks wrote in their copies that come
    # back into it at the end, at most (lab.core.bringback; 0: nothing comes back)
    bring_back_max: int = 1 << 30
    # lab launch --sync-back: what rank 0's host's ranks save with torch.save that comes back as it is saved,
    # while the job goes on (.gitignore's patterns; lab.rank.saves, lab.core.bringback.sync)
    sync_back: tuple[str, ...] = ()
    # a notebook's ranks (lab.notebook, lab.rank.cells): the mark that ends each cell's output on their
    # streams (those lines always reach on_line); what the run's stdin carries goes to every rank
    cells_mark: str = ""


@dataclass(frozen=True)
class Stage:
    rendezvous: Rendezvous  # who forms its group (see lab.suite.registry)
    init: InitMethod | Literal["none"]  # the method this stage's group uses
    init_method: str | None  # the init_method string, e.g. "tcp://10.0.0.1:${port1}"
    addr: str | None
    port: str | None  # a port macro (``${portN}``)
    path: str | None
    exercises: tuple[dict[str, Any], ...]  # ({"name", "program"[, "reference", "writes", "writes_some", "part"]}, ...)


@dataclass(frozen=True)
class RankSpec:
    rank: int
    local_rank: int
    host: str
    device: str
    env: dict[str, str] = field(hash=False)  # the rendezvous settings injected into this rank


@dataclass(frozen=True)
class Launch:
    """One process the lab starts on a host: the host's launcher, which starts the host's ranks
    (``lab``: forks them, ``torchrun``, ``spawn``)."""

    host: str
    ranks: tuple[int, ...]  # the ranks it carries as planned (torchrun numbers them itself: see the runner)
    args: tuple[str, ...]  # the command after the host's python
    env: dict[str, str] = field(hash=False)  # what the lab puts in its environment

    def bound(self, run_dir: str, ports: Sequence[int]) -> Launch:
        """This launch as it starts on its host: the macros filled in."""
        return replace(self, args=tuple(bind_macros(a, run_dir, ports) for a in self.args),
                       env={k: bind_macros(v, run_dir, ports) for k, v in self.env.items()})


@dataclass(frozen=True)
class Plan:
    world_size: int
    backend: Backend
    master_addr: str
    master_port: str | None  # a port macro: the store's (or torchrun's c10d rendezvous) port
    options: Options  # what the user asked for (``lab launch``: its settings, and no exercise)
    token: str
    hosts: tuple[Host, ...]
    ranks: tuple[RankSpec, ...]
    stages: tuple[Stage, ...]
    uploads: dict[str, str] = field(default_factory=dict, hash=False)  # run-dir path -> local file
    shared_run_dir: str | None = None  # the run's directory in the hosts' shared_dir, if any
    script: tuple[str, ...] = ()  # lab launch: the user's script (in the run dir) and its args
    launches: tuple[Launch, ...] = ()  # the processes that start the ranks, as the launcher made them
    rdzv_endpoint: str | None = None  # torchrun: ADDR:PORT of the c10d rendezvous
    port_count: int = 0  # ports to hold on rank 0's host (``${port0}``...)
    # The lab's own processes take the held ports from the holder (lab.rank.ports --exclusive): rank 0's
    # stage stores and the preflight on MASTER_PORT, under the lab's launcher or spawn; no other user's
    # socket can bind them meanwhile. (Not where a user's program or torchrun binds them itself.)
    hands_over_ports: bool = False
    module: str | None = None  # lab launch -m: the module its ranks run (``script`` holds its arguments)
    work: dict[str, str] = field(default_factory=dict, hash=False)  # the project: its path -> the local file
    work_key: str = ""  # what names that state of the project (lab.core.workcache); "": no project, a script alone
    # lab launch on this machine's own ranks, or on hosts whose shared folder (shared_dir) holds the project:
    # the project folder itself, where they start and write, as under torchrun (nothing carried, so nothing
    # a job writes is left behind in a copy)
    in_place: str = ""
    work_root: str = ""  # the project folder on this machine, where what the ranks write in their copies comes back
    # lab launch --requirements (or the inventory's): by host, what its ranks need beyond torch (lab.core.requirements)
    requirements: dict[str, Requirements] = field(default_factory=dict, hash=False)
    # Options.preflight, where the launcher has one (not under srun, where Slurm starts the tasks)
    checks_network: bool = True
    # What each host's connections carried is measured by its launcher (Options.wire): only the lab's
    # launcher (the zygote, which no rank can reach) and gloo (whose every byte goes over TCP).
    wire: WireMode | None = None
    # Each rank's drawn inputs (lab.core.random_inputs), where an exercise takes some: kept here for the checker,
    # and the seed they were drawn from (shown, to replay the run: `run --seed`).
    inputs: dict[int, bytes] = field(default_factory=dict, hash=False, repr=False)
    seed: str | None = None

    @property
    def launcher(self) -> str:
        """The launcher's name (lab.core.launchers)."""
        return self.options.launcher

    @property
    def init(self) -> InitMethod:
        """How the shared group meets (Options.init; a launch's: env://)."""
        return self.options.init

    @property
    def timeout(self) -> float:
        """Seconds any one step may take (Options.timeout)."""
        return self.options.timeout

    @property
    def run_name(self) -> str:
        """The name of the run's directory, made in each host's own temp directory."""
        return run_name(self.token)

    @property
    def code_dir(self) -> str:
        """Where the lab's own code lies on every host: each run carries its own copy."""
        return f"{RUN_DIR}/code"

    @property
    def is_launch(self) -> bool:
        """``lab launch``: the user's program on every rank (else the lab's worker and its exercises)."""
        return bool(self.script) or self.module is not None

    @property
    def exercise_names(self) -> tuple[str, ...]:
        """The exercises in the order they were named, as the report lists them (the stages run them
        grouped by rendezvous: those that form none first, then the shared group, then each that
        forms its own)."""
        return tuple(e.name for e in self.options.exercises)

    def rank_plan(self) -> dict[str, Any]:
        """The instructions every worker reads from LAB_RANK_PLAN."""
        return {"token": self.token, "backend": self.backend, "timeout": self.timeout,
                "memory_mb": self.options.memory_mb, "pids": self.options.pids,
                "hands_over_ports": self.hands_over_ports,
                "stages": [asdict(s) for s in self.stages]}

    @property
    def program(self) -> tuple[str, ...]:
        """What every rank runs: the lab's worker, or (lab launch) the user's script."""
        return ("-m", "lab.rank.script", *self.script) if self.is_launch else ("-m", "lab.rank.worker")

    def own_settings(self) -> dict[str, str]:
        """The run's own settings for every rank, the same on every host."""
        env = {"PYTHONUNBUFFERED": "1", "LAB_TOKEN": self.token, HANG_AFTER_VAR: f"{self.options.hang_after:g}",
               **({TRACE_VAR: "1"} if self.options.trace else {}),
               **({TORCH_DUMPS_VAR: "1"} if self.options.torch_dumps else {})}
        if not self.is_launch:
            env["LAB_RANK_PLAN"] = json.dumps(self.rank_plan())
        if self.work_key:  # (a project: its ranks start in its copy)
            env[WORKDIR_VAR] = f"{RUN_DIR}/{WORK_DIR}"
            if self.options.sync_back:
                env[SYNC_VAR] = "1"
        elif self.in_place:
            env[WORKDIR_VAR] = self.in_place
        if self.module:
            env[MODULE_VAR] = self.module
        return env

    def launcher_env(self, host_env: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
        """A host's launcher's settings, which its ranks inherit: the lab's defaults, the host's own
        (the inventory's ``env``), the run's ``rank_env`` over them, then the run's ``own`` (the
        user's PYTHONPATH after the lab's code and the requirements' environment)."""
        user = {**host_env, **self.options.rank_env}
        environment = f"{RUN_DIR}/{REQUIREMENTS_ENV}" if self.requirements else ""  # (the host's, where it has one)
        python_path = ":".join(p for p in (self.code_dir, environment, user.pop("PYTHONPATH", "")) if p)
        return {"OMP_NUM_THREADS": "1", **user, "PYTHONPATH": python_path, **own}

    @property
    def job_name(self) -> str:
        """The Slurm job's name (``--launcher srun``): the run's, so the lab can cancel it by name."""
        return f"lab-{public_id(self.token)}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--dry-run`` (YAML) and ``--json``."""
        return {
            "world_size": self.world_size, "backend": self.backend, "init": self.init,
            "launcher": self.launcher, "master_addr": self.master_addr, "master_port": self.master_port,
            **({"rdzv_endpoint": self.rdzv_endpoint} if self.rdzv_endpoint else {}),
            "timeout": self.timeout, "hang_after": self.options.hang_after, "preflight": self.checks_network,
            **({"inputs": f"{len(next(iter(self.inputs.values()))) // VALUE_BYTES} random values per rank, "
                          "drawn for this run", "seed": self.seed} if self.inputs else {}),
            **({"part": self.options.part} if self.options.part else {}),
            **({"memory_mb": self.options.memory_mb} if self.options.memory_mb else {}),
            **({"requirements": {host: r.path for host, r in self.requirements.items()}} if self.requirements else {}),
            **({"pids_per_rank": self.options.pids} if self.options.pids else {}),
            "run_dir": f"{RUN_DIR} = <each host's temp dir>/{self.run_name}",
            **({"ports": f"{', '.join(port_macro(i) for i in range(self.port_count))}: chosen free and "
                         f"held on {self.hosts[0].name} when the run starts"} if self.port_count else {}),
            "hosts": [{"name": h.name, "address": h.address, "connection": h.connection,
                       "slots": h.slots, "gpus": h.gpus} for h in self.hosts],
            "ranks": [{"rank": r.rank, "local_rank": r.local_rank, "host": r.host,
                       "device": r.device, "env": dict(r.env)} for r in self.ranks],
            "launches": [{"host": launch.host, "ranks": list(launch.ranks), "command": ["python", *launch.args]}
                         for launch in self.launches],
            "stages": [{"rendezvous": s.rendezvous, "init_method": s.init_method,
                        "exercises": [e["name"] for e in s.exercises]} for s in self.stages],
        }


def interface_env(host: Host) -> dict[str, str]:
    """The data-plane interface settings a rank on ``host`` gets from the inventory."""
    if not host.network_interface:
        return {}
    return {"GLOO_SOCKET_IFNAME": host.network_interface, "NCCL_SOCKET_IFNAME": host.network_interface}


def default_backend(hosts: Sequence[Host]) -> Backend:
    """nccl only when every rank has its own GPU, else gloo."""
    return "nccl" if all(h.gpus >= h.slots for h in hosts) else "gloo"


def shared_run_dir(hosts: Sequence[Host], run_name: str) -> str | None:
    """Where file:// rendezvous files go so that every rank sees them: the run directory
    when every host is this machine, else the run's directory in the ``shared_dir`` all
    hosts mount. None when there is none: the rank-side check then says so."""
    if all(h.is_local for h in hosts):
        return None
    dirs = {h.shared_dir for h in hosts}
    if len(dirs) != 1 or None in dirs:
        return None
    return f"{dirs.pop()}/{run_name}"


