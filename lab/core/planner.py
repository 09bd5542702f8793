"""The planner: a pure function from (inventory, options) to the plan every rank runs
(``lab.core.plan``), the same for ``run`` and ``launch``: the launcher named (``lab.core.launchers``)
checks the hosts and orders them as it numbers their ranks, the ranks are laid out over them, the
exercises over rendezvous stages, and the launcher makes the processes that start the ranks.
Nothing here does I/O or imports torch."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lab.core import launchers
from lab.core.launchers import Launcher
from lab.core.plan import (
    BACKENDS,
    DEFAULT_HANG_AFTER,
    INIT_METHODS,
    RUN_DIR,
    WORK_DIR,
    Backend,
    Options,
    Plan,
    RankSpec,
    Stage,
    default_backend,
    interface_env,
    new_token,
    port_macro,
    run_name,
    shared_run_dir,
)
from lab.core.random_inputs import draw, new_seed
from lab.core.workdir import Workdir
from lab.errors import UsageError
from lab.inventory.model import Host, Inventory
from lab.suite.registry import Exercise, Rendezvous

if TYPE_CHECKING:
    from lab.core.requirements import Requirements


def without_unshared(options: Options, hosts: Sequence[Host]) -> tuple[Options, tuple[Exercise, ...]]:
    """``run all`` on hosts that share no directory (no common shared_dir, not all this
    machine): the exercises that can run, and those left out for meeting in a file."""
    if all(h.is_local for h in hosts) or shared_run_dir(hosts, "") is not None:
        return options, ()
    left_out = tuple(e for e in options.exercises if e.rendezvous == "file")
    return replace(options, exercises=tuple(e for e in options.exercises if e not in left_out)), left_out


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
    if options.init not in INIT_METHODS:
        raise UsageError(f"--init must be one of {', '.join(INIT_METHODS)}, got {options.init!r}")
    launcher, hosts = _placed(inventory, options)
    if launcher.forms_group and options.init != "env":
        raise UsageError(f"with --launcher {launcher.name}, torchrun forms the process group (env://): "
                         "--init tcp and file need --launcher lab, spawn or srun")
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

    master = hosts[0].peer_address
    token = token or new_token()
    ports = _PortMacros()
    rdzv_port = ports.take() if launcher.forms_group else None
    uploads = {}
    program = None  # the solution as every host sees it: copied into the run directory
    if options.solution:
        relative = f"solution/{options.solution.rsplit('/', 1)[-1]}"
        uploads[relative] = options.solution
        program = f"{RUN_DIR}/{relative}"
    shared = shared_run_dir(hosts, run_name(token))
    part = checked_part(options)
    stages = tuple(_stage(kind, exs, master, ports, shared or RUN_DIR, program, part)
                   for kind, exs in _group_by_stage(options, launcher))
    master_port = rdzv_port or next((s.port for s in stages if s.port is not None), None)

    ranks = _lay_out_ranks(hosts, master, master_port, backend, launcher)
    drawn = max(e.drawn for e in options.exercises)
    seed = (options.seed or new_seed()) if drawn else None
    return _with_launches(launcher, Plan(
        world_size=inventory.world_size, backend=backend, master_addr=master,
        master_port=master_port, options=options, token=token, hosts=hosts, ranks=tuple(ranks), stages=stages,
        uploads=uploads, shared_run_dir=shared, rdzv_endpoint=_endpoint(master, rdzv_port), port_count=ports.count,
        checks_network=options.preflight and launcher.checks_network,
        wire=options.wire if launcher.measures_wire and backend == "gloo" else None,
        inputs={rank: draw(drawn, seed, rank) for rank in range(inventory.world_size)} if seed else {},
        seed=seed, hands_over_ports=launcher.hands_over_ports))


def _placed(inventory: Inventory, options: Options) -> tuple[Launcher, tuple[Host, ...]]:
    """The options' launcher and the inventory's hosts in the order it numbers their ranks, once it
    has checked them (``run`` and ``launch`` alike)."""
    if not inventory.hosts:
        raise UsageError(f"{inventory.path}: no hosts")
    launcher = launchers.find(options.launcher)
    launcher.check(inventory.hosts, options.partition)
    if options.max_restarts and not launcher.restarts_ranks:
        restarting = " or ".join(n for n, each in launchers.LAUNCHERS.items() if each.restarts_ranks)
        raise UsageError(f"--max-restarts {options.max_restarts}: only torchrun's agent restarts the ranks "
                         f"(--launcher {restarting}), not --launcher {launcher.name}")
    if options.rank_users is not None and not launcher.isolates_ranks:  # (never run them together instead)
        isolating = " or ".join(n for n, each in launchers.LAUNCHERS.items() if each.isolates_ranks)
        raise UsageError(f"ranks kept apart as users of their own need --launcher {isolating}, "
                         f"not --launcher {launcher.name}")
    return launcher, launcher.order(inventory.hosts)


def _with_launches(launcher: Launcher, plan: Plan) -> Plan:
    """``plan`` holding the processes its launcher starts for it."""
    return replace(plan, launches=launcher.launches(plan))


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
            if master_port is not None and not launcher.forms_group:
                env["MASTER_PORT"] = master_port
            env.update(interface_env(host))
            device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
            ranks.append(RankSpec(rank, local_rank, host.name, device, env))
    return tuple(ranks)


def build_launch_plan(inventory: Inventory, script: str, args: Sequence[str], timeout: float,
                      launcher: str = "lab", token: str | None = None, partition: str | None = None,
                      hang_after: float = DEFAULT_HANG_AFTER, preflight: bool = True,
                      rank_env: Mapping[str, str] | None = None, workdir: Workdir | None = None,
                      module: bool = False, max_restarts: int = 0, trace: bool = False,
                      torch_dumps: bool = False, in_place: Path | None = None,
                      bring_back_max: int = 1 << 30, sync_back: Sequence[str] = (),
                      requirements: Mapping[str, Requirements] | None = None, cells_mark: str = "") -> Plan:
    """``lab launch``: the user's script on every rank, the rendezvous in its environment
    (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE), set by the launcher. The
    ranks start in a copy of the project (``workdir``) on every host, or in the project folder
    itself (``in_place``: this machine's ranks, or hosts whose shared folder holds it), with each
    host's ``requirements`` (by host name) on their path."""
    options = Options((), timeout=timeout, launcher=launcher, partition=partition, hang_after=hang_after,
                      preflight=preflight, rank_env=dict(rank_env or {}), max_restarts=max_restarts, trace=trace,
                      torch_dumps=torch_dumps, bring_back_max=bring_back_max, sync_back=tuple(sync_back),
                      cells_mark=cells_mark)
    starter, hosts = _placed(inventory, options)
    master = hosts[0].peer_address
    port = port_macro(0)
    backend = default_backend(hosts)
    uploads: dict[str, str] = {}
    if in_place is not None:  # (this machine's ranks, or the hosts' shared folder's: they start in the project)
        program: tuple[str, ...] = () if module else (str(Path(script).resolve()),)
    elif workdir is not None:  # (the project, in the run directory's work/: its ranks start there)
        program = () if module else (f"{RUN_DIR}/{WORK_DIR}/{workdir.relative(Path(script))}",)
    else:
        relative = f"script/{script.rsplit('/', 1)[-1]}"
        uploads, program = {relative: script}, (f"{RUN_DIR}/{relative}",)
    return _with_launches(starter, Plan(
        world_size=inventory.world_size, backend=backend, master_addr=master, master_port=port,
        options=options, token=token or new_token(), hosts=hosts,
        ranks=_lay_out_ranks(hosts, master, port, backend, starter), stages=(), uploads=uploads,
        script=(*program, *args), module=script if module else None,
        work={relative: str(path) for relative, path in workdir.files} if workdir is not None else {},
        work_key=workdir.key if workdir is not None else "", in_place=str(in_place.resolve()) if in_place else "",
        work_root=str(workdir.root) if workdir is not None else "", requirements=dict(requirements or {}),
        rdzv_endpoint=_endpoint(master, port) if starter.forms_group else None, port_count=1,
        checks_network=preflight and starter.checks_network))


StageKind = Literal["none", "torchrun", "env", "tcp", "file"]  # who forms the stage's group, and how


def _group_by_stage(options: Options, launcher: Launcher) -> list[tuple[StageKind, list[Exercise]]]:
    """Stages in a fixed order: no-group first (it may fork), then the shared group,
    then each exercise that forms its own group."""
    none = [e for e in options.exercises if e.rendezvous == "none"]
    shared = [e for e in options.exercises if e.rendezvous == "shared"]
    own = [(e.rendezvous, e) for e in options.exercises if e.rendezvous != "none" and e.rendezvous != "shared"]
    groups: list[tuple[StageKind, list[Exercise]]] = []
    if none:
        groups.append(("none", none))
    if shared:  # the shared group uses --init, or torchrun's own rendezvous
        groups.append(("torchrun" if launcher.forms_group else options.init, shared))
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
