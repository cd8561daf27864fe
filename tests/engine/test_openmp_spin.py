"""The OpenMP wait policy an engine process runs with (engine/threads.py), and that importing
`engine` sets none.

libgomp prints what it read from the environment when OMP_DISPLAY_ENV=VERBOSE, so these
tests ask torch's own OpenMP, in a fresh process, rather than trusting our variables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine.threads import SPINCOUNT, server_env

ROOT = Path(__file__).resolve().parents[2]
SHOW = ("import os; from engine.threads import spin_briefly; spin_briefly(); import engine, torch; "
        "print('left:', os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
# a process that only imports the engine, against one that only imports torch
IMPORT_ONLY = ("import os, json, sys; before = dict(os.environ); import engine; "
               "from engine import LLMEngine, EngineConfig; import engine.plan, engine.serve; "
               "import torch; print('state:', json.dumps([dict(os.environ) == before, "
               "torch.get_num_threads(), torch.get_num_interop_threads()]))")
TORCH_ONLY = ("import os, json; before = dict(os.environ); import torch; "
              "print('state:', json.dumps([dict(os.environ) == before, "
              "torch.get_num_threads(), torch.get_num_interop_threads()]))")


def _openmp_read(code: str = SHOW, **env: str) -> tuple[dict[str, str], str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TRITON_INTERPRET")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**base, "OMP_DISPLAY_ENV": "VERBOSE",
                                                       **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    read = {}
    for line in proc.stderr.splitlines():
        name, eq, value = line.strip().partition(" = ")
        if eq and name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
            read[name] = value.strip("'")
    left = next(line for line in proc.stdout.splitlines()
                if line.startswith(("left:", "state:")))
    return read, left


def test_importing_the_engine_changes_nothing_process_wide():
    """The environment, OpenMP's wait policy as libgomp read it, and torch's thread counts are
    those of a process that imported torch alone."""
    engine_read, engine_state = _openmp_read(IMPORT_ONLY)
    torch_read, torch_state = _openmp_read(TORCH_ONLY)
    assert engine_read == torch_read and engine_read  # libgomp printed its settings
    assert engine_state == torch_state
    assert engine_state.startswith("state: [true,")


def test_an_entry_point_spins_briefly_and_leaves_no_variable_to_its_children():
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
