"""`python -m benchmarks.kernel_bench`: the CPU kernels against what they replace, side by side.

1. Matmuls: every linear layer of the bundled model (30 layers x qkv, o, gate_up, down: the
   bytes a step streams), at 1, 16 and 64 rows, through our AMX kernel (when this CPU has
   AMX), our weight-streaming bf16 matmul and plain `F.linear`.
2. Attention: 16 requests decoding at contexts 30, 100 and 200 through the C++ kernel and
   through the torch backend (gather + SDPA), one layer's pool, bf16.
   Then one prompt of 64 to 500 tokens (every query of it in one call), both ways. Then 1 and
   4 requests decoding at contexts of 128 to 1024 positions, each context over 256 split into
   parts, one task each (as the kernel runs), or not (`bench_long_decode`); `--attention`
   runs only this part 2.
3. The layer loop: decode steps of two engines stepped alternately, one running the layers
   in C++ (`decode_layers`), the other the same kernels from Python.
4. What batch invariance costs: whole workloads (short chat prompts; 300-token prompts)
   through the engine as it is (every request in the attention kernel, so a token's bits
   never depend on its batch) and through the routing it replaced (requests of more than
   64 query tokens through gather + SDPA and the Python layer loop), rounds alternating.

`--weights` runs a fourth comparison instead (`bench_weights`): batch-1 decode tok/s and the
share of each weight format's memory floor for dense bf16 (AMX when the CPU has it, our
matmul on AVX-512 and AVX2), weights="gguf" (AVX-512, AVX2, portable), weights="gguf-q8"
(int8 activations: AVX-512, with VNNI where the CPU has it, and AVX2) and weights="gguf-q16"
(int16 activations, the same paths), then the long-tail workload with 16 requests at once
through the dense, GGUF, GGUF-q8 and GGUF-q16 engines; `--json` saves it.
It starts with where a GGUF step's time goes (`bench_gguf_matmuls`: each kind of matmul against
its bytes, then the rest of the step); `--weights --matmuls-only` runs only that, and
`--one-thread` runs it on one thread timed in CPU time (usable on a busy shared machine).
`--kv-cache` times whole decode steps of the gguf-q16 engine with a float32 and a float16 KV
cache (`kv_cache_dtype`), two engines in this process stepped in turns, at 1 to 16 running
requests and contexts of 100 to 400 positions: the cache's bytes against the conversion;
`--kv-quality` measures what that cache costs in numbers (`kv_cache_quality`: logits and next
tokens against the fp32 model, greedy answers against the float32 cache, the largest |K|, |V|).
`--rows` times the same matmuls (every layer's and the lm_head's GGUF weights, fp32 rows, then
the same weights pack_q8()ed with int8 rows and pack_q16()ed with int16 rows: AVX-512 with and
without VNNI, AVX2, and "avx512-vnni-amx" where the int16 kernel has AMX int8 tiles, which it
takes from 8 rows on) at 1 to 32 rows, the sizes of decode batches and verification passes,
per instruction set: ms for one step's worth and GFLOP/s, where from a few rows on the kernel is bound by its
multiply-adds and the dequantizing, not by memory.

Each figure is the best of several rounds, and the rounds of the two sides alternate, so a
slow moment of this shared machine hits both. docs/performance.md quotes a run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F

from benchmarks.common import best_interleaved, spin_openmp_threads


def bench_matmuls(model) -> None:
    from engine.model.cpu import library as cpu_library
    from engine.model.cpu.packing import amx_linear, kernel_linear, vnni_pack

    plain = [w for i in range(model.cfg.num_layers)
             for w in model.plain_linear_weights(i).values()]
    ways = {"plain F.linear": (plain, F.linear)}
    if cpu_library.load() and cpu_library.matmul_isa() != "portable":
        ways["weight-streaming matmul"] = (plain, kernel_linear)
    if cpu_library.amx_available():
        ways["AMX kernel"] = ([vnni_pack(w) for w in plain], amx_linear)
    mb = sum(w.numel() * w.element_size() for w in plain) / 1e6
    print(f"matmuls: {len(plain)} linear layers, {mb:.0f} MB of bf16 weights, ms per pass")
    for rows in (1, 16, 64):
        xs = {k: torch.randn(rows, k, dtype=torch.bfloat16) for k in {w.shape[1] for w in plain}}

        def run(weights, linear, xs):
            for w, p in zip(plain, weights):
                linear(xs[w.shape[1]], p)

        times = best_interleaved({name: partial(run, weights, linear, xs)
                                  for name, (weights, linear) in ways.items()}, rounds=5)
        line = "  ".join(f"{name} {t * 1e3:6.2f}" for name, t in times.items())
        if "AMX kernel" in times:
            line += f"  -> AMX {times['plain F.linear'] / times['AMX kernel']:.2f}x F.linear"
        print(f"  {rows:3d} rows: {line}")


def bench_attention() -> None:
    from engine.model.attention import TorchAttention, build_metadata
    from engine.model.cpu.attention import CpuAttention

    torch.manual_seed(0)
    B, hq, hkv, d, bs = 16, 9, 3, 64, 8
    print(f"attention: {B} decoding requests, {hq} query / {hkv} KV heads of {d}, bf16, "
          "us per layer")
    for ctx in (30, 100, 200):
        per = -(-ctx // bs)
        kc = torch.randn(B * per, bs, hkv, d, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        perm = torch.randperm(B * per).tolist()
        tables = [perm[i * per:(i + 1) * per] for i in range(B)]
        q = torch.randn(B, hq, d, dtype=torch.bfloat16)
        meta = build_metadata([1] * B, [ctx] * B, tables, [-1] * B, bs)
        # the torch backend plans once per step (meta._cache): repeated calls time layer 2+
        times = best_interleaved({name: partial(backend.forward, q, kc, vc, meta, d ** -0.5)
                                  for name, backend in (("C++ kernel", CpuAttention()),
                                                        ("gather+SDPA", TorchAttention()))},
                                 rounds=9, reps=20)
        ratio = times["gather+SDPA"] / times["C++ kernel"]
        print(f"  context {ctx:3d}: C++ kernel {times['C++ kernel'] * 1e6:6.1f}  gather+SDPA "
              f"{times['gather+SDPA'] * 1e6:6.1f}  -> {ratio:.2f}x")
    print("attention: one prompt, all its queries in one call, us per layer")
    for n in (64, 128, 300, 500):
        per = -(-n // bs)
        kc = torch.randn(per, bs, hkv, d, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        q = torch.randn(n, hq, d, dtype=torch.bfloat16)
        meta = build_metadata([n], [n], [torch.randperm(per).tolist()], [-1] * n, bs)
        times = best_interleaved({name: partial(backend.forward, q, kc, vc, meta, d ** -0.5)
                                  for name, backend in (("C++ kernel", CpuAttention()),
                                                        ("gather+SDPA", TorchAttention()))},
                                 rounds=7, reps=3)
        ratio = times["gather+SDPA"] / times["C++ kernel"]
        print(f"  prompt {n:3d}: C++ kernel {times['C++ kernel'] * 1e6:7.1f}  gather+SDPA "
              f"{times['gather+SDPA'] * 1e6:7.1f}  -> {ratio:.2f}x")


def _attend_each(caches, q, tables, lens, qsl, scale, *chunk) -> None:
    """One decode's attention over each layer's (K, V) cache in turn (chunk: the split size;
    none: the kernel's own)."""
    for k, v in caches:
        torch.ops.servelab.paged_attention(q, k, v, tables, lens, qsl, scale, *chunk)


def bench_long_decode(contexts=(128, 256, 300, 512, 1024), batches=(1, 4), layers: int = 120,
                      rounds: int = 5) -> list[dict]:
    """Decodes at long contexts: the kernel as it runs (a context over 256 positions split
    into equal parts, one task each, joined in order) against one task per (request, KV head)
    (chunk=0, the kernel before the split). The bundled model's heads (9 query, 3 KV, of 64),
    fp32 caches (the GGUF engines'); `layers` / batch layers' caches in turn, more bytes than
    the L3 holds, as a step's K/V comes from memory behind its weights. us per layer."""
    torch.manual_seed(0)
    hq, hkv, d, bs = 9, 3, 64, 16
    print(f"attention: decodes at long contexts ({hq} query / {hkv} KV heads of {d}, fp32), "
          f"{layers} / batch layers' caches in turn, us per layer")
    out = []
    for batch in batches:
        for ctx in contexts:
            per = -(-ctx // bs)
            caches = [(torch.randn(batch * per, bs, hkv, d), torch.randn(batch * per, bs, hkv, d))
                      for _ in range(max(1, layers // batch))]
            tables = torch.randperm(batch * per, dtype=torch.int32).view(batch, per)
            lens = torch.full((batch,), ctx, dtype=torch.int32)
            qsl = torch.arange(batch + 1, dtype=torch.int32)
            q = torch.randn(batch, hq, d)
            run = partial(_attend_each, caches, q, tables, lens, qsl, d ** -0.5)
            times = best_interleaved({"split": run, "unsplit": partial(run, 0)}, rounds=rounds)
            us = {name: t / len(caches) * 1e6 for name, t in times.items()}
            ratio = us["unsplit"] / us["split"]
            print(f"  {batch} decoding, context {ctx:4d}: split {us['split']:6.1f}  one task "
                  f"per KV head {us['unsplit']:6.1f}  -> {ratio:.2f}x")
            out.append({"batch": batch, "context": ctx, "split_us": us["split"],
                        "unsplit_us": us["unsplit"], "speedup": ratio})
            del caches
    return out


def bench_layer_loop(engine) -> None:
    from engine.config import SamplingParams
    from engine.engine import LLMEngine
    from engine.model.llama import LlamaModel

    if engine.model.cpp_layer_weights is None:
        print("layer loop: this model or CPU runs the Python loop only (no AMX weights)")
        return
    other = LLMEngine(engine.config)
    # the same plan (weights, kernels, instruction set), the layers called from
    # LlamaModel.forward
    python_loop = LlamaModel(engine.model.loaded,
                             dataclasses.replace(engine.plan, layer_loop="python"),
                             engine.config.max_model_len + 1)
    other.model = other.runner.model = python_loop
    print("layer loop: decode steps, ms per step")
    params = SamplingParams(max_tokens=200, ignore_eos=True)
    for running in (1, 4, 16):
        for e in (engine, other):
            for i in range(running):
                e.add_request(f"Count slowly from {i} upwards:", params)
            for _ in range(3):
                e.step()
        times = best_interleaved({"C++": engine.step, "Python": other.step}, rounds=6, reps=6)
        print(f"  {running:2d} running: C++ loop {times['C++'] * 1e3:5.1f}  Python loop "
              f"{times['Python'] * 1e3:5.1f}  -> {times['Python'] / times['C++']:.2f}x")
        for e in (engine, other):
            while e.has_unfinished():
                e.step()


def _engine(config, isa: str | None = None):
    """An engine whose plan runs the weight-streaming matmul on this instruction set
    (SERVELAB_CPU_ISA, the machine facts' input, set while the plan is made; None: the
    widest). The plan passes its set with every call, so each set needs its own engine."""
    from engine.engine import LLMEngine

    with _env("SERVELAB_CPU_ISA", isa) if isa else contextlib.nullcontext():
        return LLMEngine(config)


def _dense_engine(layout: str, isa: str | None = None, **kw):
    """A bf16 dense engine whose linear weights take `layout` ("amx", "bf16") on `isa`: the
    plan picks one layout per CPU, so the bench builds the model itself, from the engine's plan
    with that layout, to set the others beside it."""
    from engine.config import EngineConfig
    from engine.model.llama import LlamaModel
    from engine.plan import machine_facts

    eng = _engine(EngineConfig(dtype="bfloat16", weights="dense", **kw), isa)
    if eng.model.layout != layout:
        plan = dataclasses.replace(eng.plan, layout=layout,
                                   isa="amx" if layout == "amx" else isa or machine_facts().isa)
        eng.model = eng.runner.model = LlamaModel(eng.model.loaded, plan,
                                                  eng.config.max_model_len + 1)
    return eng


def bench_gguf_matmuls(gguf, isas: list[str], bw: float, rounds: int = 5,
                       one_thread: bool = False) -> list[dict]:
    """Where a batch-1 GGUF decode step's time goes: every layer's weight of one kind (30 x qkv,
    o, gate_up, down) and the lm_head through torch.ops.servelab.matmul at one row, per
    instruction set, against the bytes they read (ms per step, GB/s, share of the floor);
    then the whole step, whose remainder is everything but the matmuls (attention, norms,
    rope, the layer loop, Python, sampling). Each kind streams 30 distinct weights, so it
    reads memory as a step does rather than a cache-resident copy.

    one_thread: torch on one thread, timed by that thread's CPU time (time.thread_time), so
    that other jobs on a shared machine, which take the core away for a while, do not count
    (they still share the memory's bandwidth); the wall clock otherwise."""
    from engine.config import SamplingParams

    clock = time.thread_time if one_thread else time.perf_counter
    model = gguf.model
    kinds = {name: [layer[name] for layer in model.layers] for name in model.LINEAR_WEIGHTS}
    kinds["lm_head"] = [model.lm_head]
    xs = {k: torch.randn(1, k) for k in {model.cfg.hidden_size, model.cfg.intermediate_size}}
    k_of = {"down": model.cfg.intermediate_size}

    def timed(fn, reps: int) -> float:
        t = clock()
        for _ in range(reps):
            fn()
        return (clock() - t) / reps

    def run(ws, x, isa):
        for w in ws:
            torch.ops.servelab.matmul(x, w, "auto", isa)

    threads = torch.get_num_threads()
    print(f"GGUF matmuls at batch 1, one step's worth of each, {threads} thread(s), "
          f"{'CPU' if one_thread else 'wall'} time (ms; GB/s; floor: read bandwidth)")
    rows = []
    for isa in isas:
        if isa == "portable":
            continue
        ways = {name: partial(run, ws, xs[k_of.get(name, model.cfg.hidden_size)], isa)
                for name, ws in kinds.items()}
        times = dict.fromkeys(ways, float("inf"))
        for _ in range(rounds):  # the kinds take turns, the best of the rounds counts
            for name, fn in ways.items():
                times[name] = min(times[name], timed(fn, 3))
        eng = _engine(gguf.config, isa)  # the whole step on this set: the plan's
        eng.add_request("Count slowly from 1 upwards:",
                        SamplingParams(max_tokens=4 + 16 * rounds, ignore_eos=True))
        for _ in range(3):
            eng.step()  # the prefill and the first decodes
        step = min(timed(eng.step, 16) for _ in range(rounds - 1))
        while eng.has_unfinished():
            eng.step()
        total_mm = sum(times.values())
        cells = []
        for name, t in times.items():
            nbytes = sum(w.numel() for w in kinds[name])
            rows.append({"isa": isa, "kind": name, "ms": t * 1e3, "mb": nbytes / 1e6,
                         "gb_s": nbytes / t / 1e9, "floor_frac": nbytes / bw / t})
            cells.append(f"{name} {t * 1e3:.2f} ({nbytes / t / 1e9:4.1f} GB/s, "
                         f"{nbytes / bw / t:3.0%})")
        all_bytes = sum(w.numel() for ws in kinds.values() for w in ws)
        print(f"  {isa:7s} " + "  ".join(cells))
        print(f"  {isa:7s} matmuls {total_mm * 1e3:.2f} ms ({all_bytes / bw / total_mm:3.0%} of "
              f"floor)  whole step {step * 1e3:.2f} ms  -> the rest {(step - total_mm) * 1e3:.2f}"
              " ms")
        rows.append({"isa": isa, "kind": "step", "threads": threads, "cpu_time": one_thread,
                     "ms": step * 1e3, "matmul_ms": total_mm * 1e3})
    return rows


def bench_gguf_rows(rows=(1, 2, 4, 8, 9, 12, 16, 32), rounds: int = 5,
                    hot: bool = False) -> list[dict]:
    """One step's GGUF matmuls (30 layers x qkv, o, gate_up, down, and the lm_head) at each
    row count, per instruction set: ms and GFLOP/s (2 * rows * weights per step); then the
    same weights pack_q8()ed with int8 rows (weights="gguf-q8": AVX-512 with VNNI where the CPU
    has it and without, AVX2), and pack_q16()ed with int16 rows (weights="gguf-q16", the same
    paths). Each round runs every path at every row count in turn, so a
    slow moment of the machine hits them all; the best round counts.

    hot: instead, one layer's gate_up (1.1 MB as int8 groups) 20 times on one thread, so the
    weight stays in cache and the kernels' arithmetic shows, not the memory's speed."""
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.model.cpu import library
    from engine.model.gguf import row_format

    model = LLMEngine(EngineConfig(weights="gguf", max_num_seqs=1, max_model_len=64)).model
    def k_of(name):  # the input width of each kind of weight
        return model.cfg.intermediate_size if name == "down" else model.cfg.hidden_size

    if hot:
        shapes = [(model.layers[len(model.layers) // 2]["gate_up"], k_of("gate_up"))] * 20
    else:
        shapes = [(layer[name], k_of(name)) for layer in model.layers
                  for name in model.LINEAR_WEIGHTS]
        shapes.append((model.lm_head, model.cfg.hidden_size))
    packs = {}  # one packed copy per weight and kind: --hot repeats the same one
    for w, k in shapes:
        for act in ("q8", "q16"):
            if (id(w), act) not in packs:
                pack = getattr(torch.ops.servelab, f"pack_{act}")
                packs[id(w), act] = pack(w, row_format(w, k))
    packed = {act: [(packs[id(w), act], k) for w, k in shapes] for act in ("q8", "q16")}
    n_weights = sum(w.shape[0] * k for w, k in shapes)
    threads = torch.get_num_threads()
    if hot:
        torch.set_num_threads(1)
    what = "one gate_up 20 times, in cache" if hot else "GGUF matmuls of one step"
    print(f"{what} ({n_weights / 1e6:.0f} M weights, fp32 rows), "
          f"{torch.get_num_threads()} thread(s): ms / GFLOP/s")
    xs = {m: {k: torch.randn(m, k) for k in {k for _, k in shapes}} for m in rows}

    def step(m, isa, act):
        if act == "float":
            for w, k in shapes:
                torch.ops.servelab.matmul(xs[m][k], w, "auto", isa)
            return
        matmul = getattr(torch.ops.servelab, f"matmul_{act}")
        for w, k in packed[act]:
            matmul(xs[m][k], w, "auto", isa)

    isas = [isa for isa in library.supported_isas() if isa != "portable"]  # portable: correctness
    # (label, activations, isa as the plan names it: its variants explicit)
    paths = [(isa, "float", isa) for isa in isas]
    paths += [(isa + ("-vnni" if vnni else ""), act, isa + ("+vnni" if vnni else ""))
              for act in ("q8", "q16")
              for isa, vnni in (("avx512", True), ("avx512", False), ("avx2", False))
              if isa in isas and (library.has_vnni() or not vnni)]
    if torch.ops.servelab.q16_tiles_from_rows():  # the int16 kernel on AMX tiles, where it runs
        paths.append(("avx512-vnni-amx", "q16", "avx512+vnni+amx"))
    best = {(label, act, m): float("inf") for label, act, *_ in paths for m in rows}
    for r in range(rounds + 1):  # round 0 warms up
        for label, act, isa in paths:
            for m in rows:
                t = time.perf_counter()
                step(m, isa, act)
                if r:
                    best[label, act, m] = min(best[label, act, m], time.perf_counter() - t)
    torch.set_num_threads(threads)
    out = []
    for label, act, *_ in paths:
        out += _row_cells(label, act, rows, {m: best[label, act, m] for m in rows}, n_weights)
    return out


def _row_cells(isa: str, activations: str, rows, best: dict, n_weights: int) -> list[dict]:
    out, cells = [], []
    for m in rows:
        gf = 2 * m * n_weights / best[m] / 1e9
        out.append({"isa": isa, "activations": activations, "rows": m, "ms": best[m] * 1e3,
                    "gflop_s": gf})
        cells.append(f"{m}: {best[m] * 1e3:6.2f} / {gf:5.1f}")
    print(f"  {isa + ' ' + activations:17s} " + "  ".join(cells))
    return out


@contextlib.contextmanager
def _env(name: str, value: str):
    """Set an environment variable for a while (the plan reads SERVELAB_CPU_ISA when made)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def bench_weights(longtail_seats: int = 16, rounds: int = 2, only_matmuls: bool = False,
                  one_thread: bool = False) -> dict:
    from benchmarks.bench import decode_rate, run_engine
    from benchmarks.common import memory_read_bandwidth
    from benchmarks.workloads import get_workload
    from engine.config import EngineConfig
    from engine.engine import LLMEngine
    from engine.model.cpu import library

    isas = library.supported_isas()
    kw = dict(max_num_seqs=longtail_seats, max_model_len=512)
    if only_matmuls:
        if one_thread:
            torch.set_num_threads(1)
        gguf = LLMEngine(EngineConfig(dtype="bfloat16", weights="gguf", **kw))
        if one_thread:  # one thread's read bandwidth, in its CPU time, as the matmuls are timed
            ones = torch.ones(128 * 2**20 // 4)
            best = float("inf")
            for _ in range(5):
                t = time.thread_time()
                ones.sum()
                best = min(best, time.thread_time() - t)
            bw = ones.numel() * 4 / best
        else:
            bw = memory_read_bandwidth(torch.device("cpu"))
        print(f"[{gguf.describe()}] read bandwidth {bw / 1e9:.1f} GB/s")
        return {"read_bandwidth_gb_s": bw / 1e9,
                "gguf_matmuls": bench_gguf_matmuls(gguf, isas, bw, one_thread=one_thread)}
    from engine.model.hardware import resolve_dtype
    from engine.plan import plan_for

    fp32_default = resolve_dtype("auto", torch.device("cpu")) == torch.float32
    engines = {}
    if library.amx_available():
        engines["dense bf16, AMX kernel"] = (_dense_engine("amx", **kw), None)
    for isa in isas:
        if isa != "portable":  # the portable path is there for correctness, not bf16 speed
            engines[f"dense bf16, matmul {isa}"] = (_dense_engine("bf16", isa, **kw), isa)
    gguf = LLMEngine(EngineConfig(dtype="bfloat16", weights="gguf", **kw))
    for isa in isas:
        engines[f"gguf Q4_1/Q8_0, matmul {isa}"] = (_engine(gguf.config, isa), isa)
    if fp32_default:  # the default runs fp32 activations here (GGUF blocks, or no bf16 units)
        engines["dense fp32, PyTorch F.linear"] = (
            LLMEngine(EngineConfig(dtype="float32", weights="dense", **kw)), None)
        gguf32 = EngineConfig(dtype="float32", weights="gguf", **kw)
        for isa in isas:
            if isa != "portable":
                engines[f"gguf, fp32 activations, {isa}"] = (_engine(gguf32, isa), isa)
    # the same blocks with int8 activations, llama.cpp's arithmetic (VNNI where the CPU has it)
    q8 = EngineConfig(dtype="float32", weights="gguf-q8", **kw)
    for isa in isas:
        if isa != "portable":
            engines[f"gguf-q8, int8 activations, {isa}"] = (_engine(q8, isa), isa)
    q16 = EngineConfig(dtype="float32", weights="gguf-q16", **kw)
    for isa in isas:
        if isa != "portable":
            engines[f"gguf-q16, int16 activations, {isa}"] = (_engine(q16, isa), isa)
    bw = memory_read_bandwidth(torch.device("cpu"))
    print(f"[{gguf.describe()}] read bandwidth {bw / 1e9:.1f} GB/s; matmul paths here: "
          f"{', '.join(isas)}")
    breakdown = bench_gguf_matmuls(gguf, isas, bw)
    rates = dict.fromkeys(engines, 0.0)
    for _ in range(rounds):  # the ways take turns, the best of the rounds counts
        for name, (eng, _) in engines.items():
            rates[name] = max(rates[name], decode_rate(eng, 1))
    rows = []
    print("batch-1 decode (weights: MB a step reads; floor: read bandwidth / those bytes)")
    for name, (eng, isa) in engines.items():
        mb = eng.model.weight_bytes / 1e6
        floor = bw / eng.model.weight_bytes
        rows.append({"way": name, "isa": isa, "layout": eng.model.layout, "weight_mb": mb,
                     "dtype": str(eng.dtype).removeprefix("torch."),
                     "decode_tok_per_s": rates[name], "floor_tok_per_s": floor,
                     "floor_frac": rates[name] / floor})
        print(f"  {name:32s} {rates[name]:7.1f} tok/s  weights {mb:5.0f} MB  floor "
              f"{floor:6.1f} tok/s  -> {rates[name] / floor:4.0%} of it")
    longtail = []
    work = get_workload("longtail", longtail_seats)
    print(f"long-tail workload, {longtail_seats} requests at once, {longtail_seats} seats")
    cpu = torch.device("cpu")
    default = plan_for(EngineConfig(device="cpu", **kw))
    weights, dtype = default.weights, default.dtype
    ways = {f"engine default ({dtype}, weights {weights})": EngineConfig(**kw)}
    for other in ("dense", "gguf", "gguf-q8", "gguf-q16"):  # every other way, in its own dtype
        if other != weights:
            other_dtype = str(resolve_dtype("auto", cpu, weights=other)).removeprefix("torch.")
            ways[f"{other_dtype}, weights {other}"] = EngineConfig(dtype=other_dtype,
                                                                  weights=other, **kw)
    for name, cfg in ways.items():
        t = time.perf_counter()
        res = run_engine(cfg, work)
        res.update(way=name, wall_s=time.perf_counter() - t)
        longtail.append(res)
        print(f"  {name:32s} {res['output_tok_per_s']:7.1f} output tok/s")
    return {"read_bandwidth_gb_s": bw / 1e9, "gguf_matmuls": breakdown, "batch1": rows,
            "longtail": longtail}


def long_prompts_to_sdpa():
    """The attention routing before batch invariance, for comparison: requests bringing more
    than 64 query tokens went through gather + SDPA (whose rounding depends on the query
    count), so a step holding one ran the Python layer loop; the rest took the kernel."""
    from engine.model.attention import TorchAttention
    from engine.model.cpu.attention import CpuAttention

    class LongPromptsToSdpa(CpuAttention):
        MAX_KERNEL_QUERY = 64

        def takes_whole_step(self, meta, *heads) -> bool:
            return (super().takes_whole_step(meta, *heads)
                    and max(meta.query_lens) <= self.MAX_KERNEL_QUERY)

        def _segment(self, q, k_cache, v_cache, meta, seg, scale):
            _, B, m, _, _ = meta._cache["plan"][seg]
            if m > self.MAX_KERNEL_QUERY:
                return TorchAttention._segment(self, q, k_cache, v_cache, meta, seg, scale)
            first = meta._cache["plan_rows"][seg]
            starts = torch.arange(0, (B + 1) * m, m, dtype=torch.int32)
            return torch.ops.servelab.paged_attention(
                q, k_cache, v_cache, meta.block_tables[first:first + B],
                meta.seq_lens[first:first + B], starts, scale)

    return LongPromptsToSdpa()


def bench_invariance_cost(engine) -> None:
    from benchmarks.common import serve
    from benchmarks.workloads import get_workload
    from engine.config import SamplingParams
    from engine.engine import LLMEngine
    from engine.metrics import RunMetrics

    other = LLMEngine(engine.config)
    other.backend = other.runner.backend = long_prompts_to_sdpa()
    print("batch invariance: whole workloads, 16 seats, output tokens/s (prompt tokens/s)")
    for name, n, scale in (("longtail", 16, 0.5), ("shared-prefix", 8, 0.5)):
        work = get_workload(name, n, max_tokens_scale=scale)
        requests = [(0.0, it.prompt, SamplingParams(max_tokens=it.max_tokens, ignore_eos=True))
                    for it in work.items]
        prompt_tokens = sum(len(engine.tokenize(it.prompt)) for it in work.items)
        best = {}
        for _ in range(3):
            for label, e in (("invariant", engine), ("SDPA > 64", other)):
                e.metrics = RunMetrics()
                res = serve(e, requests)
                best[label] = min(best.get(label, float("inf")), res["wall_s"])
        out = work.total_max_tokens
        cells = "  ".join(f"{label} {out / t:6.1f} ({prompt_tokens / t:6.1f})"
                          for label, t in best.items())
        print(f"  {name:13s} ({n} requests, {prompt_tokens} prompt tokens): {cells}  -> "
              f"invariant costs {(best['invariant'] / best['SDPA > 64'] - 1) * 100:+.1f}%")


def bench_kv_cache(cases=((1, 100), (1, 400), (4, 400), (16, 200)), rounds: int = 8,
                   steps: int = 24) -> list[dict]:
    """ms of a decode step at `running` requests of `context` positions, with the gguf-q16
    engine's float32 and float16 KV caches: `rounds` windows of `steps` steps a side
    (`decode_rate`), in turns whose order flips each round; the median window a side."""
    import statistics

    from benchmarks.common import decode_rate
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    kinds = ("float32", "float16")
    # the CPU default's weights (gguf-q16, float32 activations), whichever this CPU defaults to
    engines = {kv: LLMEngine(EngineConfig(weights="gguf-q16", max_num_seqs=16, max_model_len=512,
                                          kv_cache_dtype=kv))
               for kv in kinds}
    print(f"decode steps, KV cache float32 against float16 [{engines['float16'].describe()}]")
    out = []
    for running, context in cases:
        per = {kv: [] for kv in kinds}
        for r in range(rounds):
            for kv in (kinds if r % 2 == 0 else kinds[::-1]):
                rate = decode_rate(engines[kv], running, steps, windows=1, context=context)
                per[kv].append(running / rate)  # seconds a step
        ms = {kv: statistics.median(v) * 1e3 for kv, v in per.items()}
        out.append({"running": running, "context": context, "ms_float32": ms["float32"],
                    "ms_float16": ms["float16"], "speedup": ms["float32"] / ms["float16"]})
        print(f"  {running:2d} running at context {context}: float32 {ms['float32']:6.2f} ms, "
              f"float16 {ms['float16']:6.2f} ms -> {ms['float32'] / ms['float16']:.2f}x",
              flush=True)
    return out


def kv_cache_quality(prompts=None, forced_tokens: int = 24, answers: int = 32,
                     answer_tokens: int = 128) -> dict:
    """What the float16 KV cache costs in numbers, beside a float32 cache (both gguf-q16, fp32
    activations) and against the fp32 model (weights="gguf", the GGUF file's own numbers):

    - logits, teacher-forced on the fp32 engine's own greedy answers to `prompts` (the
      probe prompts, `forced_tokens` each): the distance from the fp32 model's logits as a
      share of their norm (the mean over a prompt's positions; the range over prompts), and
      at how many positions each picks the fp32 model's next token;
    - the largest |K| and |V| the fp32 model writes on those positions (float16 holds 65504);
    - greedy answers to the first `answers` longtail prompts, `answer_tokens` tokens each,
      float16 cache against float32: how many are identical, and where the others part."""
    from benchmarks.common import teacher_forced_logits
    from benchmarks.workloads import PROBE_PROMPTS, get_workload
    from engine.config import EngineConfig, SamplingParams
    from engine.engine import LLMEngine

    def engine(weights: str, kv: str) -> LLMEngine:
        return LLMEngine(EngineConfig(weights=weights, dtype="float32", kv_cache_dtype=kv,
                                      max_num_seqs=16, max_model_len=512))

    ref = engine("gguf", "float32")
    caches = {kv: engine("gguf-q16", kv) for kv in ("float32", "float16")}
    print(f"float16 KV cache against float32 [{caches['float16'].describe()}], "
          f"against the fp32 model [{ref.describe()}]")
    greedy = SamplingParams(max_tokens=forced_tokens, temperature=0.0)
    rel = {kv: [] for kv in caches}
    agree = dict.fromkeys(caches, 0)
    positions, max_k, max_v = 0, 0.0, 0.0
    for prompt in prompts or PROBE_PROMPTS:
        ids = ref.tokenize(prompt)
        ids = ids + ref.generate([ids], greedy)[0].token_ids
        want = teacher_forced_logits(ref, ids)
        blocks = -(-len(ids) // ref.config.block_size)
        for k_cache, v_cache in ref.pool.layers:  # blocks 0 .. blocks - 1 hold these positions
            max_k = max(max_k, k_cache[:blocks].abs().max().item())
            max_v = max(max_v, v_cache[:blocks].abs().max().item())
        for kv, eng in caches.items():
            got = teacher_forced_logits(eng, ids)
            rel[kv].append(((got - want).norm(dim=-1) / want.norm(dim=-1)).mean().item())
            agree[kv] += int((got.argmax(-1) == want.argmax(-1)).sum())
        positions += len(ids)
    items = get_workload("longtail", n=answers).items
    params = SamplingParams(max_tokens=answer_tokens, temperature=0.0, ignore_eos=True)
    outs = {kv: [o.token_ids for o in eng.generate([it.prompt for it in items], params)]
            for kv, eng in caches.items()}
    parts = [next(i for i, (a, b) in enumerate(zip(x, y)) if a != b)
             for x, y in zip(outs["float32"], outs["float16"]) if x != y]
    out = {"positions": positions, "max_abs_k": max_k, "max_abs_v": max_v,
           "answers": len(items), "answer_tokens": answer_tokens,
           "identical_answers": len(items) - len(parts), "first_difference_at": parts}
    for kv in caches:
        out[f"logits_rel_{kv}"] = [min(rel[kv]), max(rel[kv])]
        out[f"same_argmax_{kv}"] = agree[kv]
        print(f"  KV cache {kv}: logits {100 * min(rel[kv]):.3f}-{100 * max(rel[kv]):.3f}% of "
              f"their norm from the fp32 model's; its next token at {agree[kv]} of "
              f"{positions} positions")
    print(f"  largest |K| {max_k:.1f}, |V| {max_v:.1f}; greedy answers identical: "
          f"{out['identical_answers']} of {len(items)} ({answer_tokens} tokens; the others "
          f"part at token {', '.join(map(str, parts)) or '-'})", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    from benchmarks.common import write_json
    from engine.config import EngineConfig
    from engine.engine import LLMEngine

    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernel_bench")
    ap.add_argument("--weights", action="store_true",
                    help="dense bf16 vs GGUF weights on every matmul path (batch 1, long tail)")
    ap.add_argument("--matmuls-only", action="store_true",
                    help="with --weights: only the GGUF per-matmul breakdown (quick)")
    ap.add_argument("--one-thread", action="store_true",
                    help="with --matmuls-only: one torch thread, timed in its CPU time (for a "
                    "shared machine)")
    ap.add_argument("--rows", action="store_true",
                    help="the GGUF matmuls of one step at 1 to 32 rows, per instruction set")
    ap.add_argument("--hot", action="store_true",
                    help="with --rows: one weight kept in cache, on one thread (arithmetic "
                    "only, no memory)")
    ap.add_argument("--attention", action="store_true",
                    help="only the attention kernel: a batch of decodes, prompts, and decodes "
                    "at long contexts split into parts or not")
    ap.add_argument("--kv-cache", action="store_true",
                    help="decode steps with a float32 and a float16 KV cache, in turns")
    ap.add_argument("--kv-quality", action="store_true",
                    help="what the float16 KV cache costs in numbers: logits, next tokens, "
                    "greedy answers, against the float32 cache and the fp32 model")
    ap.add_argument("--json", help="write the --weights, --rows, --attention, --kv-cache or "
                    "--kv-quality results here")
    args = ap.parse_args(argv)
    if args.kv_cache:
        write_json(args.json, "cpu", args, kv_cache=bench_kv_cache())
        return 0
    if args.kv_quality:
        write_json(args.json, "cpu", args, kv_quality=kv_cache_quality())
        return 0
    if args.attention:
        from engine.model.cpu import library

        assert library.load(), "the C++ CPU kernels did not build (see the message above)"
        bench_attention()
        write_json(args.json, "cpu", args, long_decode=bench_long_decode())
        return 0
    if args.rows:
        write_json(args.json, "cpu", args, gguf_rows=bench_gguf_rows(hot=args.hot))
        return 0
    if args.weights:
        write_json(args.json, "cpu", args, **bench_weights(only_matmuls=args.matmuls_only,
                                                          one_thread=args.one_thread))
        return 0
    engine = LLMEngine(EngineConfig(dtype="bfloat16", max_num_seqs=16, max_model_len=512))
    print(f"[{engine.describe()}]")
    bench_matmuls(engine.model)
    bench_attention()
    bench_long_decode()
    bench_layer_loop(engine)
    bench_invariance_cost(engine)
    return 0


if __name__ == "__main__":
    spin_openmp_threads("benchmarks.kernel_bench")
    sys.exit(main())
