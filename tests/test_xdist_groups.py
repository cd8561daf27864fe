"""make test's two workers keep each xdist group on one worker (tests/conftest.py).

The groups are what let a module's fixtures (an engine, a server) start once and the Triton
interpreter's modules share one child process. A pytest or pytest-xdist upgrade can stop the
scheduler from seeing them without a word (every test then goes to whichever worker is free),
so a small run under `-n 2 --dist loadgroup` with this suite's hook says where each test ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # a child pytest with two xdist workers

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"

MODULE = '''
import json, os
import pytest

def _record(name):
    with open(os.environ["WHERE"], "a") as f:
        f.write(json.dumps([name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")

@pytest.mark.parametrize("i", range(4))
@pytest.mark.parametrize("g", [pytest.param(g, marks=pytest.mark.xdist_group(f"own-{g}"))
                               for g in "ab"])
def test_marked(g, i):
    _record(f"own-{g}")

@pytest.mark.parametrize("i", range(4))
def test_module_group(i):
    _record("module")
'''


def test_each_group_runs_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_groups.py").write_text(MODULE)
    (tmp_path / "test_other.py").write_text(MODULE.replace('"module"', '"other"'))
    where = tmp_path / "where.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(WHERE=str(where), PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "--no-loadscope-reorder", "-c", os.devnull,
         "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = [json.loads(line) for line in where.read_text().splitlines()]
    workers: dict[str, set[str]] = {}
    for group, worker in ran:
        workers.setdefault(group, set()).add(worker)
    # a group per explicit mark per module (8 tests each side), one per unmarked module test set
    assert len(ran) == 24 and set(workers) == {"own-a", "own-b", "module", "other"}, workers
    split = {g: sorted(w) for g, w in workers.items() if len(w) > 1}
    assert not split, f"groups split over workers: {split}"
    # both workers were used, so the check had a chance to see a split
    assert set().union(*workers.values()) == {"gw0", "gw1"}, workers
