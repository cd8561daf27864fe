"""The layers, read from the source with `ast` (fast: no module is imported).

Every package of the project, bottom up:

  lessons           the course as data, and figures.py (the reader that fills a text's
                    figures): nothing of the project
  servelab_kernels  the Triton kernels (the folder kernels/, imported under this name, see
                    servelab_kernels/__init__.py): torch, triton, the standard library and
                    each other, nothing of the project
  engine            the inference engine; it imports the kernels (lazily: triton is optional)
                    and never benchmarks, app, classroom or streamlit
  classroom         the class on the engine's server (routes, votes, the teacher's client):
                    the engine, never the app or streamlit (its client starts the simulated
                    users as a child `python -m benchmarks.load`)
  benchmarks        what measures the engine, the GPU check (benchmarks/gpu/) included
  app               the Streamlit app: the engine, and a few benchmarks modules (workloads,
                    the naive baseline); the GPU check's recording (benchmarks/gpu/recording.py)
                    calls the app's recorder back, inside a function

Two rules, over every .py file of every package:

1. No import runs the wrong way (`FORBIDDEN`): the kernels import nothing of the project, the
   engine none of benchmarks, app, classroom or streamlit, the classroom none of the app or
   streamlit. Every import counts, at any depth:
   a lazy import inside a function, `importlib.import_module` or `__import__` with a literal
   name, and a string literal that names a project module exactly (a registry entry such as
   the attention backends' "package.module", which `get_backend` imports when asked).
2. No circles among the project's modules (`circles` over `import_graph`). Function-level
   imports count here too, by choice: they are how the engine reaches the optional kernels,
   the circle between engine/model/llama.py and kernels/fused_ops.py closed through two of
   them, and no legitimate circle needs one. Registry strings do not count here: a registry
   names the modules that implement its interface, and those import the interface
   (engine/model/cpu/attention.py imports engine.model.attention), which is no circle while
   the registry imports them only when asked; across packages, rule 1 still sees the string
   (the circle through the attention registry and kernels/backend.py was caught that way).
   Importing `a.b.c` also runs the packages `a` and `a.b` (their `__init__.py`), so the graph
   has those edges too, unless the importer is inside that package (already running).

Module names are the import names: `kernels/store_kv.py` is `servelab_kernels.store_kv`, and
`app/pages/home.py` is `app.pages.home` (a namespace package; Streamlit runs the pages).
"""

from __future__ import annotations

import ast
from functools import cache, lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (folder, import name) of every package
PACKAGES = (("lessons", "lessons"), ("kernels", "servelab_kernels"),
            ("servelab_kernels", "servelab_kernels"),
            ("engine", "engine"), ("benchmarks", "benchmarks"), ("app", "app"),
            ("classroom", "classroom"))

# package -> the top-level names it must never import (rule 1). `kernels` inside the kernels
# would be PyPI's package, not a sibling: siblings are `servelab_kernels.<name>`
FORBIDDEN = {
    "lessons": ("servelab_kernels", "engine", "benchmarks", "app", "classroom", "streamlit"),
    "servelab_kernels": ("engine", "benchmarks", "app", "classroom", "streamlit", "kernels"),
    "engine": ("benchmarks", "app", "classroom", "streamlit"),
    "classroom": ("app", "streamlit"),
}


def module_name(path: Path, root: Path = ROOT) -> str | None:
    """The import name of a project file, or None outside the packages."""
    rel = path.relative_to(root)
    for folder, name in PACKAGES:
        if rel.parts[0] == folder:
            stem = [] if rel.stem == "__init__" else [rel.stem]
            return ".".join([name, *rel.parts[1:-1], *stem])
    return None


@lru_cache(maxsize=4)
def project_files(root: Path = ROOT) -> dict[str, Path]:
    """module name -> file, for every .py file of every package."""
    return {module_name(p, root): p for folder, _ in PACKAGES
            for p in sorted((root / folder).rglob("*.py")) if "__pycache__" not in p.parts}


def _absolute(module: str | None, level: int, here: str, is_package: bool) -> str:
    """The absolute name of `from <level dots><module> import ...` written in module `here`."""
    if level == 0:
        return module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])


def imports(source: str, here: str = "", is_package: bool = False,
            known: frozenset[str] = frozenset(), strings: bool = True) -> set[str]:
    """Every absolute module name `source` imports, at any depth (relative imports resolved
    from module `here`). `from a import b` gives `a.b` when that is a module in `known`, else
    `a`. With `strings`, a string literal equal to a name in `known` counts too."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, here, is_package)
            names.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                         for a in node.names)
        elif isinstance(node, ast.Call) and node.args:
            arg, f = node.args[0], node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if (called in ("import_module", "__import__") and isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)):
                names.add(arg.value)
        elif (strings and isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value in known):
            names.add(node.value)
    return names


@cache
def _imports_of(name: str, root: Path, strings: bool) -> set[str]:
    path = project_files(root)[name]
    return imports(path.read_text(encoding="utf-8"), name, path.stem == "__init__",
                   frozenset(project_files(root)), strings)


def with_packages(name: str, found: set[str], known: frozenset[str]) -> set[str]:
    """The project modules that importing `found` from module `name` runs: each one and the
    packages above it, less the packages `name` is inside (already running) and itself."""
    parts = name.split(".")
    inside = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    out: set[str] = set()
    for n in found:
        bits = n.split(".")
        out.update(p for p in (".".join(bits[:i]) for i in range(1, len(bits) + 1))
                   if p in known and p not in inside)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules its imports run (rule 2: no registry strings)."""
    known = frozenset(project_files(root))
    return {name: with_packages(name, _imports_of(name, root, strings=False), known)
            for name in known}


def runs_up(root: Path = ROOT) -> dict[str, list[str]]:
    """file -> the names it imports that its package must not (rule 1)."""
    bad: dict[str, list[str]] = {}
    for name, path in project_files(root).items():
        banned = FORBIDDEN.get(name.split(".")[0], ())
        found = _imports_of(name, root, strings=True)
        if hits := sorted(n for n in found if n.split(".")[0] in banned):
            bad[str(path.relative_to(root))] = hits
    return bad


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle of each strongly connected set of two or more modules (Tarjan's algorithm
    finds the sets), as the path [a, b, ..., a]: the shortest from the set's first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sets: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = set()
            while v not in scc:
                w = stack.pop()
                on_stack.discard(w)
                scc.add(w)
            if len(scc) > 1:
                sets.append(scc)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for scc in sets:  # breadth first from the first module back to it, inside the set
        start = min(scc)
        paths = {start: [start]}
        frontier = [start]
        while frontier and start not in graph.get(frontier[0], ()):
            v = frontier.pop(0)
            for w in sorted(graph[v] & scc):
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    frontier.append(w)
        found.append([*paths[frontier[0]], start])
    return sorted(found)


def test_every_package_is_read():
    graph = import_graph()
    assert {n.split(".")[0] for n in graph} >= {"servelab_kernels", "engine", "benchmarks",
                                                "app"}
    assert len(graph) > 120, "the project's modules are found"
    # through the alias, relative imports and the parents a submodule's import runs
    assert "servelab_kernels.store_kv" in graph["servelab_kernels.warmup"]
    assert "engine.model.attention.torch_backend" in graph["engine.model.attention"]
    assert "engine.model.attention" in graph["engine.model.cpu.attention"]


def test_no_import_runs_the_wrong_way():
    bad = runs_up()
    assert not bad, "imports that run the wrong way (FORBIDDEN: " + ", ".join(
        f"{k} must not import {'/'.join(v)}" for k, v in FORBIDDEN.items()) + "):\n" + "\n".join(
        f"  {path}: {', '.join(names)}" for path, names in bad.items())


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles (function-level imports count):\n" + "\n".join(
        "  " + " -> ".join(c) for c in found)


def test_the_checks_can_fail():
    source = '''
import os, app.i18n
from benchmarks.common import RESULT_KEYS
def lazy():
    import streamlit as st
    from benchmarks import load
    importlib.import_module("benchmarks.bench")
    __import__("app")
from . import plan
from .attention import base
from apprentice import x
import engine.appliance
BACKENDS = {"triton": ("servelab_kernels.backend", "X"), "doc": "engine.model.plan is here"}
'''
    known = frozenset({"engine", "engine.model", "engine.model.plan", "engine.model.attention",
                       "engine.model.attention.base", "servelab_kernels",
                       "servelab_kernels.backend"})
    found = imports(source, "engine.model.llama", known=known)
    assert found == {"os", "app.i18n", "benchmarks.common", "streamlit", "benchmarks",
                     "benchmarks.bench", "app", "engine.model.plan",
                     "engine.model.attention.base", "apprentice", "engine.appliance",
                     "servelab_kernels.backend"}
    assert "servelab_kernels.backend" not in imports(source, "engine.model.llama", known=known,
                                                     strings=False)
    # importing a module runs the packages above it, except those the importer is inside
    assert with_packages("engine.model.llama", found, known) == {
        "engine.model.plan", "engine.model.attention", "engine.model.attention.base",
        "servelab_kernels", "servelab_kernels.backend"}
    assert with_packages("servelab_kernels.backend", {"engine.model.attention.base"}, known) == {
        "engine", "engine.model", "engine.model.attention", "engine.model.attention.base"}
    graph = {"a": {"b", "d"}, "b": {"c"}, "c": {"a"}, "d": {"c"}, "e": {"a"}, "f": set()}
    assert circles(graph) == [["a", "b", "c", "a"]]
    assert circles({"x": {"y"}, "y": {"x"}, "a": {"b"}, "b": set()}) == [["x", "y", "x"]]
    assert circles({"a": {"b"}, "b": set()}) == []
