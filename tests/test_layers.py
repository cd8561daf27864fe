"""The layers: the engine is the bottom. Nothing under engine/ imports the classroom, the
benchmarks, the app or streamlit; they import the engine, never the other way round. The
classroom sits on the engine and under the app: it imports none of the app, the benchmarks or
streamlit. Read from the source with `ast`, so a lazy import inside a function counts, and so
does `importlib.import_module("...")` with a literal name. Fast: no module is imported."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# top-level packages the engine must never import
FORBIDDEN = ("benchmarks", "app", "streamlit", "classroom")
# and the classroom
CLASSROOM_FORBIDDEN = ("benchmarks", "app", "streamlit")


def imported_modules(source: str) -> set[str]:
    """Every absolute module name `source` imports, at any depth. Relative imports stay inside
    their own package and are left out."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("__import__", "import_module")))):
            names.add(node.args[0].value)
    return names


def forbidden_imports(source: str, forbidden=FORBIDDEN) -> set[str]:
    """The imports in `source` of a forbidden package or any module inside it."""
    return {n for n in imported_modules(source) if n.split(".")[0] in forbidden}


def test_the_engine_imports_no_benchmarks_app_or_streamlit():
    files = sorted((ROOT / "engine").rglob("*.py"))
    assert len(files) > 20, "the engine's modules are found"
    bad = {str(p.relative_to(ROOT)): sorted(found) for p in files
           if (found := forbidden_imports(p.read_text(encoding="utf-8")))}
    assert not bad, f"engine/ must not import {FORBIDDEN}: {bad}"


def test_the_classroom_imports_the_engine_not_the_app():
    files = sorted((ROOT / "classroom").rglob("*.py"))
    assert len(files) > 5, "the classroom's modules are found"
    bad = {str(p.relative_to(ROOT)): sorted(found) for p in files
           if (found := forbidden_imports(p.read_text(encoding="utf-8"), CLASSROOM_FORBIDDEN))}
    assert not bad, f"classroom/ must not import {CLASSROOM_FORBIDDEN}: {bad}"


def test_the_layer_check_can_fail():
    source = '''
import os, app.i18n
from benchmarks.common import RESULT_KEYS
def lazy():
    import streamlit as st
    from benchmarks import load
    importlib.import_module("benchmarks.bench")
    __import__("app")
from . import plan
from apprentice import x
import engine.appliance
'''
    assert forbidden_imports(source) == {"app.i18n", "benchmarks.common", "streamlit",
                                         "benchmarks", "benchmarks.bench", "app"}
    assert forbidden_imports("import os\nfrom engine.plan import ExecutionPlan\n") == set()
