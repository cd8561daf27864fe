"""The docs describe the project as it is, and everything they point at exists.

- no issue numbers outside docs/decisions.md (README, docs, app strings, lessons, code comments);
- no dated measurement rounds in README or docs: docs/decisions.md alone dates things, one date
  and commit per decision;
- docs/decisions.md stays a short log: at most 150 lines, every entry with its verdict, date,
  commit and source (a JSON under assets/bench/ that exists, or "no JSON"), and nothing else
  cites the notebook it replaced (git keeps that);
- every relative link in README.md and docs/*.md resolves (the file, and a heading for an
  anchor into a markdown file);
- every `python -m X` README gives answers `--help`, and every `make X` it names is a target;
- README stays one page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DECISIONS = DOCS / "decisions.md"
BENCH = ROOT / "assets" / "bench"
DECISIONS_MAX_LINES = 150

# where the project describes itself; docs/decisions.md keeps the record and is exempt
PROSE_ROOTS = ("app", "engine", "classroom", "lessons", "benchmarks", "kernels")
PROSE_SUFFIXES = {".py", ".md", ".cpp", ".h", ".json", ".txt", ".html", ".js", ".css", ".toml"}

# "issue 19", "Issue #43", "issues 17-18", "PR #12", "议题 19", and a bare "#43" in prose. A bare
# number needs exactly two digits, so CSS colours (#fff, #1f77b4, #333333) never match, nor do
# anchors (#the-class-server) or C's #define
ISSUE_PATTERNS = (
    re.compile(r"\b(?:issues?|pr|pull request)\s*#?\s*\d+", re.IGNORECASE),
    re.compile(r"议题\s*#?\s*\d+"),
    re.compile(r"(?<![\w#&/])#\d{2}(?![\w-])"),
)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def _prose_files() -> list[Path]:
    files = [README, *sorted(p for p in DOCS.rglob("*") if p.is_file() and p != DECISIONS)]
    for root in PROSE_ROOTS:
        files += sorted(p for p in (ROOT / root).rglob("*")
                        if p.is_file() and p.suffix in PROSE_SUFFIXES
                        and "__pycache__" not in p.parts)
    return files


def _issue_references(text: str) -> list[tuple[int, str]]:
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        spans = sorted((m.start(), m.end(), m.group(0))
                       for pattern in ISSUE_PATTERNS for m in pattern.finditer(line))
        end = -1
        for s, e, match in spans:  # one reference once ("issue #43" is not also "#43")
            if s >= end:
                hits.append((n, match))
                end = e
    return hits


@pytest.mark.parametrize("text, found", [
    ("the speedups of issue 19 are blocked", ["issue 19"]),
    ("see Issue #43 and issues 17", ["Issue #43", "issues 17"]),
    ("（议题 19 的目标）", ["议题 19"]),
    ("the kernels are batch-invariant (#20), so", ["#20"]),
    ("color: #1f77b4; background: #fff; border: #333333", []),
    ("[link](performance.md#the-class-server) #define N 16 ## Heading", []),
    ("the issue's goals hold in 12 runs", []),
])
def test_the_issue_pattern_finds_references_and_spares_colours(text, found):
    assert [m for _, m in _issue_references(text)] == found


def test_no_issue_numbers_outside_the_decisions_log():
    hits = []
    for path in _prose_files():
        for n, match in _issue_references(path.read_text(encoding="utf-8", errors="replace")):
            hits.append(f"{path.relative_to(ROOT)}:{n}: {match!r}")
    assert not hits, ("issue numbers belong in docs/decisions.md only; say what is true instead:\n"
                      + "\n".join(hits))


def _dated_lines(paths: list[Path]) -> list[tuple[Path, int, str]]:
    return [(path, n, m.group(0))
            for path in paths
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            for m in DATE.finditer(line)]


def test_readme_and_docs_have_no_dated_rounds():
    docs = [README, *sorted(p for p in DOCS.rglob("*.md") if p != DECISIONS)]
    hits = [f"{p.relative_to(ROOT)}:{n}: {d}" for p, n, d in _dated_lines(docs)]
    assert not hits, ("dated measurements belong in docs/decisions.md, one date and commit per "
                      "decision:\n" + "\n".join(hits))


def test_the_date_check_finds_a_dated_round(tmp_path):
    doc = tmp_path / "performance.md"
    doc.write_text("Batch 1, 2026-12-04: 1.10x.\n\nNo date in 2026-12 or 12-04.\n", encoding="utf-8")
    assert [(n, d) for _, n, d in _dated_lines([doc])] == [(1, "2026-12-04")]


def _decision_entries() -> list[tuple[str, str]]:
    """(title, body) of each `###` entry of docs/decisions.md."""
    parts = re.split(r"^### (.+)$", DECISIONS.read_text(encoding="utf-8"), flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_the_decisions_log_stays_short():
    n = len(DECISIONS.read_text(encoding="utf-8").splitlines())
    assert n <= DECISIONS_MAX_LINES, (f"docs/decisions.md has {n} lines; keep it to "
                                      f"{DECISIONS_MAX_LINES}: one short entry per decision")


def test_every_bench_json_the_decisions_name_exists():
    names = set(re.findall(r"[\w.-]+\.json\b", DECISIONS.read_text(encoding="utf-8")))
    assert len(names) >= 10, sorted(names)  # the check sees the names
    missing = sorted(n for n in names if not (BENCH / n).is_file())
    assert not missing, f"docs/decisions.md names JSON that assets/bench/ lacks: {missing}"


def test_every_decision_has_its_verdict_date_commit_and_source():
    entries = _decision_entries()
    assert len(entries) >= 10, [t for t, _ in entries]
    lacking = []
    for title, body in entries:
        needs = {"a verdict in bold first": body.lstrip().startswith("**"),
                 "a date": DATE.search(body),
                 "a commit": re.search(r"`[0-9a-f]{7,40}`", body),
                 "a JSON or 'no JSON'": re.search(r"\.json\b|no JSON", body)}
        lacking += [f"{title}: {need}" for need, ok in needs.items() if not ok]
    assert not lacking, "docs/decisions.md entries lacking:\n" + "\n".join(lacking)


def test_nothing_cites_the_removed_notebook():
    notebook = "docs/history"
    tests = sorted(p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve())
    hits = [f"{p.relative_to(ROOT)}:{n}"
            for p in [*_prose_files(), *tests]
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if notebook in line]
    assert not hits, f"{notebook}/ is gone (git keeps it); cite docs/decisions.md:\n" + "\n".join(hits)


# [text](target) and ![alt](target); a target ends at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"```.*?```|`[^`\n]*`", re.DOTALL)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = CODE_SPAN.sub("", path.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def _relative_links(path: Path) -> list[str]:
    text = CODE_SPAN.sub("", path.read_text(encoding="utf-8"))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("doc", [README, *sorted(DOCS.glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    broken = []
    links = _relative_links(doc)
    for target in links:
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT) if ROOT in dest.parents else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading #{anchor}")
    assert not broken, f"{doc.name}: broken links:\n" + "\n".join(broken)


def test_the_link_check_sees_links():
    links = _relative_links(README)
    assert "docs/performance.md" in links and "assets/screenshots/plan.png" in links, links


def test_readme_is_one_page():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 200, f"README.md has {n} lines; keep it to 200 and move the rest to docs/"


def test_readme_gives_the_two_commands_first():
    first_screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:30])
    assert "make app" in first_screen and "make test" in first_screen


def _readme_modules() -> list[str]:
    return sorted(set(re.findall(r"python -m ([A-Za-z_][\w.]*)", README.read_text("utf-8"))))


def _readme_make_targets() -> list[str]:
    return sorted(set(re.findall(r"\bmake ([a-z][\w-]*)", README.read_text("utf-8"))))


def test_readme_names_commands():
    assert {"engine.serve", "benchmarks.bench", "benchmarks.load"} <= set(_readme_modules())
    assert {"app", "test"} <= set(_readme_make_targets())


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str, str]]:
    """`python -m MODULE --help` of every module README names, started all at once (each child
    spends seconds importing torch: side by side they share the cores' idle time), as
    module -> (exit code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = {m: subprocess.Popen([sys.executable, "-m", m, "--help"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for m in _readme_modules()}
    out = {}
    for m, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        out[m] = (proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("module", _readme_modules())
def test_every_python_command_in_readme_answers_help(module, helps):
    code, stdout, stderr = helps[module]
    assert code == 0, f"python -m {module} --help: {code}\n{stderr[-2000:]}"
    assert "usage" in stdout.lower(), stdout[-1000:]


@pytest.mark.parametrize("target", _readme_make_targets())
def test_every_make_target_in_readme_exists(target):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    defined = set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", makefile, re.M))
    assert target in defined, f"README names `make {target}`; the Makefile has {sorted(defined)}"
