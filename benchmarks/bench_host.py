"""`python -m benchmarks.bench_host`: where a step's host time goes, phase by phase.

A 135M model on a CPU, or any model on a GPU, spends a real share of each step in Python:
choosing who rides, building the flat batch and its metadata, sampling, detokenizing and
describing the step for the app. Those costs must not grow faster than the batch. This bench
builds a tiny random Llama (2 layers, hidden 128, the bundled tokenizer's vocabulary), so the
model's own arithmetic is small and the host's share shows, fills 1, 16, 64 and 256 seats with
decoding requests, and times each phase of the next steps by wrapping the functions that do
them (the wrapping costs the same at every batch size, so the columns compare).

Phases: schedule (Scheduler.schedule), metadata (the runner's flat batch and attention
metadata), forward (the model's layers), logits (lm_head), update (sampling, advancing each
request, stop checks), detokenize, report (StepReport with the KV map), and step (the whole
`LLMEngine.step`). Times are the median per step in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

ROWS = (1, 16, 64, 256)
PHASES = ("schedule", "metadata", "forward", "logits", "update", "detokenize", "report", "step")


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


class PhaseTimer:
    """Wraps named callables; each call adds its wall time to its phase for this step."""

    def __init__(self):
        self.step: dict[str, float] = {}
        self.wrapped: list[tuple[object, str, object]] = []

    @contextmanager
    def phase(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.step[name] = self.step.get(name, 0.0) + time.perf_counter() - t0

    def wrap(self, obj, attr: str, name: str) -> None:
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)

        self.wrapped.append((obj, attr, vars(obj).get(attr)))  # None: inherited from a class
        setattr(obj, attr, timed)

    def unwrap(self) -> None:
        for obj, attr, own in reversed(self.wrapped):
            if own is None:
                delattr(obj, attr)  # the instance's wrapper goes; its class's method shows
            else:
                setattr(obj, attr, own)
        self.wrapped = []


def instrument(eng, timer: PhaseTimer) -> None:
    """Wrap the functions that do each phase (whichever of them this engine has: the bench
    also runs against the code before the step was split into its parts)."""
    import engine.engine as engine_mod

    targets = [
        (eng.scheduler, "schedule", "schedule"),
        (eng.runner, "run", "run"),  # metadata = run - forward - logits
        (eng.model, "forward", "forward"),
        (eng.model, "logits", "logits"),
        (eng, "_detokenize", "detokenize"),  # before: the whole output, every step
        (eng, "_report", "report"),  # before
        (engine_mod, "build_report", "report"),  # after
    ]
    try:
        from engine.detokenizer import Detokenizer  # after: a few tokens at a time

        targets += [(Detokenizer, m, "detokenize") for m in ("add", "take", "visible")]
    except ImportError:
        pass
    for obj, attr, name in targets:
        if hasattr(obj, attr):
            timer.wrap(obj, attr, name)


def measure(folder: Path, rows: int, steps: int, dtype: str) -> dict[str, float]:
    from engine import EngineConfig, LLMEngine, SamplingParams

    cfg = EngineConfig(model=str(folder), dtype=dtype, max_num_seqs=rows, block_size=16,
                       max_model_len=256, num_kv_blocks=rows * 16 + 16,
                       max_num_batched_tokens=max(2048, rows * 16))
    eng = LLMEngine(cfg)
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    for i in range(rows):
        eng.add_request(f"Request {i}: tell me about the number {i}.", params)
    while any(r.in_prefill or r.num_computed_tokens == 0 for r in eng.requests.values()):
        eng.step()  # every prompt prefilled: from here on every step decodes `rows` requests
    timer = PhaseTimer()
    instrument(eng, timer)
    per_step: dict[str, list[float]] = {p: [] for p in PHASES}
    for _ in range(steps):
        timer.step = {}
        t0 = time.perf_counter()
        eng.step()
        total = time.perf_counter() - t0
        run = timer.step.pop("run", 0.0)  # metadata + forward + logits
        timer.step["metadata"] = run - timer.step.get("forward", 0.0) - timer.step.get(
            "logits", 0.0)
        outside = sum(timer.step.get(p, 0.0) for p in ("schedule", "detokenize", "report"))
        timer.step["update"] = total - run - outside  # sampling, advancing, stop checks
        timer.step["step"] = total
        for p in PHASES:
            per_step[p].append(timer.step.get(p, 0.0))
    timer.unwrap()
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
    ap.add_argument("--json", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the host's cost, not the threads' spin-up, is what is measured
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = tiny_model_folder(Path(tmp) / "tiny-llama")
        for n in (int(x) for x in args.rows.split(",")):
            results[n] = measure(folder, n, args.steps, args.dtype)
    print("median ms per step, tiny random model; phase:", " | ".join(
        f"{n} running" for n in results))
    for p in PHASES:
        print(f"{p:>10}: " + " | ".join(f"{results[n][p]:8.2f}" for n in results))
    if args.json:
        args.json.write_text(json.dumps({"phases_ms": results, "steps": args.steps}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
