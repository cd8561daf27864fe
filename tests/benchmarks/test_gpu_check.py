"""benchmarks/gpu/check.py: its CPU dry run end to end, its JSON, and its refusal without CUDA.

The dry run is the GPU script itself on tiny shapes (Triton interpreter, a tiny random Llama), so
a GPU session runs code that has already run every section once. It runs in a subprocess: the
script sets TRITON_INTERPRET=1 for itself, never for this test process.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from benchmarks.gpu.check import SECTIONS, Check, Sizes

pytestmark = pytest.mark.heavy  # runs the GPU check script in a child process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _env():
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


@pytest.mark.slow
def test_dry_run_runs_every_section_in_order(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.check", "--dry-run", "--out", str(out)],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
    )
    report = json.loads((out / "gpu_check.json").read_text())
    tail = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, tail
    assert report["dry_run"] is True and report["done"] == list(SECTIONS), tail
    for name in SECTIONS:
        assert report[name]["ok"] is True, (name, report[name])
        assert report[name]["section_s"] >= 0
    kernels = report["kernels"]["checks"]
    cases = {r["case"] for r in kernels}
    assert any("bs12" in c for c in cases) and any("pool" in c for c in cases)
    assert {r["dtype"] for r in kernels} == {"bfloat16", "float32"}
    assert any("hd80" in c for c in cases)
    assert report["engine_vs_hf"]["fp32_equal"] is True
    assert set(report["consistency"]["variants"]) == {"chunked_prefill", "ngram_spec"}
    rows = report["engine_vs_naive"]["rows"]
    assert [r["concurrency"] for r in rows] == list(Sizes.dry("x").concurrency)
    for r in rows:
        eng = r["engine"]
        assert eng["output_tokens"] > 0 and r["naive"]["output_tokens"] > 0
        # only requests that ran count as running: never more than the seats
        assert 0 < eng["mean_running"] <= r["concurrency"]
        assert eng["num_kv_blocks"] == r["concurrency"] * 32
        assert not eng["parts_missing"], eng["parts_missing"]
        assert eng["step_parts_ms"]["forward"] > 0
        assert 0 <= eng["graph_steps"] <= eng["steps"] and eng["graph_capture_s"] >= 0
        # steps split by kind: the means weigh back to the whole mean, the max bounds them
        kinds = [(eng["step_ms_graph"], eng["graph_steps"]),
                 (eng["step_ms_eager"], eng["steps"] - eng["graph_steps"])]
        total = sum(ms * n for ms, n in kinds if n)
        assert total == pytest.approx(eng["step_ms"] * eng["steps"], rel=0.01, abs=0.01)
        assert all(ms is None for ms, n in kinds if not n)
        assert eng["step_ms_max"] >= max(ms for ms, n in kinds if n)
        # interpreted kernels compile nothing; the engine warms its kernels only on a GPU
        assert eng["triton_compiles"] in ({}, None) and eng["kernel_warmup_s"] == 0
        assert 0 <= eng["step_max_at"][0] < eng["steps"]
        assert eng["step_max_at"][1] in ("graph", "eager")
        assert set(eng["gc_pauses"]) <= {"gen0", "gen1", "gen2"}
    assert [w["seats"] for w in report["engine_vs_naive"]["warm_runs"]] == [1, 2]
    graphs = report["cuda_graphs"]
    assert graphs["forward"][0]["eager_ms"] > 0
    # the engine's own switch, on (the CPU replay stand-in here) and off: the same tokens
    assert graphs["engine_flag"] == "cuda_graphs" and graphs["tokens_equal"] is True, graphs
    assert graphs["engine"] and all(r["graph_replays"] for r in graphs["engine"]), graphs
    overlap = report["async_scheduling"]
    assert overlap["tokens_equal"] is True, overlap
    assert overlap["engine"] and all(r["overlapped_steps"] for r in overlap["engine"]), overlap
    # EAGLE (a random head for the tiny model, drafting k always): lossless, and both
    # workloads timed with and without it on the same answers
    spec = report["eagle"]
    assert spec["tokens_equal"] == {"eagle": True, "eagle+lookup": True}, spec
    assert set(spec["workloads"]) == {"open", "grounded"} and set(spec["goal_met"]) == {
        "open", "grounded"}
    for row in spec["workloads"].values():
        assert set(row) == {"off", "eagle", "eagle+lookup"}
        assert len({r["output_tokens"] for r in row.values()}) == 1 and row["off"]["output_tokens"]
        assert row["eagle"]["acceptance_rate"] is not None and row["eagle"]["speedup"] > 0
    assert "TRITON_INTERPRET" not in os.environ


@pytest.mark.slow
def test_only_reruns_the_named_sections_after_env_and_setup(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.check", "--dry-run", "--out", str(out),
         "--only", "decode_bandwidth"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["sections"] == report["done"] == ["env", "setup", "decode_bandwidth"]
    assert report["decode_bandwidth"]["ok"] is True and "kernels" not in report
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.check", "--dry-run", "--out", str(out),
         "--only", "decode_bandwidth,kernelz"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2 and "kernelz" in bad.stderr and "Traceback" not in bad.stderr


def test_each_section_is_saved_as_it_ends_and_errors_are_recorded(tmp_path):
    c = Check(str(tmp_path), dry=True, budget_s=60, sizes=Sizes.dry("x"), args={})
    c.section("env", lambda: {"ok": True, "x": 1})
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["done"] == ["env"] and saved["env"]["x"] == 1

    def broken():
        raise RuntimeError("planted")

    c.section("setup", broken)
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["setup"]["ok"] is False and "planted" in saved["setup"]["error"]
    c.section("copy_bandwidth", lambda: {"ok": True}, min_left_s=1e9)
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved["copy_bandwidth"]["ok"] is None and "skipped" in saved["copy_bandwidth"]


def test_model_parts_join_back_and_a_bad_part_is_refused(tmp_path):
    from benchmarks.gpu import check as gpu_check

    src = tmp_path / "src"
    src.mkdir()
    blob = os.urandom(3000)
    (src / gpu_check.GGUF_NAME).write_bytes(blob)
    parts = tmp_path / "parts"
    parts.mkdir()
    import hashlib

    for i in range(3):
        (parts / f"{gpu_check.GGUF_NAME}.part{i}").write_bytes(blob[i * 1000:(i + 1) * 1000])
    (parts / "SHA256").write_text(hashlib.sha256(blob).hexdigest())
    saved_path, saved_pp = list(sys.path), os.environ.get("PYTHONPATH")
    try:
        info = gpu_check.join_model(str(parts), str(tmp_path / "site"))
        assert info["bytes"] == 3000
        joined = tmp_path / "site" / gpu_check.GGUF_PACKAGE / gpu_check.GGUF_NAME
        assert joined.read_bytes() == blob
        (parts / f"{gpu_check.GGUF_NAME}.part1").write_bytes(b"x" * 1000)
        with pytest.raises(ValueError, match="sha256"):
            gpu_check.join_model(str(parts), str(tmp_path / "site2"))
    finally:
        sys.path[:] = saved_path
        if saved_pp is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_pp


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: it would run")
def test_without_cuda_it_exits_cleanly(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.check", "--out", str(tmp_path / "out")],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "needs a CUDA GPU" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_eagle_section_without_a_head_is_skipped_not_failed():
    """On a GPU machine the trained head must be carried in: without it the section says how
    to get one and is skipped (ok None), so the rest of the check still counts."""
    from types import SimpleNamespace

    from benchmarks.gpu import engine_check as eng

    c = SimpleNamespace(dry=False, sizes=Sizes())
    res = eng.eagle_speculation(c, head="/nonexistent/eagle.safetensors")
    assert res["ok"] is None and "train_draft" in res["skipped"], res
