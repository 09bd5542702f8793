"""The rank side: one process per rank, started by the lab with its settings injected.

Run as ``python -m lab.rank.worker``. It needs only the standard library, torch and the
exercise programs, because it runs on every host (uploaded there by the lab).

Its instructions come in the environment, as a launcher gives them (the lab itself,
torchrun, or the host's ``mp.spawn``: see lab.rank.node): RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and ``LAB_RANK_PLAN``: JSON with the backend,
a timeout and the stages. The device is ``cuda:LOCAL_RANK`` with nccl, else the CPU. Where the run
drew inputs, the rank takes its own (``lab.rank.inputs``) before any program loads: an exercise's
``run`` gets them as ``inputs``.
A stage is one rendezvous (or none) and the exercises that run under it, so
exercises that can share a process group share one.

It reports to the controller in event lines (``lab.rank.protocol``), through a channel of its
own that nothing the exercise program prints can write to (``start_rank``): ``hello``, ``step``
(the rank begins something: ``init:env``, an exercise), ``result`` (an exercise's returned
dict), ``error`` (an exercise raised), ``fatal``, ``done``, and its flight recorder's
``progress`` and ``flight`` (``lab.rank.flight``: every torch.distributed call the rank makes,
the lab's own too; sent by its watcher, ``lab.rank.watcher``). ``result`` and ``error`` carry
``calls``: the torch.distributed calls the exercise made on this rank and the bytes it sent to
each peer (``lab.rank.calls``, installed before any exercise program is imported; it records
only while the exercise loads and runs, never the lab's own rendezvous and barriers).

The worker stops itself when its standard input closes (the controller is gone)
and dumps every thread's stack on SIGUSR1, so a hang can be located.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import faulthandler
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from lab.rank import inputs, protocol, steps
from lab.rank.isolation import ISOLATED_VAR
from lab.rank.labfiles import LAB_DIRS
from lab.rank.protocol import EVENT_MAX, Channel, EventKind, emit, event_line
from lab.rank.stdin import take_relayed

GROUP_TIMEOUT_MARGIN = 30.0  # seconds
PLAN_VAR = "LAB_RANK_PLAN"
TOKEN_VAR = "LAB_TOKEN"
RELAY_WAIT = 2.0  # seconds a rank that ends waits for its relay to pass its last lines on
PULSE_EVERY = 1.0  # seconds between two ``alive`` events of a rank in start-up
WATCHED_BY_PARENT = "LAB_WATCHED_BY_PARENT"  # set for ranks whose parent stops them with its group


def stop_when_orphaned(fd: int = 0) -> None:
    """End this rank's whole process group once the controller closes our stdin (``fd``: where a
    relay of the host's took fd 0's place, what stands for it: lab.rank.stdin.take_relayed)."""

    def watch() -> None:
        try:
            while os.read(fd, 4096):  # unbuffered: no lock held at interpreter shutdown
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="lab-stdin-watch", daemon=True).start()


def start_rank() -> None:
    """What every rank process does first, before it imports torch or any program: keep its real
    stdout as its private channel for events (``lab.rank.protocol.CHANNEL``) and send its fds 1
    and 2 through a relay that no line of which reads as an event (``lab.rank.output``; tagged with
    the rank when it shares its streams with other ranks), take the token out of its environment,
    dump its stacks on SIGUSR1, and stop when the controller goes away (unless its parent's
    process group does that for it)."""
    from lab.rank import lastcall
    from lab.rank.output import divert_output

    token = os.environ.pop(TOKEN_VAR, None)
    controller = take_relayed()  # (where the host relays the controller's stdin: the rank's fd 0 is the relay)
    rank = os.environ.get("RANK", "")
    rank_number = int(rank) if rank.isdigit() and len(rank) < 10 else None
    tag = rank_number if os.environ.get("LAB_TAG_OUTPUT") else None
    page = lastcall.Page(rank_number, token) if token is not None and rank_number is not None else None
    events, relay = divert_output(tag, page)  # (forks: before any thread of ours starts)
    lastcall.PAGE = page
    if token is not None:
        protocol.CHANNEL = Channel(events, token)
    atexit.register(finish_output, relay)
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    # and on a fatal signal: a rank that a C++ exception aborts (gloo's checks: "Received data size doesn't
    # match") runs no handler of Python's and sends nothing more, but its stacks show the call it was in
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if not os.environ.get(WATCHED_BY_PARENT):
        stop_when_orphaned(controller)


def finish_output(relay: int) -> None:
    """At the end: close this process's ends of the relay's pipes and give the relay RELAY_WAIT
    seconds to pass the last lines on (a process of the rank's that lives on may hold the pipes)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
    deadline = time.monotonic() + RELAY_WAIT
    while time.monotonic() < deadline:
        try:
            if os.waitpid(relay, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.005)


def load_program(program: str) -> ModuleType:
    """A program is a dotted module name or the path of a ``.py`` file (a solution).

    A file is loaded from its path, under a module name of its own: its file's name where that
    names no other module (``json.py``, ``torch.py``, ``os.py`` would: those get a name no module
    has), so that a solution is never shadowed by a module of the same name. Its directory joins
    ``sys.path``: a solution may import its own modules, and processes that mp.spawn starts
    inherit the path and so can unpickle the solution's functions (by their file's name).
    """
    if not program.endswith(".py"):
        return importlib.import_module(program)
    path = os.path.abspath(program)
    directory = os.path.dirname(path)
    name = _module_name(path)
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == path:
        return loaded
    if directory not in sys.path:
        sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {os.path.basename(path)}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _module_name(path: str) -> str:
    """The name a solution file is loaded under: its stem, unless a module of that name is loaded,
    is the standard library's or can be found elsewhere on ``sys.path``; then one of its own."""
    stem = os.path.basename(path)[:-3]
    loaded = sys.modules.get(stem)
    if stem.isidentifier() and (loaded is None or getattr(loaded, "__file__", None) == path) and \
            stem not in getattr(sys, "stdlib_module_names", ()) and stem not in sys.builtin_module_names:
        elsewhere = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(path)]
        found = importlib.machinery.PathFinder.find_spec(stem, elsewhere) if loaded is None else None
        if found is None:
            return stem
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in stem)
    return f"_lab_solution_{safe}"


def load_solution(program: str, reference: str | None, writes: tuple[str, ...] = (),
                  some: bool = False, part: str | None = None) -> tuple[ModuleType, tuple[str, ...]]:
    """The program to run, and which of ``writes`` the solution did not define. A solution may be
    a whole program (it defines ``run``) or the functions a student writes (``writes``, the
    exercise's parts: ``allreduce`` and ``ring_allreduce``, ``average_gradients``...): those then
    replace the reference program's own, and the reference's ``run`` drives them. Where the exercise
    asks for functions, a solution that defines another function of the reference (its case driver,
    say) is refused (ImportError, naming it): the driver and what it reports are the lab's.

    One of ``writes`` the solution lacks keeps the reference's own, so that the others are still
    graded: it is named among the missing, and its part is "not written". (Importing the
    reference's function is taking it on purpose: its part says it uses the reference's.) Where
    the exercise asks for functions, a ``run`` of the solution's is refused (ImportError): it could
    return anything in place of what the functions compute. With ``some`` (the bench: it times the
    rings a solution writes) only ``writes`` are taken, any of them, and a ``run`` is not used. With
    ``part`` (``--part``) only that function is taken: the others are the reference's, so a fault in
    one the grade is not about (a hang, say) cannot cost the part graded."""
    module = load_program(program)
    file = os.path.basename(program)
    if reference is not None and writes and not some and callable(getattr(module, "run", None)):
        raise ImportError(f"{file} defines run(): this exercise asks for {_listed(writes)}, which its own run() "
                          f"drives and checks; remove run()")
    if (hasattr(module, "run") and not some) or reference is None:
        return module, ()
    base = load_program(reference)
    replaced = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                and callable(getattr(base, n, None))]
    unasked = [n for n in replaced if n not in writes and getattr(module, n) is not getattr(base, n)]
    if writes and not some and unasked:
        raise ImportError(f"{file} defines {_listed(unasked)}, which {'is' if len(unasked) == 1 else 'are'} the "
                          f"exercise's own: it asks for {_listed(writes)} only; rename or remove "
                          f"{'it' if len(unasked) == 1 else 'them'}")
    names = [n for n in replaced if n in writes or not some]  # (one it imported from the reference: "uses")
    if part is not None:  # (--part: that function alone is the solution's; the others stay the reference's)
        return _replaced(base, module, [n for n in names if n == part]), () if part in names else (part,)
    if not names:
        ref = f"{reference.rsplit('.', 1)[-1]}.py"
        asked = f" (it asks for {_listed(writes)})" if writes else ""
        if some:
            raise ImportError(f"{file} defines none of {_listed(writes)}")
        raise ImportError(f"{file} defines neither run() nor any function of {ref} to replace{asked}")
    return _replaced(base, module, names), tuple(n for n in writes if n not in names and not some)


def _replaced(base: ModuleType, module: ModuleType, names: list[str]) -> ModuleType:
    """``base`` with the functions ``names`` of ``module`` in place of its own."""
    for name in names:
        setattr(base, name, getattr(module, name))
    return base


def _listed(names: list[str] | tuple[str, ...]) -> str:
    return ", ".join(f"{n}()" for n in names)


def record_functions(program: ModuleType, writes: tuple[str, ...], reference: str | None,
                     missing: tuple[str, ...] = ()) -> None:
    """Wrap the student's functions in ``program`` so that what each one sends is recorded apart
    (the reference's ``run`` looks them up there when it runs, and so does a whole program); the
    reference's own, where the solution took it or lacks it (``missing``), are recorded as such."""
    from lab.rank.calls import RECORDER

    RECORDER.reference_file = getattr(sys.modules.get(reference or ""), "__file__", None)
    for name in writes:
        fn = getattr(program, name, None)
        if callable(fn):
            borrowed = reference is not None and getattr(fn, "__module__", None) == reference
            setattr(program, name, RECORDER.scoped(name, fn, reference=borrowed, missing=name in missing))


def call_with_context(fn: Callable[..., Any], context: dict[str, Any]) -> Any:
    """Call ``fn`` with the context values its signature names (rank, size, device, ...)."""
    params = inspect.signature(fn).parameters
    return fn(**{name: context[name] for name in params if name in context})


class Rank:
    def __init__(self, plan: dict[str, Any], started: threading.Event | None = None) -> None:
        import torch

        self.started = started or threading.Event()  # set at its first step: start-up is over
        self.plan = plan
        self.token: str = plan["token"]
        self.rank = int(os.environ["RANK"])
        self.size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.backend: str = plan["backend"]
        self.timeout = float(plan["timeout"])
        self.device = torch.device(f"cuda:{self.local_rank}" if self.backend == "nccl" else "cpu")
        inputs.not_dumpable()  # (before its inputs, before any program: lab.rank.inputs)
        self.inputs = inputs.take(self.rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def emit(self, event: EventKind, **fields: Any) -> None:
        if event in ("step", "fatal", "done"):
            self.started.set()
        if event in ("error", "fatal"):  # an exception's message may be as long as a program likes
            fields = {k: capped(v) if k in TEXT_FIELDS else v for k, v in fields.items()}
        emit(self.token, event, rank=self.rank, **fields)

    def report(self, name: str, value: Any, seconds: float, calls: Any) -> bool:
        """Send an exercise's result; one too large to be an event is the exercise's error."""
        line = event_line(self.token, "result", rank=self.rank, exercise=name, value=value, seconds=seconds,
                          calls=calls)
        size = len(line.encode())
        if size > EVENT_MAX:
            self.emit("error", exercise=name, error=f"ValueError: the value run() returned is too large to report: "
                                                    f"{size} bytes as JSON (at most {EVENT_MAX})",
                      where="", traceback="", calls=calls)
            return False
        self.emit("result", exercise=name, value=value, seconds=seconds, calls=calls)
        return True

    def run(self) -> int:
        import torch

        from lab.rank.calls import install
        from lab.rank.watcher import WATCHER

        install()  # before any exercise program is imported: it binds the recorded functions
        keep_files_private()
        limit_memory(self.plan.get("memory_mb"))
        limit_processes(self.plan.get("pids"), int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        self.emit("hello", pid=os.getpid(), hostname=socket.gethostname(), local_rank=self.local_rank,
                  python=sys.version.split()[0], torch=torch.__version__)
        WATCHER.watch(self.rank)
        failures = 0
        for stage in self.plan["stages"]:
            failures += self.run_stage(stage)
        WATCHER.finish()  # its last dump, before the controller hears it is done
        self.emit("done", failures=failures)
        return 0

    def context(self, init_method: str | None) -> dict[str, Any]:
        return {"rank": self.rank, "size": self.size, "world_size": self.size,
                "local_rank": self.local_rank, "device": self.device,
                "backend": self.backend, "init_method": init_method, "inputs": self.inputs}

    def run_stage(self, stage: dict[str, Any]) -> int:
        """Form the stage's rendezvous (if the lab owns it), run its exercises, tear down."""
        init_method = stage.get("init_method")
        shared = stage["rendezvous"] == "shared"
        with stage_environment(stage):
            return self._run_stage(stage, init_method, shared)

    def _run_stage(self, stage: dict[str, Any], init_method: str | None, shared: bool) -> int:
        import torch.distributed as dist

        store = None  # rank 0's store on the held port, for as long as the stage lasts (held_store)
        try:
            store = self.held_store(stage)
            if stage["init"] == "file":
                ensure_shared_path(stage["path"], self.rank, self.size, self.timeout)
            if shared:
                self.emit("step", step=steps.rendezvous(stage["init"]).wire())
                # The controller's watchdog stops a hung rank at the lab's timeout and locates
                # it; the group's own timeout is only the backstop, so it comes later.
                dist.init_process_group(self.backend, init_method=init_method, rank=self.rank,
                                        world_size=self.size,
                                        timeout=datetime.timedelta(seconds=self.timeout + GROUP_TIMEOUT_MARGIN))
        except Exception as exc:  # the stage's exercises cannot run: each one failed for this reason
            for exercise in stage["exercises"]:
                self.emit("error", exercise=exercise["name"], error=f"{type(exc).__name__}: {exc}",
                          where=f"rendezvous {init_method}", traceback=traceback.format_exc())
            return len(stage["exercises"])
        failures = 0
        try:
            for exercise in stage["exercises"]:
                failures += not self.run_exercise(exercise, init_method)
                if shared:  # keep one exercise's messages out of the next
                    self.emit("step", step=steps.barrier(exercise["name"]).wire())
                    dist.barrier()
        finally:
            if shared and dist.is_initialized():
                dist.destroy_process_group()
            del store
        return failures

    def held_store(self, stage: dict[str, Any]) -> object | None:
        """On rank 0, where the lab hands over the held ports (lab.rank.ports): the stage's store,
        listening on the very socket the port holder held its port with, so that no other user's
        socket could take the port meanwhile. torch's rendezvous on that port (the lab's, or the
        exercise's own) finds it: a master store is one per port in a process (multi-tenant)."""
        port = stage.get("port")
        if self.rank != 0 or not self.plan.get("hands_over_ports") or port is None:
            return None
        import torch.distributed as dist

        from lab.rank.ports import take

        held = take(int(port))
        if held is None:
            raise RuntimeError(f"the run's port holder handed over no socket for port {port}")
        store = dist.TCPStore(stage["addr"], int(port), self.size, True, wait_for_workers=False,  # type: ignore[attr-defined]
                              multi_tenant=True,
                              timeout=datetime.timedelta(seconds=self.timeout + GROUP_TIMEOUT_MARGIN),
                              master_listen_fd=held.detach())  # (the store's from now on: it closes it)
        share_held_port(int(port))
        return store

    def run_exercise(self, exercise: dict[str, Any], init_method: str | None) -> bool:
        from lab.rank.calls import RECORDER

        name = exercise["name"]
        self.emit("step", step=steps.exercise(name).wire())
        started = time.monotonic()
        reference, writes, some = exercise.get("reference"), tuple(exercise.get("writes", ())), \
            bool(exercise.get("writes_some"))
        part = exercise.get("part")
        try:
            with RECORDER.recording():  # only the exercise's own calls: not the lab's barrier after it
                program, missing = load_solution(exercise["program"], reference, writes, some, part)
                record_functions(program, writes, reference, missing)
                value = call_with_context(program.run, self.context(init_method))
        except Exception as exc:  # an exercise's failure is a result, not the worker's end
            self.emit("error", exercise=name, error=error_text(exc), where=_where(exc, exercise["program"]),
                      traceback=program_traceback(exc), calls=RECORDER.summary())
            return False
        except SystemExit as exc:  # the exercise ends this rank: say where, then end as it asked
            code = "" if exc.code is None else repr(exc.code)
            self.emit("error", exercise=name, error=f"SystemExit: sys.exit({code})",
                      where=_where(exc, exercise["program"]), traceback=program_traceback(exc),
                      calls=RECORDER.summary())
            raise
        return self.report(name, value, time.monotonic() - started, RECORDER.summary())


_HELD_PORTS: set[int] = set()  # the ports whose master store rank 0 made on the holder's socket (held_store)


def share_held_port(port: int) -> None:
    """A master TCPStore the program makes itself on ``port`` (``dist.TCPStore(addr, port, n,
    is_master=True)``, as the tutorials' machine-to-machine program does) is the held one too: the
    program's torch.distributed.TCPStore makes it multi-tenant there, so it finds the store on the
    holder's socket instead of binding a port no one can bind again."""
    import torch.distributed as dist

    _HELD_PORTS.add(port)
    original = dist.TCPStore  # type: ignore[attr-defined]
    if getattr(original, "_lab_held", False):
        return

    class TCPStore(original):  # type: ignore[misc, valid-type]
        _lab_held = True

        def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                     *args: Any, **kwargs: Any) -> None:
            if is_master and port in _HELD_PORTS and not args[2:3]:  # (multi_tenant not given by position)
                kwargs["multi_tenant"] = True
            super().__init__(host_name, port, world_size, is_master, *args, **kwargs)

    setattr(dist, "TCPStore", TCPStore)  # noqa: B010 (torch's stubs do not export it)


@contextlib.contextmanager
def stage_environment(stage: dict[str, Any]) -> Iterator[None]:
    """The environment of one stage: its MASTER_ADDR and MASTER_PORT when the lab chose them
    (under torchrun a stage of the lab's own is no client of torchrun's store)."""
    saved = dict(os.environ)
    if stage.get("port") is not None:
        os.environ.update(MASTER_ADDR=stage["addr"], MASTER_PORT=str(stage["port"]))
        os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class SharedPathError(RuntimeError):
    pass


def ensure_shared_path(path: str, rank: int, size: int, timeout: float) -> None:
    """Prove that every rank sees the same directory before a ``file://`` rendezvous.

    Each rank drops a marker beside the rendezvous file and waits for all the others'.
    A rank that never sees them all is not on a shared filesystem, and FileStore
    would wait forever: say so instead.
    """
    markers = f"{path}.ranks"
    os.makedirs(markers, exist_ok=True)
    with open(os.path.join(markers, str(rank)), "w") as f:
        f.write(socket.gethostname())
    deadline = time.monotonic() + min(timeout, 15.0)
    while True:
        seen = sorted(int(n) for n in os.listdir(markers) if n.isdigit())
        if len(seen) >= size:
            return
        if time.monotonic() > deadline:
            raise SharedPathError(
                f"{path} is not shared: rank {rank} on {socket.gethostname()} sees markers of "
                f"ranks {seen} only; file:// needs a directory every host mounts (NFS, ...): "
                f"name it with shared_dir in the inventory")
        time.sleep(0.05)


def keep_files_private() -> None:
    """Whatever this rank writes is its user's alone (umask 077), and its temporary files go to
    ``tmp`` in the run directory (TMPDIR), removed with it: another user of the host (another
    share, graded beside it) can neither read them nor find them in /tmp. What a program still
    puts in /tmp, /var/tmp or /dev/shm itself is private too, and the grader's sweep removes it.
    (A rank kept apart from the others, ``lab.rank.isolation``, has a /tmp of its own for them.)"""
    import tempfile

    os.umask(0o077)
    if os.environ.get(ISOLATED_VAR):
        return
    private = os.path.abspath("tmp")
    os.makedirs(private, mode=0o700, exist_ok=True)
    os.environ.update(TMPDIR=private, TMP=private, TEMP=private)
    tempfile.tempdir = None  # (it cached the old one)


def limit_memory(megabytes: int | None) -> None:
    """Cap this process's data memory (RLIMIT_DATA: the heap and private writable mappings, what
    torch allocates tensors in) at ``megabytes``, torch's own included, for good: the hard limit
    too, so the program cannot raise it. An allocation past it fails (a MemoryError or torch's
    "can't allocate memory"), in the exercise, as the student's error."""
    if megabytes:
        import resource

        limit = megabytes * 2**20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def limit_processes(per_rank: int | None, local_ranks: int) -> None:
    """Cap the processes and threads of this rank's user on the host (RLIMIT_NPROC, counted over all
    of the user's: the grader runs each submission as a user of its own) at ``per_rank`` for each of
    its ``local_ranks``, and LAB_PROCESSES more for the lab's own (its session, launcher, relays), for
    good. A fork past it fails in the exercise (BlockingIOError), as the student's error. Root has no
    such limit."""
    if per_rank:
        import resource

        limit = per_rank * local_ranks + LAB_PROCESSES
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))


LAB_PROCESSES = 16
TEXT_FIELDS = ("error", "where", "traceback")
TEXT_MAX = 64 * 1024  # characters of each of an error's texts sent (an event line has at most EVENT_MAX bytes)


def capped(text: str) -> str:
    """``text``, its middle cut out if it is longer than TEXT_MAX."""
    if len(text) <= TEXT_MAX:
        return text
    half = TEXT_MAX // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def error_text(exc: BaseException) -> str:
    """``Type: message``; a SyntaxError's message without its ``(file, line N)``: where says it."""
    if isinstance(exc, SyntaxError) and exc.msg:
        return f"{type(exc).__name__}: {exc.msg}"
    return f"{type(exc).__name__}: {exc}"


def program_traceback(exc: BaseException) -> str:
    """The traceback of an exercise's exception as its program's author should see it: the frames of
    the program and of torch, not the lab's own (the worker, the exercise's driver)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(LAB_DIRS)]
    return ("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames))
            + "".join(traceback.format_exception_only(type(exc), exc)))


def _where(exc: BaseException, program: str) -> str:
    """``file:line: source`` of the deepest frame inside the exercise program; for a SyntaxError
    (no frame of the program ran), the line it names."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        source = (exc.text or "").strip()
        return f"{os.path.basename(exc.filename)}:{exc.lineno}" + (f": {source}" if source else "")
    frames = traceback.extract_tb(exc.__traceback__)
    name = program.replace(".", "/") + ".py" if not program.endswith(".py") else program
    mine = [f for f in frames if f.filename.endswith(name)]
    if not mine:  # it failed before reaching the program (loading it, say): the message says it
        return ""
    f = mine[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno}: {(f.line or '').strip()}"


class StartupPulse:
    """Each PULSE_EVERY seconds until the rank begins its first step, an ``alive`` event with the CPU
    seconds the process has used: the kernel's word that its start-up (importing torch, above all)
    is under way, however slowly a busy machine lets it go. The controller's deadline for start-up
    counts only time in which nothing of the run moved (``lab.core.runner``)."""

    def __init__(self, rank: int, token: str) -> None:
        self.rank, self.token = rank, token
        self.started = threading.Event()
        threading.Thread(target=self._run, name="lab-startup-pulse", daemon=True).start()

    def _run(self) -> None:
        while not self.started.wait(PULSE_EVERY):
            try:
                emit(self.token, "alive", rank=self.rank, cpu=round(sum(os.times()[:2]), 2))
            except OSError:  # (the channel is gone, and the controller with it)
                return


def main() -> int:
    start_rank()
    plan = json.loads(os.environ.pop(PLAN_VAR))  # (it holds the token: no program reads it there)
    pulse = StartupPulse(int(os.environ.get("RANK", -1)), plan["token"])
    try:
        return Rank(plan, pulse.started).run()
    except Exception as exc:  # start-up failed outside any exercise: report it, don't just die
        emit(plan["token"], "fatal", rank=int(os.environ.get("RANK", -1)),
             error=capped(f"{type(exc).__name__}: {exc}"), traceback=capped(traceback.format_exc()))
    return 3


if __name__ == "__main__":
    sys.exit(main())
