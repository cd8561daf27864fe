"""The home page's race: the naive server and the engine on one small workload, on this machine.

Both get the same requests (benchmarks/workloads.py "longtail", answers capped, EOS ignored so both
compute exactly the same tokens), the same number of seats and the same dtype (the one the
engine picks for this machine), so what differs is how they serve. The naive server is
`benchmarks.baseline.NaiveServer`: transformers' generate() on static padded batches. The engine
runs continuous batching over a paged KV cache. Output tokens per second of compute are
measured for both; their ratio is the home page's headline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from app.state import Job, preset_jobs
from benchmarks.workloads import WorkItem
from engine import EngineConfig, LLMEngine, SamplingParams

Progress = Callable[[float, str], None]
# Sized to show what the engine gains here within about a minute: the long-tail workload with
# its answers uncapped (1 in 8 runs 128-200 tokens, the rest 8-32), so a static batch holds
# its seats for its longest answer. Fewer, capped answers hide most of the gain; more requests
# show more of it but take minutes (docs/performance.md, "Why the kernels are built as they
# are", has the sizes tried).
RACE_REQUESTS = 24
RACE_MAX_TOKENS = 200


def _noop(fraction: float, message: str) -> None:
    pass


def race_jobs(n: int = RACE_REQUESTS, cap: int = RACE_MAX_TOKENS) -> list[Job]:
    return preset_jobs("longtail", n, cap)


def engine_dtype() -> str:
    """The dtype the engine picks on this machine ("auto"), e.g. "float32" or "bfloat16"."""
    from engine.engine import resolve_device, resolve_dtype

    return str(resolve_dtype("auto", resolve_device("auto"))).removeprefix("torch.")


def run_naive(jobs: list[Job], seats: int, model: str, progress: Progress = _noop) -> dict:
    from benchmarks.baseline import NaiveServer

    server = NaiveServer(model=model, batch_size=seats, dtype=engine_dtype())
    items = [WorkItem(j.prompt, j.max_tokens, j.ignore_eos, 0.0, j.name) for j in jobs]
    result = server.run(items, progress)
    return {"tokens": result.output_tokens, "wall_s": result.wall_s,
            "tokens_per_s": result.output_tok_per_s,
            "device": f"{result.device} ({result.dtype})"}


def run_engine(jobs: list[Job], seats: int, model: str, progress: Progress = _noop) -> dict:
    eng = LLMEngine(EngineConfig(model=model, batching="continuous", kv_layout="paged",
                                 max_num_seqs=seats, max_model_len=512))
    for j in jobs:
        eng.add_request(j.prompt, SamplingParams(max_tokens=j.max_tokens,
                                                 ignore_eos=j.ignore_eos))
    total = sum(j.max_tokens for j in jobs)
    tokens = 0
    t0 = time.perf_counter()
    while eng.has_unfinished():
        report = eng.step()
        tokens += sum(len(e.token_ids) for e in report.emitted)
        progress(min(1.0, tokens / total), f"{tokens}/{total} tokens")
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else 0.0,
            "device": eng.describe()}


def race(seats: int, model: str, n: int = RACE_REQUESTS, cap: int = RACE_MAX_TOKENS,
         progress: Progress = _noop) -> dict:
    """Run both servers one after the other; progress spans [0, 0.5] and [0.5, 1]."""
    jobs = race_jobs(n, cap)
    naive = run_naive(jobs, seats, model, lambda f, m: progress(0.5 * f, f"naive: {m}"))
    engine = run_engine(jobs, seats, model, lambda f, m: progress(0.5 + 0.5 * f, f"engine: {m}"))
    ratio = engine["tokens_per_s"] / naive["tokens_per_s"] if naive["tokens_per_s"] else None
    return {"naive": naive, "engine": engine, "ratio": ratio, "requests": len(jobs),
            "seats": seats, "max_tokens": cap}
