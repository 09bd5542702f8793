"""The plan: a pure function from (inventory, options, resources) to what every rank runs.

Nothing here does I/O or imports torch, and ``--dry-run`` prints the result as YAML. What can
only be known on the hosts is left as a macro, as torchx leaves ``${img_root}``, and the runner
fills it in host by host (:meth:`Launch.bound`):

* ``${run_dir}``: the run's directory on the host a process runs on, made in that host's own
  temp directory when the run starts (``Transport.prepare``);
* ``${port0}``, ``${port1}``...: the rendezvous ports, chosen free and held on rank 0's host for
  as long as the run lasts (``lab.rank.ports``), so runs from any number of controllers never
  pick the same port there.

A plan is a list of ranks (host, rank, local rank, device, the rendezvous settings it
gets), the launches that start them, and a list of stages. The launcher decides the
launches (see :data:`LAUNCHERS`), one process per host: ``lab`` starts every rank itself,
with its settings in its environment, forked from a process that imported torch once
(``lab.rank.zygote``); ``torchrun`` starts one torchrun per host, which forms a c10d
rendezvous on rank 0's host and starts that host's ranks; ``spawn`` starts one process
per host that ``mp.spawn``s the host's ranks, as the tutorials do on one machine; ``srun`` and
``srun-torchrun`` start one Slurm job from the first host whose tasks are the ranks, or one
torchrun per node (``lab.rank.srun``). A stage is
one rendezvous and the exercises that run under it, in
one process per rank: every "shared" exercise reuses a single process group, so
``run all`` pays process start-up, the torch import and the rendezvous once, while the
init-* exercises each form (and destroy) their own group in the same processes.
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from lab.core.draw import VALUE_BYTES, draw, new_seed
from lab.core.workdir import Workdir
from lab.errors import UsageError
from lab.model.inventory import Host, Inventory
from lab.rank.flight import HANG_AFTER_VAR
from lab.rank.preflight import PREFLIGHT_VAR
from lab.rank.script import MODULE_VAR, WORKDIR_VAR
from lab.rank.wire import WIRE_VAR
from lab.rank.wire import Mode as WireMode
from lab.suite.registry import Exercise, Rendezvous

Backend = Literal["gloo", "nccl"]
InitMethod = Literal["env", "tcp", "file"]
Launcher = Literal["lab", "torchrun", "spawn", "srun", "srun-torchrun"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
INIT_METHODS: tuple[InitMethod, ...] = get_args(InitMethod)
LAUNCHERS: tuple[Launcher, ...] = get_args(Launcher)
SRUN_LAUNCHERS: tuple[Launcher, ...] = ("srun", "srun-torchrun")  # the ranks are Slurm tasks of one job
DEFAULT_TIMEOUT = 60.0
DEFAULT_HANG_AFTER = 10.0  # seconds every live rank waits in a call, none completing one, before it is a hang
RUN_DIR = "${run_dir}"
WORK_DIR = "work"  # lab launch: the project's copy, in the run directory
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


@dataclass(frozen=True)
class Options:
    """What the user asked for on the command line."""

    exercises: tuple[Exercise, ...]
    backend: Backend | None = None  # None: nccl when every rank has its own GPU, else gloo
    init: InitMethod = "env"
    timeout: float = DEFAULT_TIMEOUT  # seconds any one step (start-up, rendezvous, an exercise) may take
    solution: str | None = None  # a .py file run in place of the (single) exercise's program
    launcher: Launcher = "lab"  # who starts the ranks
    memory_mb: int | None = None  # each rank's data memory limit (RLIMIT_DATA), set before its program loads
    # Processes and threads per rank (lab grade: where each submission runs as a user of its own): the
    # rank's user may have this many for each of its ranks on the host (RLIMIT_NPROC), set before its program loads.
    pids: int | None = None
    partition: str | None = None  # the Slurm partition (--launcher srun...); None: the cluster's default
    rank_env: dict[str, str] = field(default_factory=dict, hash=False)  # more settings for every rank (--env...)
    hang_after: float = DEFAULT_HANG_AFTER  # see Plan
    preflight: bool = True  # see Plan
    part: str | None = None  # the one part of the (single) exercise to check (lab.suite.registry); None: all
    seed: str | None = None  # the drawn inputs' seed (lab.core.draw; `run --seed`: a replay); None: a fresh one
    # lab grade: measure what each host's connections carry, outside the ranks (lab.rank.wire), where only
    # the submission's sockets are in that mode's reach: a sandbox's netns, or a user of its own ("uid").
    wire: WireMode | None = None


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
    init: InitMethod
    master_addr: str
    master_port: str | None  # a port macro: the store's (or torchrun's c10d rendezvous) port
    timeout: float
    token: str
    hosts: tuple[Host, ...]
    ranks: tuple[RankSpec, ...]
    stages: tuple[Stage, ...]
    uploads: dict[str, str] = field(default_factory=dict, hash=False)  # run-dir path -> local file
    shared_run_dir: str | None = None  # the run's directory in the hosts' shared_dir, if any
    script: tuple[str, ...] = ()  # lab launch: the user's script (in the run dir) and its args
    launcher: Launcher = "lab"
    rdzv_endpoint: str | None = None  # torchrun: ADDR:PORT of the c10d rendezvous
    port_count: int = 0  # ports to hold on rank 0's host (``${port0}``...)
    # The lab's own processes take the held ports from the holder (lab.rank.ports --exclusive): rank 0's
    # stage stores and the preflight on MASTER_PORT, under the lab's launcher or spawn; no other user's
    # socket can bind them meanwhile. (Not where a user's program or torchrun binds them itself.)
    hands_over_ports: bool = False
    module: str | None = None  # lab launch -m: the module its ranks run (``script`` holds its arguments)
    work: dict[str, str] = field(default_factory=dict, hash=False)  # the project: its path -> the local file
    work_key: str = ""  # what names that state of the project (lab.core.workcache); "": no project, a script alone
    memory_mb: int | None = None  # see Options
    pids: int | None = None  # see Options
    partition: str | None = None  # see Options
    rank_env: dict[str, str] = field(default_factory=dict, hash=False)  # see Options
    # A hang, found by the runner: every live rank has waited in a torch.distributed call and none has
    # completed one for this many seconds (0: never; the timeout still stops the run).
    hang_after: float = DEFAULT_HANG_AFTER
    # Before the ranks start, each host's launcher checks the network the job will use (lab.rank.preflight):
    # its advertised address reaches every peer, and MASTER_ADDR:MASTER_PORT is reachable. Not under srun,
    # whose tasks Slurm starts.
    preflight: bool = True
    part: str | None = None  # see Options
    # What each host's connections carried is measured by its launcher (Options.wire): only the lab's
    # launcher (the zygote, which no rank can reach) and gloo (whose every byte goes over TCP).
    wire: WireMode | None = None
    # Each rank's drawn inputs (lab.core.draw), where an exercise takes some: kept here for the checker,
    # and the seed they were drawn from (shown, to replay the run: `run --seed`).
    inputs: dict[int, bytes] = field(default_factory=dict, hash=False, repr=False)
    seed: str | None = None
    # The exercises in the order they were named, as the report lists them (the stages run them grouped
    # by rendezvous: those that form none first, then the shared group, then each that forms its own).
    order: tuple[str, ...] = ()

    @property
    def checks_network(self) -> bool:
        """Whether the hosts' launchers run the preflight."""
        return self.preflight and self.launcher not in SRUN_LAUNCHERS

    def inputs_for(self, host: str) -> tuple[int, ...]:
        """The ranks whose inputs go to ``host``: its own, where the lab places the ranks (torchrun and
        srun place them themselves: every rank's then)."""
        if self.launcher in ("lab", "spawn"):
            return tuple(r.rank for r in self.ranks if r.host == host and r.rank in self.inputs)
        return tuple(self.inputs)

    @property
    def run_name(self) -> str:
        """The name of the run's directory, made in each host's own temp directory."""
        return f"lab-run-{public_id(self.token)}"

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
        return self.order or tuple(e["name"] for s in self.stages for e in s.exercises)

    def rank_plan(self) -> dict[str, Any]:
        """The instructions every worker reads from LAB_RANK_PLAN."""
        return {"token": self.token, "backend": self.backend, "timeout": self.timeout,
                "memory_mb": self.memory_mb, "pids": self.pids, "hands_over_ports": self.hands_over_ports,
                "stages": [asdict(s) for s in self.stages]}

    @property
    def program(self) -> tuple[str, ...]:
        """What every rank runs: the lab's worker, or (lab launch) the user's script."""
        return ("-m", "lab.rank.script", *self.script) if self.is_launch else ("-m", "lab.rank.worker")

    def launches(self) -> tuple[Launch, ...]:
        """The processes to start: one per host, which starts the host's ranks (``lab.rank.node``),
        or under Slurm one ``srun`` on the first host, whose tasks are the ranks."""
        own = self._own_settings()
        if self.launcher in SRUN_LAUNCHERS:  # (one environment for every node: what their inventory entries share)
            shared = set.intersection(*(set(h.env) for h in self.hosts))
            return (self._srun_launch(self._environment(dict(shared), own)),)
        launches = []
        for node_rank, host in enumerate(self.hosts):
            ranks = tuple(r.rank for r in self.ranks if r.host == host.name)
            env = {**self._environment(dict(host.env), own), **interface_env(host)}
            if self.launcher != "lab":  # (the lab's own launcher tags its ranks' lines itself)
                env["LAB_TAG_OUTPUT"] = "1"
            args: tuple[str, ...]
            if self.launcher == "torchrun":
                args = ("-m", "lab.rank.node", *self._torchrun_args(host.slots), "--node-rank", str(node_rank),
                        "--local-addr", data_address(host))
            else:
                env.update(self._rendezvous_env(ranks[0]))
                args = ("-m", "lab.rank.node", "fork" if self.launcher == "lab" else "spawn",
                        "--nprocs", str(host.slots), "--first-rank", str(ranks[0]))
            if self.wire is not None:
                env[WIRE_VAR] = self.wire
            if self.checks_network:
                env[PREFLIGHT_VAR] = json.dumps({"name": host.name, "master_addr": self.master_addr,
                                                 "master_port": self.master_port if node_rank == 0 else None,
                                                 "take_master_port": self.hands_over_ports and node_rank == 0})
            launches.append(Launch(host.name, ranks, (*args, *self.program), env))
        return tuple(launches)

    def _own_settings(self) -> dict[str, str]:
        """The run's own settings for every rank, the same on every host."""
        env = {"PYTHONUNBUFFERED": "1", "LAB_TOKEN": self.token, HANG_AFTER_VAR: f"{self.hang_after:g}"}
        if not self.is_launch:
            env["LAB_RANK_PLAN"] = json.dumps(self.rank_plan())
        if self.work_key:  # (a project: its ranks start in its copy)
            env[WORKDIR_VAR] = f"{RUN_DIR}/{WORK_DIR}"
        if self.module:
            env[MODULE_VAR] = self.module
        return env

    def _environment(self, host_env: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
        """A host's launcher's settings, which its ranks inherit: the lab's defaults, the host's own
        (the inventory's ``env``), the run's ``rank_env`` over them, then the run's ``own`` (the
        user's PYTHONPATH after the lab's code)."""
        user = {**host_env, **self.rank_env}
        python_path = ":".join(p for p in (self.code_dir, user.pop("PYTHONPATH", "")) if p)
        return {"OMP_NUM_THREADS": "1", **user, "PYTHONPATH": python_path, **own}

    def _torchrun_args(self, slots: int) -> tuple[str, ...]:
        """``torchrun`` and the arguments a host's agent shares with the others' (``slots``: its ranks)."""
        return ("torchrun", "--nnodes", str(len(self.hosts)), "--nproc-per-node", str(slots),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", str(self.rdzv_endpoint),
                "--rdzv-id", public_id(self.token), "--max-restarts", "0")

    def _rendezvous_env(self, rank: int) -> dict[str, str]:
        """What the lab tells a host's launcher of the rendezvous (its ranks get the rest)."""
        planned = self.ranks[rank].env
        return {k: planned[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
                if k in planned}

    def _srun_launch(self, common: dict[str, str]) -> Launch:
        """One ``srun`` from the first host (the login host) for the whole job (``lab.rank.node srun``):
        its tasks are the ranks (``srun``: each maps SLURM_PROCID... to RANK...) or one torchrun per
        node (``srun-torchrun``, the tutorial's ``srun torchrun``)."""
        login = self.hosts[0]
        per_node = 1 if self.launcher == "srun-torchrun" else login.slots
        env = {**common, **interface_env(login)}
        task: tuple[str, ...]
        if self.launcher == "srun-torchrun":  # (a task is an agent: its ranks tag their lines themselves)
            env["LAB_TAG_OUTPUT"] = "1"
            task = self._torchrun_args(login.slots)
        else:
            env.update(self._rendezvous_env(0))
            task = ("task",)
        # (every count given: srun run from inside a step of an allocation would take that step's from its environment)
        srun = ("-m", "lab.rank.node", "srun", f"--nodes={len(self.hosts)}", f"--ntasks={len(self.hosts) * per_node}",
                f"--ntasks-per-node={per_node}", "--distribution=block",
                f"--nodelist={','.join(h.name for h in self.hosts)}", f"--job-name={self.job_name}",
                f"--immediate={max(1, round(self.timeout))}",  # (waiting longer for the nodes is a hang)
                *((f"--partition={self.partition}",) if self.partition else ()), "--")
        return Launch(login.name, tuple(r.rank for r in self.ranks), (*srun, *task, *self.program), env)

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
            "timeout": self.timeout, "hang_after": self.hang_after, "preflight": self.checks_network,
            **({"inputs": f"{len(next(iter(self.inputs.values()))) // VALUE_BYTES} random values per rank, "
                          "drawn for this run", "seed": self.seed} if self.inputs else {}),
            **({"part": self.part} if self.part else {}),
            **({"memory_mb": self.memory_mb} if self.memory_mb else {}),
            **({"pids_per_rank": self.pids} if self.pids else {}),
            "run_dir": f"{RUN_DIR} = <each host's temp dir>/{self.run_name}",
            **({"ports": f"{', '.join(port_macro(i) for i in range(self.port_count))}: chosen free and "
                         f"held on {self.hosts[0].name} when the run starts"} if self.port_count else {}),
            "hosts": [{"name": h.name, "address": h.address, "connection": h.connection,
                       "slots": h.slots, "gpus": h.gpus} for h in self.hosts],
            "ranks": [{"rank": r.rank, "local_rank": r.local_rank, "host": r.host,
                       "device": r.device, "env": dict(r.env)} for r in self.ranks],
            "launches": [{"host": launch.host, "ranks": list(launch.ranks), "command": ["python", *launch.args]}
                         for launch in self.launches()],
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


def data_address(host: Host) -> str:
    """The address peers use to reach ``host``; local hosts are on loopback."""
    if host.is_local:
        return "127.0.0.1"
    return host.data_address or host.address


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


def without_unshared(options: Options, hosts: Sequence[Host]) -> tuple[Options, tuple[Exercise, ...]]:
    """``run all`` on hosts that share no directory (no common shared_dir, not all this
    machine): the exercises that can run, and those left out for meeting in a file."""
    if all(h.is_local for h in hosts) or shared_run_dir(hosts, "") is not None:
        return options, ()
    left_out = tuple(e for e in options.exercises if e.rendezvous == "file")
    return replace(options, exercises=tuple(e for e in options.exercises if e not in left_out)), left_out


def placement_order(hosts: Sequence[Host], launcher: str) -> tuple[Host, ...]:
    """The hosts in the order their ranks are numbered. torchrun's c10d rendezvous numbers the
    nodes itself, in the sorted order of their addresses (``--local-addr``, then the agent's
    pid; under ``srun`` every agent has the same arguments, so its host's name), so that is the
    order here; ``srun`` numbers its tasks node by node, in the order slurm.conf lists the nodes.
    The runner learns the real placement from each rank."""
    if launcher == "torchrun":
        return tuple(sorted(hosts, key=data_address))
    if launcher == "srun-torchrun":
        return tuple(sorted(hosts, key=lambda h: h.name))
    return tuple(hosts)


class _PortMacros:
    """Hands out ``${port0}``, ``${port1}``... in order; ``count`` says how many it gave."""

    def __init__(self) -> None:
        self.count = 0

    def take(self) -> str:
        self.count += 1
        return port_macro(self.count - 1)


def build_plan(inventory: Inventory, options: Options, token: str | None = None) -> Plan:
    """Lay the ranks out over the hosts and the exercises over rendezvous stages (``token``:
    the run's, else a new one)."""
    hosts = inventory.hosts
    if not hosts:
        raise UsageError(f"{inventory.path}: no hosts")
    if options.init not in INIT_METHODS:
        raise UsageError(f"--init must be one of {', '.join(INIT_METHODS)}, got {options.init!r}")
    _check_launcher(options.launcher)
    if uses_torchrun(options.launcher) and options.init != "env":
        raise UsageError(f"with --launcher {options.launcher}, torchrun forms the process group (env://): "
                         "--init tcp and file need --launcher lab, spawn or srun")
    _check_slurm(hosts, options.launcher, options.partition)
    backend = options.backend or default_backend(hosts)
    if backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "nccl":
        for h in hosts:
            if h.gpus < h.slots:
                raise UsageError(f"host {h.name}: nccl needs one GPU per rank, but it has "
                                 f"{h.gpus} GPU(s) for {h.slots} slot(s); use --backend gloo")
    if options.solution and len(options.exercises) != 1:
        raise UsageError("--solution replaces one exercise's program: name exactly one exercise")
    if not options.exercises:
        raise UsageError("no exercise to run")
    for exercise in options.exercises:
        if inventory.world_size < exercise.min_ranks:
            raise UsageError(f"{exercise.name} needs at least {exercise.min_ranks} ranks; "
                             f"this cluster has {inventory.world_size}")

    hosts = placement_order(hosts, options.launcher)
    master = data_address(hosts[0])
    token = token or new_token()
    run_name = f"lab-run-{public_id(token)}"
    ports = _PortMacros()
    rdzv_port = ports.take() if uses_torchrun(options.launcher) else None
    uploads = {}
    program = None  # the solution as every host sees it: copied into the run directory
    if options.solution:
        relative = f"solution/{options.solution.rsplit('/', 1)[-1]}"
        uploads[relative] = options.solution
        program = f"{RUN_DIR}/{relative}"
    shared = shared_run_dir(hosts, run_name)
    part = checked_part(options)
    stages = tuple(_stage(kind, exs, master, ports, shared or RUN_DIR, program, part)
                   for kind, exs in _group_by_stage(options))
    master_port = rdzv_port or next((s.port for s in stages if s.port is not None), None)

    ranks = _lay_out_ranks(hosts, master, master_port, backend, options.launcher)
    drawn = max(e.drawn for e in options.exercises)
    seed = (options.seed or new_seed()) if drawn else None
    return Plan(world_size=inventory.world_size, backend=backend, init=options.init,
                master_addr=master, master_port=master_port, timeout=options.timeout,
                token=token, hosts=hosts, ranks=tuple(ranks), stages=stages, uploads=uploads,
                shared_run_dir=shared, launcher=options.launcher,
                rdzv_endpoint=_endpoint(master, rdzv_port), port_count=ports.count, memory_mb=options.memory_mb,
                pids=options.pids,
                partition=options.partition, rank_env=dict(options.rank_env), hang_after=options.hang_after,
                preflight=options.preflight, part=part,
                wire=options.wire if options.launcher == "lab" and backend == "gloo" else None,
                inputs={rank: draw(drawn, seed, rank) for rank in range(inventory.world_size)} if seed else {},
                seed=seed, order=tuple(e.name for e in options.exercises),
                hands_over_ports=options.launcher in ("lab", "spawn"))


def checked_part(options: Options) -> str | None:
    """``--part``: one part of the one exercise run, which has parts."""
    if options.part is None:
        return None
    if len(options.exercises) != 1:
        raise UsageError(f"--part {options.part} checks one part of one exercise: name one exercise")
    exercise = options.exercises[0]
    if options.part not in exercise.parts:
        has = f"its parts are {', '.join(exercise.parts)}" if exercise.parts else "it has no parts"
        raise UsageError(f"--part {options.part}: {exercise.name} has no such part ({has})")
    return options.part


def uses_torchrun(launcher: str) -> bool:
    """Whether torchrun starts the ranks (on every host, or under ``srun``) and forms their group."""
    return launcher in ("torchrun", "srun-torchrun")


def _check_launcher(launcher: str) -> None:
    if launcher not in LAUNCHERS:
        raise UsageError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")


_PARTITION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_partition(partition: str) -> None:
    """A Slurm partition's name, as it may go on srun's or sbatch's command line."""
    if not _PARTITION.fullmatch(partition):
        raise UsageError(f"--partition {partition!r}: not a Slurm partition's name (letters, digits, '_.-')")


def _check_slurm(hosts: Sequence[Host], launcher: str, partition: str | None) -> None:
    """What a job of one ``srun`` needs of the hosts: as many ranks on each (``--ntasks-per-node``)."""
    if partition is not None and launcher not in SRUN_LAUNCHERS:
        raise UsageError(f"--partition {partition!r}: a Slurm partition is for --launcher srun or srun-torchrun")
    if partition is not None:
        check_partition(partition)
    if launcher not in SRUN_LAUNCHERS:
        return
    slots = {h.slots for h in hosts}
    if len(slots) > 1:
        raise UsageError(f"--launcher {launcher} starts as many ranks on every node (srun --ntasks-per-node), "
                         f"but the hosts have {', '.join(f'{h.name} {h.slots}' for h in hosts)} slots")


def _endpoint(addr: str, port: str | None) -> str | None:
    return None if port is None else f"{_bracket(addr)}:{port}"


def _lay_out_ranks(hosts: Sequence[Host], master: str, master_port: str | None, backend: Backend,
                   launcher: Launcher) -> tuple[RankSpec, ...]:
    """Ranks host by host, each with the rendezvous settings it gets: from the lab (``lab``), from
    the host's ``mp.spawn`` (``spawn``), or from torchrun, which also picks MASTER_PORT."""
    world_size = sum(h.slots for h in hosts)
    ranks: list[RankSpec] = []
    for host in hosts:
        for local_rank in range(host.slots):
            rank = len(ranks)
            env = {"MASTER_ADDR": master, "RANK": str(rank), "WORLD_SIZE": str(world_size),
                   "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(host.slots)}
            if master_port is not None and not uses_torchrun(launcher):
                env["MASTER_PORT"] = master_port
            env.update(interface_env(host))
            device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
            ranks.append(RankSpec(rank, local_rank, host.name, device, env))
    return tuple(ranks)


def build_launch_plan(inventory: Inventory, script: str, args: Sequence[str], timeout: float,
                      launcher: Launcher = "lab", token: str | None = None, partition: str | None = None,
                      hang_after: float = DEFAULT_HANG_AFTER, preflight: bool = True,
                      rank_env: Mapping[str, str] | None = None, workdir: Workdir | None = None,
                      module: bool = False) -> Plan:
    """``lab launch``: the user's script on every rank, the rendezvous in its environment
    (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE), set by the launcher."""
    if not inventory.hosts:
        raise UsageError(f"{inventory.path}: no hosts")
    _check_launcher(launcher)
    _check_slurm(inventory.hosts, launcher, partition)
    hosts = placement_order(inventory.hosts, launcher)
    master = data_address(hosts[0])
    port = port_macro(0)
    backend = default_backend(hosts)
    uploads: dict[str, str] = {}
    if workdir is not None:  # (the project, in the run directory's work/: its ranks start there)
        program: tuple[str, ...] = () if module else (f"{RUN_DIR}/{WORK_DIR}/{workdir.relative(Path(script))}",)
    else:
        relative = f"script/{script.rsplit('/', 1)[-1]}"
        uploads, program = {relative: script}, (f"{RUN_DIR}/{relative}",)
    return Plan(world_size=inventory.world_size, backend=backend, init="env",
                master_addr=master, master_port=port, timeout=timeout, token=token or new_token(), hosts=hosts,
                ranks=_lay_out_ranks(hosts, master, port, backend, launcher),
                stages=(), uploads=uploads, script=(*program, *args),
                module=script if module else None,
                work={relative: str(path) for relative, path in workdir.files} if workdir is not None else {},
                work_key=workdir.key if workdir is not None else "",
                launcher=launcher, rdzv_endpoint=_endpoint(master, port) if uses_torchrun(launcher) else None,
                port_count=1, partition=partition, hang_after=hang_after, preflight=preflight,
                rank_env=dict(rank_env or {}))


StageKind = Literal["none", "torchrun", "env", "tcp", "file"]  # who forms the stage's group, and how


def _group_by_stage(options: Options) -> list[tuple[StageKind, list[Exercise]]]:
    """Stages in a fixed order: no-group first (it may fork), then the shared group,
    then each exercise that forms its own group."""
    none = [e for e in options.exercises if e.rendezvous == "none"]
    shared = [e for e in options.exercises if e.rendezvous == "shared"]
    own = [(e.rendezvous, e) for e in options.exercises if e.rendezvous != "none" and e.rendezvous != "shared"]
    groups: list[tuple[StageKind, list[Exercise]]] = []
    if none:
        groups.append(("none", none))
    if shared:  # the shared group uses --init, or torchrun's own rendezvous
        groups.append(("torchrun" if uses_torchrun(options.launcher) else options.init, shared))
    groups.extend((kind, [e]) for kind, e in own)
    return groups


def _stage(kind: StageKind, exercises: list[Exercise], master: str, ports: _PortMacros, files_dir: str,
           solution: str | None, part: str | None = None) -> Stage:
    shared = exercises[0].rendezvous == "shared"
    refs = tuple({"name": e.name, "program": solution or e.program, **({"reference": e.program} if solution else {}),
                  **({"writes": list(e.writes), "writes_some": e.writes_some} if e.writes else {}),
                  **({"part": part} if part and solution and part in e.writes else {})}  # (its function alone)
                 for e in exercises)
    if kind == "none":
        return Stage("none", "none", None, None, None, None, refs)
    if kind == "torchrun":  # MASTER_ADDR and MASTER_PORT are torchrun's: the stage names none
        return Stage("shared", "env", "env://", None, None, None, refs)
    rendezvous: Rendezvous = "shared" if shared else kind
    if kind == "file":
        path = f"{files_dir}/rendezvous-{'shared' if shared else exercises[0].name}"
        return Stage(rendezvous, "file", f"file://{path}", None, None, path, refs)
    port = ports.take()
    init_method = "env://" if kind == "env" else f"tcp://{_bracket(master)}:{port}"
    return Stage(rendezvous, kind, init_method, master, port, None, refs)


def _bracket(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr
