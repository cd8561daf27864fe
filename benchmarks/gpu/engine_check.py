"""The engine's sections of `python -m benchmarks.gpu.check`: correctness, speed, CUDA graphs.

  * engine_vs_hf     greedy tokens against transformers' generate() on the same device: fp32
                     equal; bf16's first divergence and the reference's logit gap there
  * consistency      chunked prefill and n-gram speculation give the plain engine's tokens
                     (vLLM v1's one rule: every request's num_computed_tokens catches up, however
                     the step is cut; speculation is lossless under greedy)
  * engine_vs_naive  the chapter's experiment on a GPU (the naive server of benchmarks.baseline
                     against continuous batching + paged KV) with the engine's step cut into its
                     parts by `benchmarks.phases.StepPhases`
  * cuda_graphs      one decode step's forward replayed from a CUDA graph against eager (the
                     launch overhead graphs remove, as nano-vllm's capture_cudagraph does), and
                     the engine's own switch (EngineConfig.cuda_graphs, engine/graphs.py): greedy
                     tokens with graphs on equal those with graphs off, and decode tok/s on and
                     off at a few batch sizes (on the CPU dry run "on" is the replay stand-in)
  * async_scheduling the engine's overlap switch (EngineConfig.async_scheduling: step n + 1
                     launched before step n's tokens are read back): greedy tokens equal with it
                     on and off, and decode tok/s on and off at the same batch sizes

Every engine gets an explicit `num_kv_blocks` for its requests: on CUDA the default pool takes a
share of the free memory. The CPU dry run's model is benchmarks/gpu/tiny.py's.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from pathlib import Path

import torch

from benchmarks.gpu.tiny import TINY_VOCAB
from benchmarks.phases import StepPhases
from engine.config import EngineConfig, SamplingParams, SpecConfig
from engine.engine import freeze_startup_heap


def engine_config(c, max_num_seqs: int, max_model_len: int = 512, block_size: int = 16,
                  **kw) -> EngineConfig:
    """An engine for this run: the check's model and device, and a pool sized for exactly
    max_num_seqs requests of max_model_len (no share-of-free-memory default)."""
    blocks = max_num_seqs * -(-max_model_len // block_size)
    base = dict(model=c.sizes.model, device=c.device.type, max_num_seqs=max_num_seqs,
                max_model_len=max_model_len, block_size=block_size, num_kv_blocks=blocks,
                cpu_kernels=False, attention_backend="triton")
    base.update(kw)
    return EngineConfig(**base)


def _engine(cfg: EngineConfig):
    from engine.engine import LLMEngine

    return LLMEngine(cfg)


def _free(c) -> None:
    if not c.dry:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def prompt_ids(c, n: int) -> list[list[int]]:
    """n prompts as token ids: the long-tail workload's texts (some longer than a KV block), or
    random ids for the tiny model (its word-level vocabulary knows no real text)."""
    if c.dry:
        g = torch.Generator().manual_seed(1)
        return [torch.randint(3, TINY_VOCAB, (k,), generator=g).tolist()
                for k in (5, 37, 16, 50)[:n]]
    from benchmarks.workloads import get_workload
    from engine.model.loader import hf_folder, load_tokenizer

    tok = load_tokenizer(hf_folder(c.sizes.model))
    return [tok.encode(p, add_special_tokens=False)
            for p in get_workload("longtail", n=n, seed=3).prompts]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def _generate(c, prompts, max_tokens: int, seats: int | None = None, **cfg) -> list[list[int]]:
    eng = _engine(engine_config(c, max_num_seqs=seats or len(prompts), **cfg))
    outs = eng.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                ignore_eos=True))
    held = eng.allocator.num_blocks - eng.allocator.num_free_blocks
    assert held == 0, f"{held} KV blocks still held after generate"
    del eng
    _free(c)
    return [o.token_ids for o in outs]


# ---- 5: the engine against transformers ----------------------------------------------------
def engine_vs_hf(c) -> dict:
    from benchmarks.baseline import load_hf, reference_greedy

    n_new = c.sizes.hf_tokens
    prompts = prompt_ids(c, c.sizes.hf_prompts)
    ref = reference_greedy(prompts, n_new, model=c.sizes.model, ignore_eos=True,
                           dtype=torch.float32, device=c.device.type)
    hf, _ = load_hf(c.sizes.model, torch.float32, c.device.type)
    runs = []
    for dtype in ("float32", "bfloat16"):
        for backend in ("torch", "triton"):
            got = _generate(c, prompts, n_new, dtype=dtype, attention_backend=backend)
            per = []
            for p, r, g in zip(prompts, ref, got):
                i = first_divergence(r, g)
                row = {"prompt_tokens": len(p), "equal": i is None, "first_divergence": i}
                if i is not None and i < min(len(r), len(g)):
                    # the fp32 reference's logit margin between its token and the engine's there
                    with torch.no_grad():
                        ids = torch.tensor([p + r[:i]], device=hf.device)
                        logits = hf(input_ids=ids).logits[0, -1].float()
                    row["logit_gap"] = round(float(logits[r[i]] - logits[g[i]]), 5)
                per.append(row)
            equal = all(x["equal"] for x in per)
            runs.append({"dtype": dtype, "backend": backend, "all_equal": equal,
                         "prompts": per})
            print(f"   {dtype:<9} {backend:<7} equal to transformers: {equal} "
                  f"{[x['first_divergence'] for x in per]}", flush=True)
    fp32_equal = all(r["all_equal"] for r in runs if r["dtype"] == "float32")
    return {"ok": fp32_equal, "new_tokens": n_new, "reference": "transformers generate, fp32, "
            "greedy, one prompt at a time", "runs": runs, "fp32_equal": fp32_equal}


# ---- 6: chunked prefill and speculation against the plain engine ---------------------------
def consistency(c) -> dict:
    n_new = c.sizes.hf_tokens
    prompts = prompt_ids(c, c.sizes.hf_prompts)
    prompts.append((prompts[0] * 8)[:60])  # repetitive: n-gram drafts get accepted
    plain = _generate(c, prompts, n_new, dtype="float32")
    variants = {
        "chunked_prefill": dict(max_num_batched_tokens=16),
        "ngram_spec": dict(spec=SpecConfig(method="ngram", num_speculative_tokens=4)),
    }
    res: dict = {"dtype": "float32", "backend": "triton", "variants": {}}
    for name, kw in variants.items():
        got = _generate(c, prompts, n_new, dtype="float32", **kw)
        div = [first_divergence(a, b) for a, b in zip(plain, got)]
        res["variants"][name] = {"equal": all(d is None for d in div), "first_divergence": div}
        print(f"   {name:<16} equal to the plain engine: {all(d is None for d in div)} {div}")
    res["ok"] = all(v["equal"] for v in res["variants"].values())
    return res


# ---- 7: the engine against the naive server ------------------------------------------------
class GcPauses:
    """The cyclic garbage collector's pauses while active (gc.callbacks), by generation."""

    def __enter__(self):
        self.pauses: dict[int, list[float]] = {}
        self._t = 0.0
        gc.callbacks.append(self._cb)
        return self

    def _cb(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.pauses.setdefault(info["generation"], []).append(time.perf_counter() - self._t)

    def __exit__(self, *exc):
        gc.callbacks.remove(self._cb)

    def summary(self) -> dict:
        return {f"gen{g}": {"count": len(p), "total_ms": round(1e3 * sum(p), 2),
                            "max_ms": round(1e3 * max(p), 2)}
                for g, p in sorted(self.pauses.items())}


class TritonCompiles:
    """Counts Triton compiles (a kernel variant not yet in this process) while active, by
    triton's jit_cache_hook; on a triton without `knobs`, `available` is False."""

    def __enter__(self):
        self.kernels: dict[str, int] = {}
        try:
            from triton import knobs
            self._runtime = knobs.runtime
            self._prev = self._runtime.jit_cache_hook
        except (ImportError, AttributeError):
            self._runtime = None
            return self

        def hook(*args, **kwargs):
            name = getattr(kwargs.get("fn"), "name", "?")
            self.kernels[name] = self.kernels.get(name, 0) + 1
            return self._prev(*args, **kwargs) if self._prev else None  # None: compile it

        self._runtime.jit_cache_hook = hook
        return self

    @property
    def available(self) -> bool:
        return self._runtime is not None

    def __exit__(self, *exc):
        if self._runtime is not None:
            self._runtime.jit_cache_hook = self._prev


def run_engine(c, wl, seats: int) -> dict:
    """Serve a workload (all requests at once) on a fresh engine, timing every step's parts."""
    max_model_len = 512
    batched = max(512, seats) if c.dry else max(2048, seats)
    eng = _engine(engine_config(c, max_num_seqs=seats, max_model_len=max_model_len,
                                max_num_batched_tokens=batched, dtype=_dtype(c)))
    freeze_startup_heap()  # as the server does once its engine is built; undone below
    for it in wl.items:
        eng.add_request(it.prompt, SamplingParams(max_tokens=it.max_tokens,
                                                  ignore_eos=it.ignore_eos))
    graphs = getattr(eng.runner, "graphs", None)  # steps that replayed a graph; the rest eager

    def replays() -> int:
        return sum(graphs.replays.values()) if graphs is not None else 0

    steps = tokens = running_sum = decoding_sum = 0
    step_s = 0.0
    kind_s = {"graph": [0.0, 0], "eager": [0.0, 0]}  # seconds, steps: a replay or not
    max_step = (0.0, -1, "")  # seconds, index, kind of the slowest step
    t0 = time.perf_counter()
    with StepPhases(eng, cuda=not c.dry) as timer, TritonCompiles() as compiles, \
            GcPauses() as gcp:
        while eng.has_unfinished():
            timer.begin()
            before = replays()
            t = time.perf_counter()
            report = eng.step()
            dt = time.perf_counter() - t
            step_s += dt
            name = "graph" if replays() > before else "eager"
            kind_s[name][0] += dt
            kind_s[name][1] += 1
            max_step = max(max_step, (dt, steps, name))
            timer.end(dt)
            steps += 1
            tokens += sum(len(e.token_ids) for e in report.emitted)
            # running = seats that computed this step; finished riders idling in a static batch
            # and requests still queued do not count
            states = [s.state for s in report.seats]
            running_sum += sum(st in ("running", "prefill") for st in states)
            decoding_sum += states.count("running")
        timer.collect_gpu()
    wall = time.perf_counter() - t0
    snap = eng.metrics_snapshot()
    capture_s = round(getattr(eng, "graph_capture_s", 0.0), 3)  # at startup, not timed above
    graph_steps = replays()
    # mean step by kind: a slow first prefill (a kernel compiled inside the timed run) shows
    # in step_ms_eager and step_ms_max, not hidden in the mean
    by_kind = {f"step_ms_{k}": round(1e3 * s_ / n_, 3) if n_ else None
               for k, (s_, n_) in kind_s.items()}
    parts = {p: round(1e3 * s / max(steps, 1), 3) for p, s in timer.totals.items()}
    parts["forward_gpu_events"] = round(timer.gpu_forward_ms / max(steps, 1), 3)
    warmup_s = round(getattr(eng, "kernel_warmup_s", 0.0), 3)  # at startup, not timed above
    plan = eng.plan.as_dict()  # how its steps ran (engine/plan.py)
    del eng
    gc.unfreeze()  # the engine and what it held can be collected again
    _free(c)
    return {"system": "engine", "plan": plan, "requests": len(wl.items), "seats": seats,
            "num_kv_blocks": seats * -(-max_model_len // 16), "output_tokens": tokens,
            "wall_s": round(wall, 3), "output_tok_per_s": round(tokens / wall, 1),
            "steps": steps, "mean_running": round(running_sum / max(steps, 1), 2),
            "mean_decoding": round(decoding_sum / max(steps, 1), 2),
            "ttft_p50_s": snap.get("ttft_p50_s"), "tpot_p50_s": snap.get("tpot_p50_s"),
            "step_ms": round(1e3 * step_s / max(steps, 1), 3), **by_kind,
            "step_ms_max": round(1e3 * max_step[0], 3), "step_max_at": max_step[1:],
            "gc_pauses": gcp.summary(), "step_parts_ms": parts,
            "graph_capture_s": capture_s, "graph_steps": graph_steps,
            "kernel_warmup_s": warmup_s,
            # kernels compiled while serving (each a stall); None where triton cannot say
            "triton_compiles": dict(compiles.kernels) if compiles.available else None,
            "parts_missing": timer.missing}


def _dtype(c) -> str:
    return "float32" if c.dry else "bfloat16"


def engine_vs_naive(c) -> dict:
    from benchmarks.baseline import NaiveServer
    from benchmarks.workloads import get_workload

    torch_dtype = getattr(torch, _dtype(c))
    # warm both systems (cuBLAS handles, allocator pools) before anything is timed, the engine
    # with 1 seat and with 2. A GPU engine compiles its Triton kernels when it starts
    # (kernels/warmup.py); the warm runs' triton_compiles say whether anything was left over
    warm = get_workload("longtail", n=2, max_tokens_scale=0.02)
    NaiveServer(c.sizes.model, torch_dtype, 2, c.device.type).run(warm)
    warm_runs = [{k: r[k] for k in ("seats", "kernel_warmup_s", "triton_compiles",
                                    "step_ms_max")}
                 for r in (run_engine(c, warm, 1), run_engine(c, warm, 2))]
    rows, skipped = [], []
    for n in c.sizes.concurrency:
        if c.time_left() < 25:
            skipped.append(n)
            continue
        wl = get_workload("longtail", n=max(n, 4), max_tokens_scale=c.sizes.workload_scale)
        naive = NaiveServer(c.sizes.model, torch_dtype, n, c.device.type).run(wl).summary()
        naive = {k: naive[k] for k in ("output_tokens", "wall_s", "output_tok_per_s",
                                       "ttft_p50_s", "idle_seat_frac", "steps")}
        _free(c)
        engine = run_engine(c, wl, n)
        ratio = engine["output_tok_per_s"] / naive["output_tok_per_s"]
        rows.append({"concurrency": n, "requests": len(wl.items), "naive": naive,
                     "engine": engine, "speedup": round(ratio, 2)})
        print(f"   {n:>4} seats, {len(wl.items)} requests: naive "
              f"{naive['output_tok_per_s']:.1f} tok/s, engine {engine['output_tok_per_s']:.1f} "
              f"tok/s ({ratio:.1f}x); engine step {engine['step_ms']} ms "
              f"{engine['step_parts_ms']}", flush=True)
        c.report["engine_vs_naive"] = {"partial": True, "rows": rows}
        c.save()  # a long section: keep each concurrency's result as it comes
    at256 = next((r for r in rows if r["concurrency"] == 256), None)
    return {"ok": True, "workload": "longtail", "dtype": _dtype(c), "rows": rows,
            "warm_runs": warm_runs,
            "skipped_concurrency": skipped, "goal": "speedup >= 15 at 256 concurrent",
            "goal_met": None if at256 is None else at256["speedup"] >= 15}


# ---- 9: CUDA graphs ------------------------------------------------------------------------
def graph_flag() -> str | None:
    """The engine's CUDA-graph switch, if this EngineConfig has one."""
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    return next((n for n in ("cuda_graphs", "enforce_eager") if n in names), None)


def decode_forward_case(c, eng, batch: int, ctx: int):
    """One decode step's inputs over the engine's pool: batch requests of ctx tokens on
    consecutive blocks. Returns the forward as a closure."""
    from engine.model.attention import build_metadata

    bs = eng.config.block_size
    nb = -(-ctx // bs)
    tables = [list(range(i * nb, (i + 1) * nb)) for i in range(batch)]
    slots = [t[(ctx - 1) // bs] * bs + (ctx - 1) % bs for t in tables]
    meta = build_metadata([1] * batch, [ctx] * batch, tables, slots, bs, c.device)
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(3, eng.model_config.vocab_size, (batch,), generator=g).to(c.device)
    pos = torch.full((batch,), ctx - 1, dtype=torch.long, device=c.device)

    def forward():
        return eng.model.forward(ids, pos, meta, eng.pool.layers, eng.backend)

    return forward


def _decode_on_off(c, batch: int, name: str, read, switch) -> tuple[dict, object]:
    """Steady decode tok/s of `batch` running with a switch on and off ({name_on, name_off,
    gain}), and read(engine) of the engine with it on; switch(on) -> its EngineConfig fields."""
    from benchmarks.bench import decode_rate

    rates, seen = {}, None
    for on in (True, False):
        eng = _engine(engine_config(c, max_num_seqs=batch, dtype=_dtype(c), **switch(on)))
        rates[f"{name}_{'on' if on else 'off'}"] = round(
            decode_rate(eng, batch, steps=c.sizes.decode_steps, windows=2), 1)
        if on:
            seen = read(eng)
        del eng
        _free(c)
    rates["gain"] = round(rates[f"{name}_on"] / rates[f"{name}_off"], 2)
    return rates, seen


def _replays(eng) -> dict | None:
    """Padded batch size -> decode steps its graph replayed (None: no graphs)."""
    graphs = getattr(eng.runner, "graphs", None)
    return dict(graphs.replays) if graphs is not None else None


def cuda_graphs(c) -> dict:
    ctx = c.sizes.graph_context
    rows = []
    for batch in c.sizes.graph_batches:
        eng = _engine(engine_config(c, max_num_seqs=batch, max_model_len=ctx + 8,
                                    dtype=_dtype(c)))
        fwd = decode_forward_case(c, eng, batch, ctx)
        eager = fwd().clone()
        row = {"batch": batch, "ctx": ctx, "eager_ms": round(c.ms(fwd, rep=30), 4)}
        if c.dry:
            row["graph"] = "skipped: CUDA graphs need a GPU"
        else:
            try:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):  # warm-up off the capture stream, as torch asks
                    for _ in range(3):
                        fwd()
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    out = fwd()
                graph.replay()
                torch.cuda.synchronize()
                row["replay_equal_eager"] = bool(torch.equal(out, eager))
                row["graph_ms"] = round(c.ms(graph.replay, rep=30), 4)
                row["gain"] = round(row["eager_ms"] / row["graph_ms"], 2)
                del graph
            except Exception as e:  # noqa: BLE001 - e.g. a host sync inside the forward
                row["graph_error"] = f"{type(e).__name__}: {str(e)[:500]}"
        rows.append(row)
        print(f"   decode forward, batch {batch}, ctx {ctx}: {row}", flush=True)
        del eng, fwd
        _free(c)
    flag = graph_flag()
    res: dict = {"ok": all("graph_error" not in r for r in rows), "forward": rows,
                 "engine_flag": flag}
    if flag is None:
        res["engine"] = "EngineConfig has no CUDA-graph switch"
    else:
        prompts = prompt_ids(c, 3)  # 3 running in 8 seats: the size-4 graph, one padding row
        toks = {on: _generate(c, prompts, c.sizes.hf_tokens, seats=8, dtype="float32",
                              **{flag: on if flag == "cuda_graphs" else not on})
                for on in (True, False)}
        div = [first_divergence(a, b) for a, b in zip(toks[True], toks[False])]
        res["tokens_equal"] = all(d is None for d in div)
        res["first_divergence"] = div
        res["ok"] = res["ok"] and res["tokens_equal"]
        print(f"   engine greedy tokens, graphs on vs off (fp32): equal {res['tokens_equal']} "
              f"{div}", flush=True)
        res["engine"] = []
        for batch in c.sizes.graph_batches:
            rates, replays = _decode_on_off(
                c, batch, "graphs", _replays,
                lambda on: {flag: on if flag == "cuda_graphs" else not on})
            res["engine"].append({"running": batch, "decode_tok_per_s": rates,
                                  "graph_replays": replays})
            print(f"   engine decode, {batch} running: {rates}, replays {replays}", flush=True)
    return res


def async_scheduling(c) -> dict:
    """The overlap switch on and off: the same greedy tokens (fp32), then decode tok/s at each
    batch size with the default graphs setting, and how many steps were launched while the
    one before was still in flight."""
    prompts = prompt_ids(c, 3)
    toks = {on: _generate(c, prompts, c.sizes.hf_tokens, seats=8, dtype="float32",
                          async_scheduling=on) for on in (True, False)}
    div = [first_divergence(a, b) for a, b in zip(toks[True], toks[False])]
    res: dict = {"tokens_equal": all(d is None for d in div), "first_divergence": div,
                 "engine": []}
    print(f"   engine greedy tokens, async scheduling on vs off (fp32): equal "
          f"{res['tokens_equal']} {div}", flush=True)
    for batch in c.sizes.graph_batches:
        rates, overlapped = _decode_on_off(c, batch, "async", lambda e: e.overlapped_steps,
                                           lambda on: {"async_scheduling": on})
        res["engine"].append({"running": batch, "decode_tok_per_s": rates,
                              "overlapped_steps": overlapped})
        print(f"   engine decode, {batch} running: {rates}, overlapped {overlapped}", flush=True)
    res["ok"] = res["tokens_equal"] and all(r["overlapped_steps"] for r in res["engine"])
    return res


# ---- 11: speculation with the EAGLE head ---------------------------------------------------
EAGLE_METHODS = {  # what the section compares against no speculation
    "eagle": dict(method="eagle", num_speculative_tokens=4),
    "eagle+lookup": dict(method="eagle", num_speculative_tokens=4, prompt_lookup_first=True),
}


def eagle_head(c, head: str | None) -> Path | None:
    """The head file the section runs: `head` (check.py --eagle-head), else the one
    `python -m engine.spec.train_draft` wrote to this machine's cache; the dry run makes a
    random one for the tiny model (it checks the section, not what a trained head accepts).
    None when there is none."""
    from engine.spec import eagle

    if c.dry:
        path = Path(c.out_dir) / "tiny-eagle.safetensors"
        if not path.is_file():
            eng = _engine(engine_config(c, max_num_seqs=1, dtype="float32"))
            eagle.save_weights(eagle.init_weights(eng.model, torch.arange(TINY_VOCAB)), path)
            del eng
        return path
    path = Path(head) if head else eagle.head_path(c.sizes.model)
    return path if path.is_file() else None


def eagle_speculation(c, head: str | None = None) -> dict:
    """The GPU goal for speculation: the EAGLE head at batch 1 >= 1.5x no
    speculation on open prompts and >= 2x on grounded ones, where verifying k + 1 tokens costs
    about what one does. First the same greedy tokens with it as without (fp32: speculation is
    lossless), then, in the run's dtype, `open` and `grounded` prompts one at a time (one
    seat), stopping at EOS as the spec bench does: output tok/s with each method and without,
    the speedup, and the share of drafted tokens accepted."""
    from benchmarks.common import serve
    from benchmarks.workloads import get_workload
    from engine.metrics import RunMetrics

    path = eagle_head(c, head)
    if path is None:
        from engine.spec.eagle import TRAIN_COMMAND

        return {"ok": None, "skipped": f"no trained EAGLE head (build it with `{TRAIN_COMMAND}` "
                                       "and carry it in, or pass --eagle-head PATH)"}
    # a random head doubts every token: the dry run drafts k anyway, so verification runs
    doubt = {"min_confidence": 0.0} if c.dry else {}
    specs = {name: SpecConfig(draft_model=str(path), **kw, **doubt)
             for name, kw in EAGLE_METHODS.items()}
    prompts = prompt_ids(c, 2)
    plain = _generate(c, prompts, c.sizes.hf_tokens, dtype="float32")
    res: dict = {"head": str(path), "tokens_equal": {}, "workloads": {}}
    for name, spec in specs.items():
        got = _generate(c, prompts, c.sizes.hf_tokens, dtype="float32", spec=spec)
        div = [first_divergence(a, b) for a, b in zip(plain, got)]
        res["tokens_equal"][name] = all(d is None for d in div)
        print(f"   {name}: greedy tokens equal to no speculation (fp32): "
              f"{res['tokens_equal'][name]} {div}", flush=True)
    n, max_tokens = c.sizes.spec_prompts, c.sizes.spec_tokens
    for wl in ("open", "grounded"):
        if c.dry:  # the tiny model's word-level vocabulary knows no text: random ids
            requests = [(0.0, p, SamplingParams(max_tokens=max_tokens, temperature=0.0))
                        for p in prompt_ids(c, n)]
        else:
            requests = [(0.0, it.prompt, SamplingParams(
                max_tokens=min(it.max_tokens, max_tokens), temperature=0.0))
                for it in get_workload(wl, n=n).items]
        row: dict = {}
        for name, spec in {"off": None, **specs}.items():
            eng = _engine(engine_config(c, max_num_seqs=1, dtype=_dtype(c), spec=spec))
            serve(eng, requests[:1])  # warm-up: first calls, compiles, graphs
            eng.metrics = RunMetrics()
            r = serve(eng, requests)
            row[name] = {"output_tok_per_s": round(r["output_tok_per_s"], 1),
                         "output_tokens": r["output_tokens"],
                         "acceptance_rate": r["acceptance_rate"],
                         "mean_accepted_len": r["mean_accepted_len"]}
            del eng
            _free(c)
        for name in specs:
            row[name]["speedup"] = round(row[name]["output_tok_per_s"]
                                         / row["off"]["output_tok_per_s"], 3)
        res["workloads"][wl] = row
        print(f"   {wl}, batch 1: " + "; ".join(
            f"{k} {v['output_tok_per_s']} tok/s" + (f" ({v['speedup']}x, accepted "
                                                     f"{v['acceptance_rate']})" if k != "off"
                                                     else "")
            for k, v in row.items()), flush=True)
    goals = {"open": 1.5, "grounded": 2.0}
    res["goal_met"] = {wl: max(row[m]["speedup"] for m in specs) >= goals[wl]
                       for wl, row in res["workloads"].items()}
    res["ok"] = all(res["tokens_equal"].values())
    return res
