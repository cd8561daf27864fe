"""The kernels compile for the GPU (sm_90) without register spills: checked on CPU, no GPU needed.

The interpreter tests check what the kernels compute; this one checks that Triton's GPU compiler
accepts the same specialisations the wrappers launch (benchmarks/gpu/compile_check.py). It runs
in a subprocess without TRITON_INTERPRET, whatever the environment of the test run.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.heavy  # the Triton compiler, for sm_90 with no GPU

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_kernels_compile_for_sm90_without_spills(tmp_path):
    import triton.backends.nvidia  # noqa: F401  (the triton wheel ships it: never a skip)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    out = tmp_path / "compile.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.compile_check", "--dtype", "bf16", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    failed = [r for r in rows if not r["ok"]]
    assert not failed, failed
    assert {r["kernel"].split()[0] for r in rows} == {
        "store_kv", "decode_split", "decode_combine", "extend", "rms_norm", "rope", "silu_mul"
    }
    spills = [(r["kernel"], r["stack_bytes"]) for r in rows if r.get("stack_bytes", 0) > 0]
    assert not spills, spills
