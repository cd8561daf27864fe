"""`python -m benchmarks.bench_host`: where a step's host time goes, phase by phase.

A 135M model on a CPU, or any model on a GPU, spends a real share of each step in Python:
choosing who rides, building the flat batch and its metadata, sampling, detokenizing and
describing the step for the app. Those costs must not grow faster than the batch. This bench
builds a tiny random Llama (2 layers, hidden 128, the bundled tokenizer's vocabulary), so the
model's own arithmetic is small and the host's share shows, fills 1, 16, 64 and 256 seats with
decoding requests, and times each phase of the next steps by wrapping the functions that do
them (the wrapping costs the same at every batch size, so the columns compare).

The phases are those of `benchmarks/phases.py` (schedule, metadata, forward, logits,
sampling, update, detokenize, report) and step (the whole `LLMEngine.step`). Times are the
median per step in milliseconds. A second table compares 4 running requests over a pool of
1,000 and of 100,000 blocks: the step must not grow with the pool.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.phases import PHASES, StepPhases

ROWS = (1, 16, 64, 256)


def tiny_model_folder(out: Path) -> Path:
    """A random 2-layer Llama with the bundled tokenizer, saved as a Hugging Face folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from engine.model.loader import hf_folder

    tok_src = hf_folder("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(tok_src)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=64, max_position_embeddings=1024, tie_word_embeddings=True,
                      eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def measure(folder: Path, rows: int, steps: int, dtype: str, num_blocks: int | None = None,
            ) -> dict[str, float]:
    from engine import EngineConfig, LLMEngine, SamplingParams

    cfg = EngineConfig(model=str(folder), dtype=dtype, max_num_seqs=rows, block_size=16,
                       max_model_len=256, num_kv_blocks=num_blocks or rows * 16 + 16,
                       max_num_batched_tokens=max(2048, rows * 16))
    eng = LLMEngine(cfg)
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    for i in range(rows):
        eng.add_request(f"Request {i}: tell me about the number {i}.", params)
    while any(r.in_prefill or r.num_computed_tokens == 0 for r in eng.requests.values()):
        eng.step()  # every prompt prefilled: from here on every step decodes `rows` requests
    per_step: dict[str, list[float]] = {p: [] for p in (*PHASES, "step")}
    with StepPhases(eng) as phases:
        # the code before the split had no separate sampling (it is then part of `update`)
        assert set(phases.missing) <= {"sampling"}, phases.missing
        for _ in range(steps):
            phases.begin()
            t0 = time.perf_counter()
            eng.step()
            total = time.perf_counter() - t0
            for p, v in {**phases.end(total), "step": total}.items():
                per_step[p].append(v)
    running = sum(1 for r in eng.scheduler.running if not r.is_finished)
    assert running == rows, f"{running} running, wanted {rows}"
    return {p: 1e3 * statistics.median(v) for p, v in per_step.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_host",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default=",".join(map(str, ROWS)),
                    help="running requests to measure at, comma separated")
    ap.add_argument("--steps", type=int, default=20, help="decode steps measured at each size")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--pools", default="1000,100000",
                    help="KV pool sizes (blocks) to compare at 4 running: the step must not "
                         "grow with the pool; empty to skip")
    ap.add_argument("--json", type=Path, help="also write the tables here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the host's cost, not the threads' spin-up, is what is measured
    results, pools = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_model_folder(Path(tmp) / "tiny-llama")
        for n in (int(x) for x in args.rows.split(",")):
            results[n] = measure(folder, n, args.steps, args.dtype)
        for blocks in (int(x) for x in args.pools.split(",") if x):
            pools[blocks] = measure(folder, 4, args.steps, args.dtype, num_blocks=blocks)
    print("median ms per step, tiny random model; phase:", " | ".join(
        f"{n} running" for n in results))
    for p in (*PHASES, "step"):
        print(f"{p:>10}: " + " | ".join(f"{results[n][p]:8.2f}" for n in results))
    if pools:
        print("4 running, pool of", " | ".join(f"{b} blocks" for b in pools))
        for p in ("report", "step"):
            print(f"{p:>10}: " + " | ".join(f"{pools[b][p]:8.2f}" for b in pools))
    if args.json:
        args.json.write_text(json.dumps({"phases_ms": results, "pools_ms": pools,
                                         "steps": args.steps}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
