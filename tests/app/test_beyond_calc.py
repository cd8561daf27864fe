"""The "beyond" page's computations (app/beyond_calc.py) held to the engine's own code and to
hand-worked cases."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app import beyond_calc as bc  # noqa: E402
from lessons.figures import load_figures  # noqa: E402

P = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)


# ------------------------------------------------------------------ the acceptance rule

def test_overlap_is_sum_of_min_by_hand():
    q = torch.tensor([0.1, 0.4, 0.15, 0.3, 0.05], dtype=torch.float64)
    assert bc.overlap(P, q) == pytest.approx(0.1 + 0.2 + 0.15 + 0.1 + 0.05)
    assert bc.overlap(P, P) == pytest.approx(1.0)
    assert bc.overlap([1, 0], [0, 1]) == 0.0


@pytest.mark.parametrize("temperature,mix", [(2.0, 0.0), (0.4, 0.0), (3.0, 0.5)])
def test_overlap_is_the_engines_measured_acceptance(temperature, mix):
    """Σ min(p, q) against the share of drafts the engine's rejection sampler keeps."""
    q = bc.draft_from(P, temperature, mix)
    draws = 40000
    got = bc.acceptance_by_sampling(P, q, draws=draws, seed=1)
    expected = bc.overlap(P, q)
    assert expected < 0.97  # the draft really differs, so the test can fail
    sigma = math.sqrt(expected * (1 - expected) / draws)
    assert abs(got["accepted"] - expected) < 5 * sigma


def test_emitted_tokens_follow_p_and_the_residual_is_where_p_exceeds_q():
    q = bc.draft_from(P, 3.0)
    got = bc.acceptance_by_sampling(P, q, draws=40000, seed=2)
    assert torch.allclose(got["first_token_freq"], P, atol=0.012)
    res = bc.residual(P, q)
    assert float(res.sum()) == pytest.approx(1.0)
    assert torch.equal(res > 0, P > q)
    assert torch.allclose(res, (P - q).clamp(min=0) / (P - q).clamp(min=0).sum())


def test_draft_from_moves_as_its_sliders_say():
    assert torch.allclose(bc.draft_from(P, 1.0), P)
    assert torch.allclose(bc.draft_from(P, 5.0, mix=1.0), P)
    flat = bc.draft_from(P, 100.0)
    assert float(flat.max() - flat.min()) < 0.01
    assert bc.overlap(P, bc.draft_from(P, 3.0, 0.5)) > bc.overlap(P, bc.draft_from(P, 3.0))
    with pytest.raises(ValueError, match="temperature"):
        bc.draft_from(P, 0.0)
    with pytest.raises(ValueError, match="mix"):
        bc.draft_from(P, 1.0, 1.5)
    with pytest.raises(ValueError, match="same tokens"):
        bc.overlap(P, [0.5, 0.5])


def test_the_recorded_distribution_is_a_real_top_list():
    data = bc.load_next_token()
    assert data is not None, "assets/beyond/next_token.json: run python -m app.beyond_calc"
    probs = data["probs"]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-9
    assert data["command"] and data["machine"] and data["date"]


# ------------------------------------------------------------------ the roofline

def test_gpu_numbers_come_from_the_figures():
    figs = load_figures()["figures"]
    h100 = bc.gpus()["H100"]
    assert h100.bandwidth == figs["h100_bandwidth"]["value"] * 1e12
    assert h100.peak == figs["h100_bf16_tflops"]["value"] * 1e12
    assert bc.llama2_7b().kv_bytes_per_token == 2 * 32 * 32 * 128 * 2


@pytest.mark.parametrize("name", ["H100", "H200"])
def test_crossover_is_the_flop_to_byte_ratio(name):
    gpu, model = bc.gpus()[name], bc.llama2_7b()
    ridge = gpu.peak / gpu.bandwidth * model.bytes_per_param / 2
    assert bc.ridge_batch(gpu, model) == pytest.approx(ridge)
    figs = load_figures()["figures"]
    assert figs[f"{name.lower()}_ridge_batch"]["value"] == round(ridge)
    # the weight matmuls cross exactly there, whatever the context (attention is its own
    # kernel), and a verify of k + 1 tokens per request k + 1 times sooner
    for context in (0, 512, 4096):
        b = bc.crossover_batch(gpu, model, context=context)
        assert b == pytest.approx(ridge, rel=1e-3)
        assert bc.step_cost(gpu, model, math.floor(b), context)["bound"] == "memory"
        assert bc.step_cost(gpu, model, math.ceil(b) + 1, context)["bound"] == "compute"
    assert bc.crossover_batch(gpu, model, 0, 5) == pytest.approx(ridge / 5, rel=1e-3)


def test_step_cost_by_hand():
    gpu = bc.GPU("toy", bandwidth=100.0, peak=1000.0, memory=1e9, bandwidth_figure="",
                 peak_figure="")
    model = bc.DenseModel("toy", params=10, layers=1, d_model=2, kv_heads=1, head_dim=2)
    c = bc.step_cost(gpu, model, batch=3, context=4)
    # bytes: 10 x 2 weights + KV (2 x 1 x 1 x 2 x 2 = 8 per token) x (3 x 4 read + 3 written)
    assert c["bytes"] == 20 + 8 * 15
    # flops: 2 x 10 x 3 new tokens + 4 x 1 x 2 x 4 x 3
    assert c["flops"] == 60 + 96
    # two rooflines added: the matmuls max(20 / 100, 60 / 1000), attention max(120 / 100,
    # 96 / 1000)
    assert c["t_gemm"] == pytest.approx(0.2) and c["t_attention"] == pytest.approx(1.2)
    assert c["time"] == pytest.approx(1.4)
    assert c["bound"] == "memory" and c["attention_bound"] == "memory"
    # ten times the rows: the matmuls turn compute-bound (600 FLOPs at 1000/s > 20 bytes at
    # 100/s), while the step's total bytes would still have hidden them
    c = bc.step_cost(gpu, model, batch=30, context=4)
    assert c["bound"] == "compute" and c["t_gemm"] == pytest.approx(0.6)
    assert c["t_mem"] > c["t_compute"]


def test_long_context_attention_stays_bandwidth_bound_and_speculation_keeps_a_gain():
    """Full multi-head attention reads about a byte of KV per attention FLOP: at a long
    context attention stays bandwidth-bound at any batch that fits, so once the matmuls are
    compute-bound speculation still keeps part of its gain (MagicDec, 2024); at a short
    context the gain falls below 1."""
    gpu, model = bc.gpus()["H100"], bc.llama2_7b()
    top = bc.max_batch(gpu, model, 1024, 5)
    for b in (1, 64, top):
        assert bc.step_cost(gpu, model, b, 1024, 5)["attention_bound"] == "memory"
    assert bc.step_cost(gpu, model, top, 1024, 5)["bound"] == "compute"
    long = bc.spec_speedup(gpu, model, top, 1024, k=4, alpha=0.8)
    short = bc.spec_speedup(gpu, model, 2048, 32, k=4, alpha=0.8)
    assert long > 1.0 > short


def test_expected_tokens_formula():
    assert bc.tokens_per_pass(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / (1 - 0.8))
    assert bc.tokens_per_pass(0.0, 4) == 1.0
    assert bc.tokens_per_pass(1.0, 4) == 5.0


def test_speculation_gain_falls_with_batch():
    gpu, model = bc.gpus()["H100"], bc.llama2_7b()
    rows = bc.roofline_rows(gpu, model, context=32, k=4, alpha=0.8,
                            batches=[1, 4, 16, 64, 256, 1024, 2048])
    gains = [r["speedup"] for r in rows]
    assert gains[0] == pytest.approx(bc.tokens_per_pass(0.8, 4), rel=0.01)  # memory-bound
    assert all(a >= b - 1e-9 for a, b in zip(gains, gains[1:]))
    assert gains[-1] < 1.0  # compute-bound: verifying k + 1 costs k + 1 steps
    assert all(r["fits"] for r in rows) and not bc.step_cost(gpu, model, 4096, 4096)["fits"]
    top = bc.max_batch(gpu, model, context=2048)
    assert bc.step_cost(gpu, model, top, 2048)["fits"]
    assert not bc.step_cost(gpu, model, top + 1, 2048)["fits"]


# ------------------------------------------------------------------ the timeline

def _rep(step, wall, emitted, waiting=(), admitted=()):
    return {"step": step, "wall_s": wall, "waiting": list(waiting), "admitted": list(admitted),
            "seats": [], "emitted": [{"request_id": r, "token_ids": list(range(n)), "text": ""}
                                     for r, n in emitted]}


def test_timeline_by_hand():
    reports = [_rep(1, 0.5, [], waiting=["a"]), _rep(2, 1.0, [("a", 1)], admitted=["a"]),
               _rep(3, 0.25, [("a", 3)]), _rep(4, 0.25, [("a", 1)])]
    tl = bc.request_timeline(reports, "a")
    assert tl["arrive"] == 0.0 and tl["ttft"] == 1.5
    assert tl["itl"] == [0.25, 0.25]
    assert tl["tokens"] == 5 and tl["tpot"] == pytest.approx(0.5 / 4)
    with pytest.raises(ValueError, match="'b'"):
        bc.request_timeline(reports, "b")
    assert bc.pick_request([reports, [_rep(1, 1, [("a", 1), ("c", 2)])]]) == "a"


# ------------------------------------------------------------------ the blocks

def test_block_life_follows_the_allocators_rules():
    snaps = {s["event"]: s for s in bc.block_life(block_size=4)}
    assert list(snaps) == ["admit", "fork", "cow", "grow", "preempt", "recompute"]
    marks = lambda e: [b["mark"] for b in snaps[e]["blocks"]]  # noqa: E731
    phys = lambda e: [b["physical"] for b in snaps[e]["blocks"]]  # noqa: E731
    assert marks("admit") == ["prefix", "prefix", "new"]  # 11 tokens: 2 cached + 1 fresh
    assert [b["refs"] for b in snaps["fork"]["blocks"]] == [2, 2, 2]
    # only the partial last block is copied; the full ones stay shared
    assert marks("cow") == ["held", "held", "copied"]
    assert phys("cow")[:2] == phys("fork")[:2] and phys("cow")[2] != phys("fork")[2]
    assert marks("grow")[-1] == "new" and len(phys("grow")) == 4
    assert all(m == "freed" for m in marks("preempt"))
    # back after preemption: the full blocks still cached are reused, the rest recomputed
    assert marks("recompute") == ["prefix", "prefix", "prefix", "recomputed"]
