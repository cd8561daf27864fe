"""The OpenMP wait policy an engine process runs with (engine/__init__.py: SPINCOUNT).

libgomp prints what it read from the environment when OMP_DISPLAY_ENV=VERBOSE, so these
tests ask torch's own OpenMP, in a fresh process, rather than trusting our variables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine import SPINCOUNT, server_env

ROOT = Path(__file__).resolve().parents[1]
SHOW = ("import os, engine; print('left:', os.environ.get('OMP_WAIT_POLICY'), "
        "os.environ.get('GOMP_SPINCOUNT'))")


def _openmp_read(**env: str) -> tuple[dict[str, str], str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TRITON_INTERPRET")}
    proc = subprocess.run([sys.executable, "-c", SHOW], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**base, "OMP_DISPLAY_ENV": "VERBOSE",
                                                       **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    read = {}
    for line in proc.stderr.splitlines():
        name, eq, value = line.strip().partition(" = ")
        if eq and name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
            read[name] = value.strip("'")
    left = next(line for line in proc.stdout.splitlines() if line.startswith("left:"))
    return read, left


def test_an_engine_process_spins_briefly_and_leaves_no_variable_to_its_children():
    read, left = _openmp_read()
    assert read == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": SPINCOUNT}
    assert left == "left: None None"


def test_an_explicit_policy_wins():
    read, left = _openmp_read(OMP_WAIT_POLICY="PASSIVE")
    assert read["OMP_WAIT_POLICY"] == "PASSIVE" and read["GOMP_SPINCOUNT"] == "0"
    assert left == "left: PASSIVE None"


def test_a_server_child_drops_the_parents_policy():
    env = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "30000000000", "PATH": "/bin"}
    assert server_env(env) == {"PATH": "/bin"}
