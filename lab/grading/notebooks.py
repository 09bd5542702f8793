"""A notebook as a solution: the cells that define a student's functions, as one ``.py`` file that is
run and checked exactly as a ``.py`` hand-in is (``lab grade``, ``run --solution``, ``%lab check``).

What is taken, and nothing else (no other statement of the notebook runs):

* what the notebook's ranks start with (``lab.rank.cells``: ``torch``, ``torch.distributed as dist``);
* the cells marked as the student's answer, where any is: tagged ``solution`` (or ``otter``'s
  ``otter_answer_cell``), or nbgrader's ``"nbgrader": {"solution": true}``; else every code cell;
* of those, in order, each top-level ``import``, function and class (a name defined again: its last
  definition), and each assignment to a name of a value computed without a call (a constant, a table
  of names: ``OPS = {"SUM": dist.ReduceOp.SUM}``); a ``%%dist`` cell's
  body is Python (its first line, the magic, is left out), and any other line of IPython's (``%...``,
  ``!...``) is left out;
* a cell that is not Python is skipped and said; each definition is marked with the cell it came from
  (``# cell [7]``), which the feedback shows.
"""
from __future__ import annotations

import ast
import atexit
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from lab.errors import UsageError

T = TypeVar("T", dict, list)  # type: ignore[type-arg]
PRELUDE = ("import torch", "import torch.distributed as dist")  # what a notebook's ranks have (lab.rank.cells)
ANSWER_TAGS = ("solution", "otter_answer_cell")
NOTEBOOK_MAX = 16 << 20  # bytes of a notebook read (its outputs may hold images)


@dataclass(frozen=True)
class NotebookCell:
    label: str  # "cell [7]" (its execution count), else "cell 3" (its place among the code cells)
    source: str
    answer: bool = False  # tagged as the student's answer


@dataclass(frozen=True)
class Extracted:
    source: str  # the solution's file
    defines: tuple[str, ...]  # the functions and classes it defines
    notes: tuple[str, ...]  # what was skipped, and why


def read_cells(path: Path) -> list[NotebookCell]:
    """The code cells of the notebook at ``path``; UsageError (one line) where it is no notebook."""
    try:
        with path.open("rb") as f:
            data = f.read(NOTEBOOK_MAX + 1)
    except OSError as exc:
        raise UsageError(f"{path.name}: cannot be read ({exc.strerror})") from None
    if len(data) > NOTEBOOK_MAX:
        raise UsageError(f"{path.name}: more than {NOTEBOOK_MAX >> 20} MiB, more than a notebook the lab reads")
    try:
        notebook = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path.name}: not a notebook (not JSON: {str(exc)[:120]})") from None
    except RecursionError:  # (JSON nested deeper than the reader goes: a hand-in's, hostile or broken)
        raise UsageError(f"{path.name}: not a notebook (JSON nested too deep to read)") from None
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise UsageError(f"{path.name}: not a notebook (no list of cells)")
    found = []
    for place, cell in enumerate(c for c in cells if isinstance(c, dict) and c.get("cell_type") == "code"):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) and all(isinstance(s, str) for s in source) else source
        if not isinstance(source, str):
            continue
        metadata = _field(cell, "metadata", dict)
        tags, nbgrader = _field(metadata, "tags", list), _field(metadata, "nbgrader", dict)
        count = cell.get("execution_count")
        label = f"cell [{count}]" if isinstance(count, int) else f"cell {place + 1}"
        answer = any(tag in ANSWER_TAGS for tag in tags) or nbgrader.get("solution") is True
        found.append(NotebookCell(label, source, answer))
    return found


def _field(holder: dict[str, Any], name: str, kind: type[T]) -> T:
    """``holder[name]`` where it is a ``kind`` (a dict, a list), else an empty one."""
    value = holder.get(name)
    return value if isinstance(value, kind) else kind()


def extract(cells: list[NotebookCell], origin: str) -> Extracted:
    """The solution file the cells make (see the module); ``origin``: the notebook's name, said in it."""
    chosen = [c for c in cells if c.answer] or cells
    kept: dict[str, str] = {}  # a name -> its last definition (with its cell's mark)
    order: list[str] = []
    functions: set[str] = set()  # of those, the functions and classes
    imports: list[str] = []
    notes: list[str] = []
    for cell in chosen:
        try:
            code = python_of(cell.source)
            tree = ast.parse(code)
        except SyntaxError as exc:
            notes.append(f"{cell.label} is not Python ({exc.msg}, line {exc.lineno}): skipped")
            continue
        except (RecursionError, MemoryError, ValueError):  # (nested deeper than the parser goes; a NUL byte)
            notes.append(f"{cell.label} is not Python the lab can read: skipped")
            continue
        for node in tree.body:
            text = ast.get_source_segment(code, node, padded=False) or ""
            decorated = getattr(node, "decorator_list", [])
            if decorated:  # (its decorators are part of it)
                text = "\n".join(code.splitlines()[decorated[0].lineno - 1:node.end_lineno or node.lineno])
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if text not in imports:
                    imports.append(text)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                _keep(kept, order, node.name, f"# {cell.label}\n{text}")
                functions.add(node.name)
            elif isinstance(node, ast.Assign) and _constant(node.value) and all(
                    isinstance(t, ast.Name) for t in node.targets):
                for target in node.targets:
                    assert isinstance(target, ast.Name)
                    _keep(kept, order, target.id, f"# {cell.label}\n{text}")
                    functions.discard(target.id)
    defines = tuple(name for name in order if name in functions)
    body = "\n\n\n".join(kept[name] for name in order)
    imports = [*(line for line in PRELUDE if line not in imports), *imports]
    source = (f'"""{_quoted(origin)}: its imports, functions, classes and constants, as the lab took them (no '
              f'other statement of it runs)."""\n' + "\n".join(imports) + "\n\n\n" + body + "\n")
    return Extracted(source, defines, tuple(notes))


def written(extracted: Extracted, stem: str, folder: Path | None = None) -> Path:
    """``extracted`` as ``STEM.py`` in ``folder`` (else a temporary folder, removed as the process ends)."""
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="lab-notebook-"))
        atexit.register(shutil.rmtree, folder, True)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.py"
    path.write_text(extracted.source)
    return path


def python_of(source: str) -> str:
    """A cell's Python: a ``%%dist`` cell's body (its lines where they were); IPython's own syntax
    (``%magic``, ``x = %lab pull x``, ``!cmd``) made Python as IPython makes it, calls that are not taken."""
    from IPython.core.inputtransformer2 import TransformerManager

    lines = source.splitlines()
    if lines and lines[0].lstrip().startswith("%%"):
        if not lines[0].lstrip().startswith("%%dist"):
            return ""  # (another cell magic's body is not Python: %%bash, %%writefile ...)
        lines[0] = ""
    return str(TransformerManager().transform_cell("\n".join(lines)))  # type: ignore[no-untyped-call]


def _keep(kept: dict[str, str], order: list[str], name: str, text: str) -> None:
    if name in kept:
        order.remove(name)
    kept[name] = text
    order.append(name)


def _constant(node: ast.expr) -> bool:
    """Whether a value is computed without calling anything (literals, names, attributes, operators:
    ``N = 4``, ``OPS = {"SUM": dist.ReduceOp.SUM}``), so that taking it runs none of the notebook's code."""
    return not any(isinstance(part, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr))
                   for part in ast.walk(node))


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
