"""The speculation page's measurements, run on this machine when a teacher presses a button.

- `forward_cost`: how long one target forward pass takes over n new tokens (n = 1..16),
  timed through the engine's public API: a request of an n-token prompt and max_tokens=1
  is exactly one step whose forward computes n tokens. Verifying k drafted tokens is one
  such pass over 1 + k tokens: about one step where a step is memory-bound (a GPU at small
  batch), measurably more on a CPU, which is what the chart shows.
- `load_bench`: the spec benchmark's JSON under assets/bench/ (a fixed server-side folder),
  `{"results": [...], "forward_cost": [{"tokens": n, "ms": ...}]}`, if one is there;
  `recorded_label` says which command recorded it and when, since its charts are not live.
- `greedy_side_by_side`: the same greedy requests with speculation off and on, in fp32: the
  texts must be identical while the target runs fewer passes. fp32 because in bf16 a
  verification pass (1 + k rows per request) rounds differently from a decode pass (1 row),
  so two near-tied candidates can swap and the texts part ways after many tokens; that is the
  kernels' numerics, not the algorithm, and batch-invariant kernels would remove it.
- `lossless`: N seeded requests at temperature 1, once without and once with speculation;
  the second token's frequencies (given the most common first token) against the target's
  own probabilities computed independently by transformers. Speculation must not move them.
  Three tokens per request: the engine drafts at most max_tokens - tokens so far - 1, so the
  second token is the first one a draft can touch.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig

BENCH_DIR = Path(__file__).resolve().parents[1] / "assets" / "bench"
FORWARD_SIZES = (1, 2, 4, 8, 16)
LOSSLESS_PROMPT = ("Colours: red, green, blue, yellow, white, turquoise, magenta. "
                   "My favourite colour is mag")  # next: "enta" (p ~ 0.997), then "." or ","
LOSSLESS_TOP = 8  # tokens shown; the rest are pooled as "other"
FILLER = ("The quick brown fox jumps over the lazy dog while the small cat watches from the "
          "warm window and the rain keeps falling on the quiet old town.")

Progress = Callable[[float, str], None]


def _noop(fraction: float, message: str) -> None:
    pass


def forward_cost(model: str, sizes=FORWARD_SIZES, repeats: int = 3,
                 progress: Progress = _noop) -> list[dict]:
    """Median wall time (ms) of one engine step that computes n new tokens, per n."""
    eng = LLMEngine(EngineConfig(model=model, max_num_seqs=1, max_model_len=128,
                                 max_num_batched_tokens=128))
    ids = eng.tokenize(FILLER)
    assert len(ids) >= max(sizes), "the filler text is shorter than the largest size"
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    eng.generate([ids[:8]], one)  # warm-up
    rows = []
    for i, n in enumerate(sizes):
        times = []
        for _ in range(repeats):
            eng.add_request(ids[:n], one)
            times.append(eng.step().wall_s)
        rows.append({"tokens": n, "ms": 1000 * statistics.median(times)})
        progress((i + 1) / len(sizes), f"{n} tokens")
    return rows


def load_bench(folder: Path = BENCH_DIR) -> dict | None:
    """The speculation bench's JSON in `folder` (the newest with "forward_cost"), else None.

    Other benches write "results" too (engine-longtail.json); only the spec bench measures
    the forward cost, so that field tells its files apart. Newest: by the "date" the bench
    wrote (ISO, UTC), files without one after those with; a file's mtime (the checkout time
    in a fresh clone) only breaks ties."""
    if not folder.is_dir():
        return None
    found = []
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("forward_cost"):
            found.append((str(data.get("date") or ""), path.stat().st_mtime, path.name, data))
    if not found:
        return None
    *_, name, data = max(found, key=lambda f: f[:3])
    return {**data, "_file": name}


def bench_command(bench: dict) -> str:
    """The command line that wrote `bench`, rebuilt from the arguments it records; --json names
    the file the page read (the run may have written it elsewhere first, then been copied in)."""
    parts = ["python -m benchmarks.spec_bench"]  # the module whose arguments spec.json keeps
    for name, value in (bench.get("args") or {}).items():
        if value is None or value is False or value == 0 and name == "threads":
            continue
        if name == "json" and bench.get("_file"):
            value = f"{BENCH_DIR.parent.name}/{BENCH_DIR.name}/{bench['_file']}"
        flag = "--" + name.replace("_", "-")
        parts.append(flag if value is True else f"{flag} {value}")
    return " ".join(parts)


def recorded_date(bench: dict, folder: Path = BENCH_DIR) -> str | None:
    """When `bench` was recorded: its own "date" field, else the day git last committed the
    file, else None."""
    date = bench.get("date") or (bench.get("machine") or {}).get("date")
    if date:
        return str(date)[:10]  # the day (benches write an ISO time)
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", bench["_file"]],
                             cwd=folder, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def speedup_rows(results: list) -> list[dict]:
    """Rows of concurrency, speedup and method from a bench's results.

    benchmarks/spec_bench.py writes `concurrency`, `spec` (None for off), `workload` and
    `speedup_vs_off`; `speedup` and `method` are accepted too. Rows without speculation or
    without numbers are skipped.
    """
    rows = []
    for r in results or []:
        if not isinstance(r, dict):
            continue
        conc = r.get("concurrency")
        speed = r.get("speedup", r.get("speedup_vs_off"))
        method = r.get("method", r.get("spec"))
        if (not isinstance(conc, (int, float)) or not isinstance(speed, (int, float))
                or method in (None, "off")):
            continue
        label = f"{method} · {r['workload']}" if r.get("workload") else str(method)
        rows.append({"concurrency": conc, "speedup": speed, "method": label})
    return rows


# the variants of a draft model the apprentice table lists when the bench ran them
APPRENTICE_METHODS = ("draft", "eagle", "eagle+adaptive", "eagle+lookup+adaptive")


def apprentice_rows(bench: dict | None) -> list[dict]:
    """Per draft that has a model (the int4 twin "draft", the EAGLE head "eagle", and the
    head's variants in APPRENTICE_METHODS the bench ran), what the spec bench measured: its
    step cost relative to the target's at batch 1 (`draft_step`), its size, and at 1 running
    per workload its a (the lesson's per-token acceptance; older files: the acceptance rate)
    and its speedup over off."""
    steps = (bench or {}).get("draft_step") or {}
    results = [r for r in (bench or {}).get("results") or [] if isinstance(r, dict)]
    rows = []
    for method in APPRENTICE_METHODS:
        step = steps.get(method.split("+")[0])
        ran = [r for r in results if r.get("spec") == method and r.get("concurrency") == 1
               and r.get("workload") in ("open", "grounded")]
        if not isinstance(step, dict) or (method != method.split("+")[0] and not ran):
            continue
        row = {"method": method, "step_vs_target": step.get("vs_target"),
               "weight_mb": (step.get("weight_bytes") or 0) / 1e6}
        for r in ran:
            a = r.get("a")
            row[f"accept_{r['workload']}"] = a if a is not None else r.get("acceptance_rate")
            row[f"speedup_{r['workload']}"] = r.get("speedup_vs_off")
        rows.append(row)
    return rows


SIDE_BY_SIDE_REQUESTS = 3
SIDE_BY_SIDE_TOKENS = 24


def greedy_side_by_side(model: str, method: str, k: int, n: int | None = None,
                        max_tokens: int | None = None, progress: Progress = _noop) -> dict:
    """Greedy decoding of `n` grounded requests, speculation off then on, both in fp32.

    Each step runs the target once over every running request, so a request's target passes
    are the steps that emitted tokens for it (its prompt's pass emits the first token).
    Returns per request both texts, whether the token ids are identical, and the passes.
    """
    from benchmarks.workloads import get_workload

    n, max_tokens = n or SIDE_BY_SIDE_REQUESTS, max_tokens or SIDE_BY_SIDE_TOKENS
    items = get_workload("grounded", n)
    runs = {}
    for i, spec in enumerate((None, SpecConfig(method=method, num_speculative_tokens=k))):
        eng = LLMEngine(EngineConfig(model=model, dtype="float32", spec=spec, max_num_seqs=n,
                                     max_model_len=512))
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        rids = [eng.add_request(it.prompt, params) for it in items]
        passes = dict.fromkeys(rids, 0)  # steps that emitted tokens for the request
        while eng.has_unfinished():
            for e in eng.step().emitted:
                passes[e.request_id] += bool(e.token_ids)
            done = sum(len(eng.requests[r].output_token_ids) for r in rids) / (n * max_tokens)
            progress(0.5 * i + 0.5 * done, "on" if spec else "off")
        runs["on" if spec else "off"] = [(passes[r], eng.output(r)) for r in rids]
    rows = [{"name": it.name, "text_off": a.text, "text_on": b.text,
             "identical": a.token_ids == b.token_ids, "tokens": len(b.token_ids),
             "passes_off": pa, "passes_on": pb}
            for it, (pa, a), (pb, b) in zip(items, runs["off"], runs["on"])]
    return {"method": method, "k": k, "rows": rows,
            "passes_off": sum(r["passes_off"] for r in rows),
            "passes_on": sum(r["passes_on"] for r in rows),
            "tokens": sum(r["tokens"] for r in rows)}


def _sample_pairs(model: str, spec: SpecConfig | None, ids: list[int], n: int,
                  progress: Progress, done_before: float, share: float) -> tuple[list, dict]:
    eng = LLMEngine(EngineConfig(model=model, spec=spec, max_num_seqs=16, max_model_len=128,
                                 max_num_batched_tokens=1024))
    rids = [eng.add_request(ids, SamplingParams(max_tokens=3, temperature=1.0, seed=i,
                                                ignore_eos=True)) for i in range(n)]
    while eng.has_unfinished():
        eng.step()
        left = sum(not eng.requests[r].is_finished for r in rids)
        progress(done_before + share * (1 - left / n), f"{n - left}/{n}")
    pairs = [tuple(eng.output(r).token_ids[:2]) for r in rids]
    return pairs, eng.metrics_snapshot()


def target_probs(model: str, ids: list[int]):
    """The target's next-token distribution after `ids`, by transformers (temperature 1)."""
    import torch

    from benchmarks.baseline import load_hf

    hf, _ = load_hf(model, torch.float32, "cpu")
    with torch.inference_mode():
        logits = hf(torch.tensor([ids])).logits[0, -1].float()
    return torch.softmax(logits, dim=-1)


def lossless(model: str, method: str, k: int, n: int = 200,
             progress: Progress = _noop) -> dict:
    """Second-token frequencies with and without speculation vs the target's probabilities."""
    eng = LLMEngine(EngineConfig(model=model, max_num_seqs=1, max_model_len=128))
    ids = eng.tokenize(LOSSLESS_PROMPT)
    tok = eng.tokenizer
    off, _ = _sample_pairs(model, None, ids, n, progress, 0.0, 0.45)
    on, on_metrics = _sample_pairs(model, SpecConfig(method=method, num_speculative_tokens=k),
                                   ids, n, progress, 0.45, 0.45)
    first = Counter(p[0] for p in off).most_common(1)[0][0]
    probs = target_probs(model, ids + [first])
    progress(1.0, "target probabilities")
    second_off = Counter(p[1] for p in off if p[0] == first)
    second_on = Counter(p[1] for p in on if p[0] == first)
    n_off, n_on = sum(second_off.values()), sum(second_on.values())
    top = probs.topk(LOSSLESS_TOP).indices.tolist()
    rows = []
    for tid in top:
        rows.append({"token_id": tid, "text": tok.decode([tid]), "p_target": float(probs[tid]),
                     "freq_off": second_off[tid] / n_off if n_off else 0.0,
                     "freq_on": second_on[tid] / n_on if n_on else 0.0})
    rows.append({"token_id": -1, "text": None,
                 "p_target": max(0.0, 1 - sum(r["p_target"] for r in rows)),
                 "freq_off": max(0.0, 1 - sum(r["freq_off"] for r in rows)),
                 "freq_on": max(0.0, 1 - sum(r["freq_on"] for r in rows))})
    tv = {key: 0.5 * sum(abs(r[key] - r["p_target"]) for r in rows)
          for key in ("freq_off", "freq_on")}
    return {"prompt": LOSSLESS_PROMPT, "first_text": tok.decode([first]), "n": n,
            "n_off": n_off, "n_on": n_on, "rows": rows, "tv_off": tv["freq_off"],
            "tv_on": tv["freq_on"], "method": method, "k": k,
            "acceptance_rate": on_metrics.get("acceptance_rate")}
