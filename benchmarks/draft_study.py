"""`python -m benchmarks.draft_study [--dtype bfloat16] [--threads 1] [--n 12]`: the study
that chose the built-in draft (`engine.spec.draft.BUILTIN_RECIPE`) by measurement.

Speculative decoding (Leviathan, Kalman & Matias 2023) pays when the draft agrees with the
target often and costs little. Each candidate recipe compresses the target itself (int8 or
int4 weights, maybe only the first layers: an untrained early exit) and is measured on both:

- agreement: teacher-forced and greedy; the target generates `--max-tokens` tokens for
  `--n` `grounded` and `--n` `open` prompts, each candidate reads the same tokens in one
  forward, and agreement is the fraction of generated positions where the candidate's argmax
  equals the target's token.
- cost: one decode token after 200 tokens of context at batch 1, relative to the target's;
  candidates and target take turns, best of `reps` rounds (1 thread by default: steadier on
  a shared machine).

With acceptance rate a, k = 4 drafted tokens give (1 - a^5) / (1 - a) tokens per verification
if positions were independent. The measured table is in `engine/spec/draft.py`'s docstring.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import best_interleaved, sequence_batch
from benchmarks.workloads import get_workload
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.kv import KVPool
from engine.spec.draft import DraftRecipe, QuantizedLlama

CANDIDATES = {
    "(a) int8, all 30 layers, int8 lm_head": DraftRecipe(8, 8),
    "(b) int8, first 15 layers": DraftRecipe(8, 8, 15),
    "(b) int8, first 24 layers": DraftRecipe(8, 8, 24),
    "(c) int4 g32, all layers, int8 lm_head": DraftRecipe(4, 8),
    "(c) int4 g32, all layers, int4 lm_head": DraftRecipe(4, 4),
}


def study(num_prompts: int = 12, max_tokens: int = 48, threads: int | None = 1,
          reps: int = 12, dtype: str = "float32", candidates=CANDIDATES) -> list[dict]:
    """Teacher-forced greedy agreement and batch-1 decode cost of each candidate (and of the
    target itself, the first row: agreement 1, cost 1)."""
    if threads:
        torch.set_num_threads(threads)
    eng = LLMEngine(EngineConfig(dtype=dtype, max_num_seqs=8, max_model_len=512))
    prompts = {w: [it.prompt for it in get_workload(w, num_prompts)] for w in ("grounded", "open")}
    outs = {w: eng.generate(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
            for w, p in prompts.items()}
    ctx = list(range(1000, 1200)) + [5]  # the cost probe's sequence: 200 tokens, then one
    longest = max([len(ctx)] + [len(o.prompt_token_ids) + len(o.token_ids)
                                for results in outs.values() for o in results])
    mc = eng.model_config
    # a private pool the probes write from block 0 on, long enough for the longest sequence
    pool = KVPool(mc.num_layers, -(-longest // 16), 16, mc.num_kv_heads, mc.head_dim,
                  eng.kv_dtype, eng.device)

    def logits(model, token_ids: list[int], start: int) -> torch.Tensor:
        """fp32 logits [len - start, vocab] of token_ids[start:], run after token_ids[:start]
        (already in `pool`) as one sequence."""
        batch = sequence_batch(token_ids, start, pool.block_size, eng.device)
        return model.logits(model.forward(*batch, pool.layers, eng.backend)).float()

    models = {"target": eng.model}
    models.update({name: QuantizedLlama(eng.model, r) for name, r in candidates.items()})
    rows = []
    for name, model in models.items():
        row = {"draft": name}
        for w, results in outs.items():
            hit = total = 0
            for o in results:
                ids = o.prompt_token_ids + o.token_ids
                pred = logits(model, ids[:-1], 0)[len(o.prompt_token_ids) - 1:].argmax(-1)
                hit += sum(int(a == b) for a, b in zip(pred.tolist(), o.token_ids))
                total += len(o.token_ids)
            row[f"agree_{w}"] = hit / total
        rows.append(row)
    # decode cost: one token after the 200 of ctx (their K/V are whatever the pool holds:
    # the cost does not depend on the values)
    best = best_interleaved({name: lambda m=model: logits(m, ctx, len(ctx) - 1)
                             for name, model in models.items()}, rounds=reps)
    for row in rows:
        row["decode_ms"] = best[row["draft"]] * 1e3
        row["cost_vs_target"] = best[row["draft"]] / best["target"]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.draft_study",
                                 description="choose the built-in draft by measurement")
    ap.add_argument("--n", type=int, default=12, help="prompts per workload")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--dtype", default="float32", help="the target's dtype")
    args = ap.parse_args(argv)
    if args.n < 1 or args.max_tokens < 1:
        ap.error("--n and --max-tokens must be at least 1")
    try:
        EngineConfig(dtype=args.dtype)
    except ValueError as e:
        ap.error(f"--dtype: {e}")
    rows = study(args.n, args.max_tokens, args.threads or None, dtype=args.dtype)
    print(f"{'draft':<42}{'agree grounded':>15}{'agree open':>12}{'decode ms':>11}{'cost':>7}")
    for r in rows:
        print(f"{r['draft']:<42}{r['agree_grounded']:>15.3f}{r['agree_open']:>12.3f}"
              f"{r['decode_ms']:>11.1f}{r['cost_vs_target']:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
