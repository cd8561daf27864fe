"""`python -m benchmarks.bench --quick` runs end to end and writes JSON that validates.

No timing is asserted: the numbers depend on the machine. The test checks the shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.bench import RESULT_KEYS

pytestmark = pytest.mark.slow


def test_quick_bench_writes_valid_json(tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data) >= {"machine", "roofline", "results"}
    # with no policy in the environment, the bench re-ran itself with spinning threads
    assert data["machine"]["omp_wait_policy"] == "ACTIVE"
    roof = data["roofline"]
    assert roof["weight_bytes"] > 100e6 and roof["read_bandwidth_gb_s"] > 0
    assert roof["decode_floor_tok_per_s"] > 0 and len(roof["decode_scaling"]) >= 2
    systems = {(r["system"], r["batching"], r["kv_layout"]) for r in data["results"]}
    assert ("naive", "static", "contiguous") in systems
    for b in ("static", "continuous"):
        for kv in ("contiguous", "paged"):
            assert ("engine", b, kv) in systems
    for r in data["results"]:
        for key in RESULT_KEYS:
            assert key in r, f"{key} missing from {r['system']}"
        for key in ("output_tokens", "wall_s", "output_tok_per_s", "ttft_p50_s", "ttft_p99_s",
                    "tpot_p50_s", "max_concurrency", "idle_seat_frac"):
            assert isinstance(r[key], (int, float)) and r[key] >= 0, (key, r[key])
        for key in ("kv_useful_frac", "prefix_hit_rate"):
            assert r[key] is None or 0 <= r[key] <= 1, (key, r[key])
    tokens = {r["output_tokens"] for r in data["results"]}
    assert len(tokens) == 1, f"every system must do identical work, got {tokens}"
    assert "engine (continuous + paged) / naive server" in proc.stdout


def test_bench_memory_runs(capsys):
    from benchmarks import bench_memory

    assert bench_memory.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("start:") and len(lines) == 1 + len(bench_memory.SWITCHES)


def test_kernel_bench_attention_runs(capsys):
    """`python -m benchmarks.kernel_bench`'s attention part, which needs no model: both backends
    run on the same pool and it prints a ratio per context (no timing is asserted)."""
    from benchmarks import kernel_bench
    from engine.model.cpu import library as cpu_library

    assert cpu_library.load()
    kernel_bench.bench_attention()
    out = capsys.readouterr().out
    assert out.count("C++ kernel") == 3 and out.count("x\n") == 3
