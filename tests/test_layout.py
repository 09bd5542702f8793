"""The package's seams hold: what travels to the hosts needs nothing of the controller's, the
modules import each other one way only (down the floors), and only the CLI's views print."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from lab.transport.base import PACKAGE_DIR, code_uploads

CONTROLLER_SIDE = ("lab.cli", "lab.core", "lab.net", "lab.transport", "lab.doctor", "lab.containerlab", "lab.grading",
                   "lab.errors", "lab.inventory", "lab.notebook")
THIRD_PARTY = ("yaml", "paramiko", "docker", "rich", "cryptography")
# The floors, lowest first: a module imports only from its own floor and the ones below it. A module
# is on the lowest floor that names it or a package above it: the inventory's room stands on two, its
# model and the vocabulary its keys are declared in below the transports (which import them), its
# reading with the core (it reads the keys the transports declare, and the ranks' settings' names).
FLOORS = (
    ("lab.suite",),
    ("lab.rank",),
    ("lab.errors", "lab.inventory.model", "lab.inventory.keys"),
    ("lab.transport",),
    ("lab.netcheck",),
    ("lab.core", "lab.inventory"),
    ("lab.jobs",),
    ("lab.net",),
    ("lab.containerlab",),
    ("lab.grading",),
    ("lab.doctor",),
    ("lab.cli", "lab.__main__", "lab.notebook"),
)
VIEWS = "lab.cli.views"  # the one part of the controller side that prints for a person (and imports rich)


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def floor(name: str) -> int | None:
    """The floor of a module (``lab`` itself, the package's docstring, is below them all)."""
    if name == "lab":
        return -1
    return next((level for level, prefixes in enumerate(FLOORS) if any(within(name, p) for p in prefixes)), None)


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package under ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def uploaded_copy(tmp_path: Path) -> tuple[Path, list[str]]:
    """The files a run carries to a host, laid out as on the host; their module names."""
    code = tmp_path / "code"
    for relative, source in code_uploads().items():
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    return code, sorted(modules(code / "lab"))


def run_isolated(code: Path, script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter that sees the uploaded copy and nothing of this checkout."""
    return subprocess.run([sys.executable, *flags, "-c", script], cwd=code, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"})


def test_only_the_rank_side_and_the_exercise_programs_travel_to_the_hosts(tmp_path: Path) -> None:
    """Nothing of a checker reaches a host: a rank that tries to import one (to read what it expects) fails."""
    code, names = uploaded_copy(tmp_path)
    assert {n.split(".")[1] for n in names if n != "lab"} == {"rank", "suite"}
    assert "lab.rank.protocol" in names and "lab.suite.exercises.ring_cases" in names
    assert not [n for n in names if n.startswith("lab.suite.") and not n.startswith("lab.suite.exercises")]
    for checker in ("lab.suite.checks.ring", "lab.suite.registry", "lab.suite.check", "lab.suite.method"):
        done = run_isolated(code, f"import {checker}")
        assert "ModuleNotFoundError" in done.stderr, (checker, done.stderr)


def test_what_travels_needs_only_the_standard_library(tmp_path: Path) -> None:
    """Every uploaded module but the exercise programs (which need torch) imports with no
    site-packages at all (python -S) and nothing but the uploaded copy on the path."""
    code, names = uploaded_copy(tmp_path)
    plain = [n for n in names if not n.startswith("lab.suite.exercises.")]
    script = (f"import importlib, sys\nfor name in {plain!r}:\n    importlib.import_module(name)\n"
              f"print(sorted(m for m in sys.modules if m.startswith({CONTROLLER_SIDE!r} + {THIRD_PARTY!r})))")
    done = run_isolated(code, script, "-S")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_exercise_programs_need_torch_and_nothing_of_the_controllers(tmp_path: Path) -> None:
    code, names = uploaded_copy(tmp_path)
    exercises = [n for n in names if n.startswith("lab.suite.exercises.")]
    script = (f"import importlib, sys\nfor name in {exercises!r}:\n    importlib.import_module(name)\n"
              f"print(sorted(m for m in sys.modules if m.split('.')[0] in {THIRD_PARTY!r} "
              f"or m.startswith({CONTROLLER_SIDE!r})))")
    done = run_isolated(code, script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert len(exercises) >= 19


def imports_of(path: Path, name: str) -> set[str]:
    """The lab modules ``path`` (module ``name``) imports, at any depth of the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found |= {base, *(f"{base}.{a.name}" for a in node.names)}
    return {m for m in found if m.split(".")[0] == "lab"}


def test_no_import_cycles() -> None:
    known = modules(PACKAGE_DIR)
    graph = {name: {m for m in imports_of(path, name) if m in known and m != name} for name, path in known.items()}
    # A package imports its submodules only through their own files: a module that imports a
    # package does not import what is under it.
    cycles, state = [], {name: 0 for name in graph}  # 0 new, 1 on the path, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            if state[nxt] == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [name, nxt]) if nxt in path else f"{name} -> {nxt}")
            elif state[nxt] == 0:
                visit(nxt, [*path, name])
        state[name] = 2

    for name in sorted(graph):
        if state[name] == 0:
            visit(name, [])
    assert cycles == []


def above(one: str, other: str) -> bool:
    return (floor(one) or 0) > (floor(other) or 0)


def test_every_module_is_on_a_floor() -> None:
    assert [name for name in modules(PACKAGE_DIR) if floor(name) is None] == []


def test_modules_import_only_from_their_floor_and_below() -> None:
    known = modules(PACKAGE_DIR)
    upward = sorted(f"{name} imports {imported}" for name, path in known.items()
                    for imported in imports_of(path, name) if imported in known and above(imported, name))
    assert upward == []


def test_the_rank_side_and_the_suite_never_import_the_controller_side() -> None:
    for name, path in modules(PACKAGE_DIR).items():
        if name.startswith(("lab.rank", "lab.suite")):
            assert not {m for m in imports_of(path, name) if m.startswith(CONTROLLER_SIDE)}, name


PRINTING = ("print", "sys.stdout.write", "sys.stderr.write", "sys.stdout.buffer.write", "sys.stderr.buffer.write")
EXITING = ("sys.exit", "exit", "os._exit")


def test_only_the_cli_s_views_print_and_only_the_cli_exits() -> None:
    """The controller side returns data and raises; ``lab.cli``'s views alone talk to the user (the
    rank programs' own output is theirs), and only ``lab.cli`` ends the process."""
    offenders = []
    for name, path in modules(PACKAGE_DIR).items():
        if not name.startswith(CONTROLLER_SIDE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                prints, exits = called in PRINTING, called in EXITING
                if (prints and not within(name, VIEWS)) or (exits and not within(name, "lab.cli")):
                    offenders.append(f"{name}:{node.lineno} {called}")
    assert offenders == []


def test_rich_is_imported_only_by_the_cli_s_views() -> None:
    offenders = []
    for name, path in modules(PACKAGE_DIR).items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(within(n, "rich") for n in names) and not within(name, VIEWS):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_what_a_run_comes_to_is_plain_data() -> None:
    """The outcome, the judge and the analysis hold no process or connection: they import no transport
    (the runner keeps its processes; what it hands on is data)."""
    package = modules(PACKAGE_DIR)
    for name in ("lab.core.outcome", "lab.core.judge", "lab.core.why", "lab.core.ledger"):
        assert not any(within(imported, "lab.transport") for imported in imports_of(package[name], name)), name


def test_the_ledger_alone_writes_the_ranks_and_launches_states() -> None:
    """What the controller knows of a rank or a launch (RankState, LaunchState) has one writer: the
    ledger. A module that holds them (imports either) assigns none of their fields; the stream readers
    fill the buffers the states hold (Output, Reading), whose fields are other names."""
    from dataclasses import fields

    from lab.core.outcome import LaunchState, RankState

    names = {f.name for cls in (RankState, LaunchState) for f in fields(cls)}
    writes = []
    for name, path in modules(PACKAGE_DIR).items():
        if name == "lab.core.ledger" or not {"lab.core.outcome.RankState", "lab.core.outcome.LaunchState"} & \
                imports_of(path, name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for part in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(part, ast.Attribute) and part.attr in names and not (
                            isinstance(part.value, ast.Name) and part.value.id == "self"):
                        writes.append(f"{name}:{part.lineno} writes .{part.attr}")
    assert writes == []
