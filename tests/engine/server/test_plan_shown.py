"""The execution plan is visible from outside: `/v1/servelab/config` carries it, and
`python -m engine.serve` prints it before it serves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import end_process, free_port

ROOT = Path(__file__).resolve().parents[3]


def test_the_config_endpoint_carries_the_plan(server, engine):
    url, _ = server
    cfg = httpx.get(f"{url}/v1/servelab/config", timeout=30).json()
    assert cfg["plan"] == engine.plan.as_dict()
    assert cfg["plan"]["describe"] == engine.plan.describe()
    assert cfg["max_num_seqs"] == engine.config.max_num_seqs  # the config's fields stay


def test_serve_prints_its_plan_at_start():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.serve", "--port", str(port), "--dtype", "float32",
         "--max-num-seqs", "2", "--max-model-len", "128"],
        cwd=ROOT, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    lines = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(lines) < 200:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("plan: "):
                break
    finally:
        end_process(proc)
    plan_lines = [ln for ln in lines if ln.startswith("plan: ")]
    assert plan_lines, "".join(lines)[-3000:]
    assert plan_lines[0].startswith("plan: cpu float32 ") and "attention " in plan_lines[0]
