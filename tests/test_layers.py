"""The package's layers, read from the source with ``ast`` (nothing is imported, but for one test
that imports the host-only layers in a fresh interpreter).

ngramspec/ is six folders in five layers, lowest first: util, cost, draft, then hf and vllm side
by side, then app (each folder's ``__init__`` says what it owns and may import). A module may
import its own folder and the layers below it, never one above, never its side neighbour (hf
and vllm do not import each other), and never the top level (``ngramspec`` itself,
``ngramspec.models``): those are the public face, above every layer. Imports inside functions
count too. The import graph has no cycles. draft/ (and vllm/, which a vLLM worker loads) never
import torch or transformers, not even through a module they import. No module is longer than
MAX_LINES lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ngramspec"
LAYERS = {"util": 0, "cost": 1, "draft": 2, "hf": 3, "vllm": 3, "app": 4}
TOP_LEVEL = {"ngramspec", "ngramspec.__main__", "ngramspec.models"}  # above every layer
HOST_ONLY = {"draft": ("torch", "transformers"), "vllm": ("torch", "transformers")}
MAX_LINES = 400


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package (a folder's ``__init__`` named
    after the folder)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = ("ngramspec", *path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in ``path``: ngramspec's own
    modules resolved to the module (``from .x import y`` names module ``x.y`` where that is a
    module, else ``x``), other imports by their top-level package."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = {id(node) for node in tree.body}
    top |= {id(n) for node in tree.body if isinstance(node, (ast.If, ast.Try)) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target != "ngramspec" and not target.startswith("ngramspec."):
                target = target.split(".")[0]
            found.append((target, node.lineno, id(node) in top))
    return found


def layer(name: str) -> str | None:
    """The folder (layer) of a module; None at the top level."""
    if name in TOP_LEVEL:
        return None
    return name.split(".")[1]


def graph(package: Path = PACKAGE) -> tuple[dict[str, Path], dict[str, list[tuple[str, int, bool]]]]:
    known = modules(package)
    return known, {name: imports(name, path, known) for name, path in known.items()}


def layering_problems(package: Path = PACKAGE) -> list[str]:
    """Every breach of the rules in the module docstring, one line each."""
    known, edges = graph(package)
    problems = []
    folders = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    for folder in sorted(folders ^ set(LAYERS)):
        problems.append(f"ngramspec/{folder}/: " + ("a folder no layer names" if folder in folders else "missing"))
    for folder in sorted(folders & set(LAYERS)):
        doc = ast.get_docstring(ast.parse((package / folder / "__init__.py").read_text())) or ""
        if "May import" not in doc:
            problems.append(f"ngramspec/{folder}/__init__.py: its docstring must say what it owns and may import")
    for name in known:
        if layer(name) is not None and name.count(".") == 1 and name not in {f"ngramspec.{f}" for f in folders}:
            problems.append(f"{name}: a module outside the layer folders")
    for name, found in edges.items():
        here = layer(name)
        for target, line, _ in found:
            if not target.startswith("ngramspec") or here is None:
                continue
            if target not in known:
                problems.append(f"{known[name]}:{line}: imports {target}, which does not exist")
                continue
            there = layer(target)
            if there is None or there not in LAYERS or here not in LAYERS:
                problems.append(f"{known[name]}:{line}: {here}/ imports the top level ({target})")
            elif LAYERS[there] > LAYERS[here] or (LAYERS[there] == LAYERS[here] and there != here):
                problems.append(f"{known[name]}:{line}: {here}/ imports {there}/ ({target}), a layer "
                                f"{'above' if LAYERS[there] > LAYERS[here] else 'beside'} it")
    for name in known:  # host-only folders: no torch or transformers, themselves or through a module they load
        banned = HOST_ONLY.get(layer(name) or "")
        if not banned:
            continue
        for target, line, _ in edges[name]:
            if target in banned:
                problems.append(f"{known[name]}:{line}: {layer(name)}/ imports {target}")
        seen, todo = {name}, [name]
        while todo:
            for target, _, at_top in edges[todo.pop()]:
                if at_top and target in known and target not in seen:
                    seen.add(target)
                    todo.append(target)
        for other in sorted(seen - {name}):
            for target, line, at_top in edges[other]:
                if at_top and target in banned:
                    problems.append(f"{known[name]}: loads {other}, which imports {target} ({known[other]}:{line})")
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(edges, known)]
    for path in known.values():
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            problems.append(f"{path}: {lines} lines, over {MAX_LINES}")
    return problems


def cycles(edges: dict, known: dict) -> list[list[str]]:
    """One cycle per strongly connected group of ngramspec modules that import one another."""
    out, state = [], {}

    def visit(name: str, stack: list[str]) -> None:
        state[name] = "open"
        stack.append(name)
        for target, _, _ in edges[name]:
            if target not in known or target == name:
                continue
            if state.get(target) == "open":
                out.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[name] = "done"

    for name in sorted(known):
        if name not in state:
            visit(name, [])
    return out


def test_the_package_keeps_its_layers():
    problems = layering_problems()
    assert not problems, "\n".join(problems)


def test_the_check_reads_the_imports_it_must(tmp_path):
    """The checker itself, on a copy of the package with one breach planted per kind."""
    import shutil

    plants = {
        "draft/index.py": "from ..hf import decode\n",  # a lower layer imports a higher one
        "hf/target.py": "from ..vllm import rows\n",  # side neighbours
        "draft/history.py": "def later():\n    import torch\n",  # torch in draft/, even inside a function
        "cost/fit.py": "import transformers\n",  # ... or through a module draft/ loads
        "util/extras.py": "from . import files\n",
        "util/files.py": "from . import extras\n",  # a cycle
        "app/jobs.py": "from .. import models\n",  # the top level
    }
    copy = tmp_path / "ngramspec"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for file, line in plants.items():
        (copy / file).write_text((copy / file).read_text() + "\n" + line)
    (copy / "vllm" / "__init__.py").write_text("from .proposer import Proposer\n")  # no docstring
    (copy / "app" / "cli.py").write_text((copy / "app" / "cli.py").read_text() + "\n#\n" * 60)  # too long
    (copy / "loose.py").write_text("")  # outside the folders
    problems = "\n".join(layering_problems(copy))
    for expected in ("draft/ imports hf/", "hf/ imports vllm/", "a layer beside it", "draft/ imports torch",
                     "which imports transformers", "import cycle: ngramspec.util.", "app/ imports the top level",
                     "vllm/__init__.py: its docstring", "lines, over 400", "ngramspec.loose: a module outside"):
        assert expected in problems, f"{expected!r} not reported:\n{problems}"


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_each_folder_says_what_it_owns(folder):
    doc = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
    assert doc and doc.startswith("Layer ") and "Owns" in doc and "May import" in doc


def test_the_drafter_loads_without_torch():
    """The static check above cannot see the run time: a package ``__init__`` that imports hf/
    eagerly loads torch and transformers with ``import ngramspec.draft``. A fresh interpreter
    imports ``ngramspec.draft``, then every module of the host-only folders, and neither torch
    nor transformers may be in ``sys.modules`` after either."""
    script = (
        "import importlib, pkgutil, sys\n"
        f"sys.path.insert(0, {str(PACKAGE.parent)!r})\n"
        "heavy = ('torch', 'transformers')\n"
        "import ngramspec.draft\n"
        "assert ngramspec.__file__.startswith(sys.path[0]), ngramspec.__file__\n"
        "print('draft', [m for m in heavy if m in sys.modules])\n"
        f"for folder in {sorted(HOST_ONLY)!r}:\n"
        "    for found in pkgutil.iter_modules([ngramspec.__path__[0] + '/' + folder]):\n"
        "        importlib.import_module(f'ngramspec.{folder}.{found.name}')\n"
        "print('all', [m for m in heavy if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["draft []", "all []"], done.stdout
