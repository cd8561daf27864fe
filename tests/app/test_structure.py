"""The app's structure: one page table that everything reads, and no import cycle in app/
(nor in engine/).

Fast (no model, no browser): the table against the files on disk, and the import graph of app/
read from the source with `ast` (imports inside functions count too: a lazy import only hides
a cycle).
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.i18n import STRINGS  # noqa: E402
from app.lessons import LANGS, LESSON_PAGES, LESSONS_DIR, PAGES  # noqa: E402
from app.pagelist import PAGE_TABLE, page_info, sections  # noqa: E402

APP = ROOT / "app"


def module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def package_imports(path: pathlib.Path, package: str) -> set[str]:
    """The `package`.* modules `path` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module == package or node.module.startswith(package + ".")):
            found.add(node.module)
            folder = ROOT.joinpath(*node.module.split("."))
            for alias in node.names:  # `from app import pagelist` imports a module
                if (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir():
                    found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(package + ".")}
    return found


def import_graph(package: str = "app") -> dict[str, set[str]]:
    """Module -> the modules of the package it imports. A package's `__init__` counts as the
    package itself; edges into a package's own `__init__` from inside it are left out (Python
    has that package half-imported already: re-exports, not a cycle)."""
    modules = {module_name(p).removesuffix(".__init__"): p
               for p in ROOT.joinpath(package).rglob("*.py")}
    return {m: {d for d in package_imports(p, package)
                if d in modules and d != m and not m.startswith(d + ".")}
            for m, p in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_app_has_no_import_cycle():
    graph = import_graph()
    assert "app.nav" in graph["app.live"], "the graph is read (live imports nav)"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_engine_has_no_import_cycle():
    graph = import_graph("engine")
    assert "engine.scheduler" in graph["engine.engine"], "the graph is read"
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_can_fail():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_page_file_is_a_row_of_the_table_and_back():
    files = {p.stem for p in (APP / "pages").glob("*.py")}
    assert files == set(PAGES), "app/pages/ and app/pagelist.py list the same pages"
    assert len(set(PAGES)) == len(PAGES)


@pytest.mark.parametrize("row", PAGE_TABLE, ids=lambda r: r.slug)
def test_each_row_has_its_title_section_icon_and_lesson(row):
    assert row.title_key in STRINGS, f"{row.slug}: no title string {row.title_key}"
    assert row.section in STRINGS, f"{row.slug}: no section string {row.section}"
    assert row.icon.startswith(":material/") and row.icon.endswith(":")
    for lang in LANGS:
        exists = (LESSONS_DIR / lang / f"{row.slug}.md").exists()
        assert exists == row.lesson, f"{lang}/{row.slug}.md exists: {exists}, table: {row.lesson}"
    assert (row.slug in LESSON_PAGES) == row.lesson


def test_sections_keep_table_order_and_unknown_pages_are_named():
    flat = [p.slug for rows in sections().values() for p in rows]
    assert flat == list(PAGES), "each section's pages are contiguous in the table"
    with pytest.raises(ValueError, match="unknown page 'nope'"):
        page_info("nope")
