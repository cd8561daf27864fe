"""The benchmarks package: `python -m benchmarks.bench --quick` runs end to end and writes
JSON that validates, the other benches run, the shared helpers in `benchmarks/common.py` do
what they say, and the package's imports form no cycle.

No timing is asserted: the numbers depend on the machine. The tests check shapes, counts and
the figures that do not depend on speed (a model agrees with itself)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import RESULT_KEYS, best_interleaved, sequence_batch

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (lazy imports inside functions count)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_benchmarks_import_graph_has_no_cycle():
    modules = {f"benchmarks.{p.stem}": p for p in (ROOT / "benchmarks").glob("*.py")
               if p.stem != "__init__"}
    graph = {m: {n for n in _imports(p) if n in modules and n != m} for m, p in modules.items()}
    assert graph["benchmarks.common"] == set(), "common.py must import no other bench module"
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> None:
        assert m not in path, f"import cycle: {' -> '.join(path + [m])}"
        if m not in done:
            for n in graph[m]:
                visit(n, path + [m])
            done.add(m)

    for m in graph:
        visit(m, [])
    # the other direction (the engine never imports the benchmarks) is tests/test_layers.py's


def test_best_interleaved_takes_turns_and_keeps_every_way():
    calls = []
    best = best_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                            rounds=3, reps=2)
    assert calls == ["a", "a", "b", "b"] * 3, "the ways must alternate round by round"
    assert set(best) == {"a", "b"} and all(0 <= t < float("inf") for t in best.values())


def test_sequence_batch_places_one_sequence_from_block_zero():
    ids, pos, meta = sequence_batch(list(range(100, 120)), 13, block_size=8, device="cpu")
    assert ids.tolist() == list(range(113, 120)) and pos.tolist() == list(range(13, 20))
    assert meta.slot_mapping.tolist() == list(range(13, 20))
    assert meta.query_lens == [7] and meta.seq_lens_host == [20]
    assert meta.block_tables.tolist() == [[0, 1, 2]]


@pytest.mark.slow
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
    # the weights a step streams: 97 MB of GGUF blocks, 269 MB in bf16, 538 MB in fp32
    assert roof["weight_bytes"] > 90e6 and roof["read_bandwidth_gb_s"] > 0
    assert roof["decode_floor_tok_per_s"] > 0 and len(roof["decode_scaling"]) >= 2
    # batch 1's share of the floor, measured in pairs with the bandwidth probe
    paired = roof["decode_scaling"][0]["floor_share_paired"]
    assert len(paired["pairs"]) == 5 and 0 < paired["share"] < 2
    shares = sorted(p["share"] for p in paired["pairs"])
    assert paired["share"] == shares[2]  # the median pair
    for p in paired["pairs"]:
        floor = p["read_bandwidth_gb_s"] * 1e9 / roof["weight_bytes"]
        assert abs(p["share"] - p["decode_tok_per_s"] / floor) < 1e-9
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


@pytest.mark.slow
def test_bench_command_offers_its_modes():
    """`python -m benchmarks.bench`, the command README gives, offers the workloads and --spec."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}  # no re-exec needed to read --help
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench", "--help"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--workload" in proc.stdout and "--spec" in proc.stdout


@pytest.mark.slow
def test_spec_flags_reach_the_spec_bench(monkeypatch):
    """`python -m benchmarks.bench --spec --k 2` hands --k to the spec bench: the main bench's
    parser takes no abbreviations (it once read --k as its own --kv-budget, silently)."""
    from benchmarks import bench, spec_bench

    seen = []
    monkeypatch.setattr(spec_bench, "main", lambda argv: seen.append(argv) or 0)
    assert bench.main(["--spec", "--k", "2", "--min-confidence", "0.5"]) == 0
    assert seen and seen[0][:4] == ["--k", "2", "--min-confidence", "0.5"]


@pytest.mark.heavy  # a child process per memory measurement
def test_bench_memory_runs(capsys):
    from benchmarks import bench_memory

    assert bench_memory.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("start:") and len(lines) == 1 + len(bench_memory.SWITCHES)


@pytest.mark.slow
def test_kernel_bench_attention_runs(capsys):
    """`python -m benchmarks.kernel_bench`'s attention part, which needs no model: both backends
    run on the same pool and it prints a ratio per context and per prompt length (no timing is
    asserted)."""
    from benchmarks import kernel_bench
    from engine.model.cpu import library as cpu_library

    assert cpu_library.load()
    kernel_bench.bench_attention()
    out = capsys.readouterr().out
    assert out.count("C++ kernel") == 7 and out.count("x\n") == 7


def test_kernel_bench_long_decode_runs(capsys):
    """`kernel_bench --attention`'s long-context part on tiny sizes: the split and unsplit
    kernels run side by side, one row per (batch, context), and the JSON rows carry both times
    (no timing is asserted)."""
    from benchmarks import kernel_bench
    from engine.model.cpu import library as cpu_library

    assert cpu_library.load()
    rows = kernel_bench.bench_long_decode(contexts=(100, 300), batches=(1, 2), layers=2,
                                          rounds=1)
    assert [(r["batch"], r["context"]) for r in rows] == [(1, 100), (1, 300), (2, 100), (2, 300)]
    assert all(r["split_us"] > 0 and r["unsplit_us"] > 0 for r in rows)
    assert capsys.readouterr().out.count("one task per KV head") == 4


def test_kernel_bench_kv_cache_runs_both_caches(capsys):
    """`kernel_bench --kv-cache` on small cases: a float32 and a float16 engine in turns, one
    row per (running, context), both times in it (no timing is asserted)."""
    from benchmarks import kernel_bench

    rows = kernel_bench.bench_kv_cache(cases=((1, 20), (2, 40)), rounds=2, steps=3)
    assert [(r["running"], r["context"]) for r in rows] == [(1, 20), (2, 40)]
    assert all(r["ms_float32"] > 0 and r["ms_float16"] > 0 for r in rows)
    assert "KV cache float32 against float16" in capsys.readouterr().out


def test_kernel_bench_kv_quality_measures_both_caches_against_the_fp32_model(capsys):
    """`kernel_bench --kv-quality` on two probe prompts and two short answers: every position
    counted once, both caches' logits within the bound the q16 engine test holds (0.2% of
    their norm) and nearly always the fp32 model's next token, K and V far inside float16's
    range, and each answer either identical or parted at a token it names."""
    from benchmarks import kernel_bench
    from benchmarks.workloads import PROBE_PROMPTS

    out = kernel_bench.kv_cache_quality(prompts=PROBE_PROMPTS[:2], forced_tokens=6, answers=2,
                                        answer_tokens=8)
    assert out["positions"] > 12
    for kv in ("float32", "float16"):
        lo, hi = out[f"logits_rel_{kv}"]
        assert 0 < lo <= hi < 2e-3, (kv, lo, hi)
        assert out[f"same_argmax_{kv}"] >= out["positions"] - 1, kv
    assert 0 < out["max_abs_k"] < 65504 and 0 < out["max_abs_v"] < 65504
    assert out["identical_answers"] + len(out["first_difference_at"]) == 2
    assert all(0 <= i < 8 for i in out["first_difference_at"])
    assert "greedy answers identical" in capsys.readouterr().out


def test_kernel_bench_rows_hot_runs_every_path_on_one_thread(capsys):
    """`kernel_bench --rows --hot` on two row counts and one round: every path this CPU runs
    gives a cell per row count, on one thread (one gate_up, 20 times), and torch's thread
    count comes back afterwards (no timing is asserted)."""
    import torch

    from benchmarks import kernel_bench
    from engine.model.cpu import library as cpu_library

    assert cpu_library.load()
    before = torch.get_num_threads()
    cells = kernel_bench.bench_gguf_rows(rows=(1, 3), rounds=1, hot=True)
    assert torch.get_num_threads() == before
    out = capsys.readouterr().out
    assert "one gate_up 20 times, in cache" in out and "1 thread(s)" in out
    labels = {(c["isa"], c["activations"]) for c in cells}
    assert ("avx2", "q8") in labels and ("avx2", "float") in labels
    if cpu_library.has_vnni():
        assert ("avx512-vnni", "q8") in labels and ("avx512", "q8") in labels
    assert len(cells) == 2 * len(labels)
    assert all(c["ms"] > 0 and c["gflop_s"] > 0 for c in cells)


@pytest.mark.slow
def test_draft_study_target_agrees_with_itself(capsys):
    """`python -m benchmarks.draft_study` on a tiny run: the target, read back teacher-forced
    through `sequence_batch`, agrees with its own greedy tokens at every position (fp32: the
    engine's tokens equal a single-sequence forward's), and a candidate is measured too."""
    import torch

    from benchmarks import draft_study

    threads = torch.get_num_threads()
    try:
        rows = draft_study.study(num_prompts=1, max_tokens=6, threads=1, reps=1,
                                 candidates={"int4": draft_study.CANDIDATES[
                                     "(c) int4 g32, all layers, int8 lm_head"]})
    finally:
        torch.set_num_threads(threads)
    assert [r["draft"] for r in rows] == ["target", "int4"]
    target, int4 = rows
    assert target["agree_grounded"] == target["agree_open"] == 1.0
    assert target["cost_vs_target"] == 1.0 and int4["decode_ms"] > 0
    assert 0.5 < int4["agree_grounded"] <= 1.0, int4  # the recipe docs/decisions.md#the-int4-twin-draft calls 0.984


@pytest.mark.slow
def test_floor_share_measures_pairs_and_returns_every_block():
    from benchmarks.common import floor_share
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    eng = LLMEngine(EngineConfig(max_num_seqs=1, max_model_len=128))
    out = floor_share(eng, pairs=3, steps=2)
    assert len(out["pairs"]) == 3
    assert out["share"] in [p["share"] for p in out["pairs"]]
    assert all(p["decode_tok_per_s"] > 0 and p["read_bandwidth_gb_s"] > 0 for p in out["pairs"])
    assert not eng.has_unfinished()
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
