"""GPU benchmark of the paged-attention kernels, then of the whole engine.

    python -m kernels.bench --out DIR          # needs CUDA; about 5-7 minutes on one H200

What it does, in order, writing DIR/kernels.json after every section (so a run cut short still
leaves what it measured):

 1. environment: GPU, compute capability, multiprocessors, torch / triton / CUDA versions
 2. copy bandwidth: a 1 GiB device-to-device tensor copy timed with triton.testing.do_bench
    (median); bytes read + written / time. This is the practical ceiling for the kernels below,
    which are memory-bound (PagedAttention, Kwon et al., vLLM 2023; flash-decoding, Dao et al.
    2023: decode attention reads every cached K/V byte once per step and does little math).
 3. correctness on the device: every kernel against its torch reference (kernels/*_ref) and the
    Triton backend against engine.model.attention.TorchAttention, for fp32 / fp16 / bf16, the
    bundled model's heads (9q/3kv/64) and a 7B-class layout (32q/8kv/128)
 4. timings (bf16, block size 16, shuffled blocks) at batch x context sizes for both layouts:
    decode (split-K + combine), speculative verification (extend, 5 query tokens per request),
    prefill chunks (extend), the KV store, and the torch reference backend for comparison.
    Achieved bandwidth = (K/V bytes read + q and out bytes) / median time, printed next to the
    copy bandwidth.
 5. a small launch-parameter sweep (tile sizes, warps, pipeline stages) for decode and extend
 6. `python -m benchmarks.bench --json DIR/engine.json --concurrency 1,4,16,64,256` as a subprocess
    with the time that is left; its failure is recorded, never raised

Without CUDA it exits with status 2 and a message. `--dry-run-cpu` runs every section on tiny
shapes through the Triton interpreter with a wall-clock timer: it checks this script, not speed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE_CONCURRENCY = "1,4,16,64,256"

# (name, num_heads, num_kv_heads, head_dim)
LAYOUTS = [("7b-32q8kv128", 32, 8, 128), ("smollm2-9q3kv64", 9, 3, 64)]
BATCHES = [1, 4, 16, 64, 256]
CONTEXTS = [128, 512, 1024, 4096]
# prefill chunks: (batch, query tokens per request, context after the chunk)
PREFILLS = [(1, 512, 512), (1, 2048, 2048), (1, 512, 4096), (8, 512, 2048), (4, 4096, 4096)]
STORE_TOKENS = [1, 16, 256, 4096, 16384]
VERIFY_Q = 5  # [last, *draft] with 4 draft tokens
BLOCK_SIZE = 16


class Bench:
    """Timing, byte counting and the JSON report, on CUDA or (dry run) on the CPU interpreter."""

    def __init__(self, out_dir: str, dry_run: bool, budget_s: float, kernel_budget_s: float):
        import torch

        self.torch = torch
        self.out_dir = out_dir
        self.dry = dry_run
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.kernel_budget_s = kernel_budget_s
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.path = os.path.join(out_dir, "kernels.json")
        self.report: dict = {
            "what": "ServeLab paged-attention Triton kernels: correctness, timings, bandwidth",
            "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "dry_run_cpu": dry_run,
            "units": {
                "ms": "median milliseconds per call (triton.testing.do_bench)",
                "GBps": "1e9 bytes per second: bytes read + written / time",
                "TFLOPs": "1e12 floating-point operations per second (2 per multiply-add)",
                "rel_err": "max |out - ref| / max |ref|",
            },
        }

    # ---- bookkeeping -------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def kernel_time_left(self) -> bool:
        return self.elapsed() < self.kernel_budget_s

    def out_of_time(self, skipped: list, what: str) -> bool:
        """True once the kernel time budget is spent, with `what` then noted in `skipped`."""
        if self.kernel_time_left():
            return False
        skipped.append(what)
        return True

    def save(self) -> None:
        self.report["elapsed_s"] = round(self.elapsed(), 1)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.report, f, indent=1, default=str)
        os.replace(tmp, self.path)

    def section(self, name: str, fn) -> None:
        """Run one section; record its result or its error, save, never raise."""
        print(f"\n== {name} (t={self.elapsed():.0f}s)", flush=True)
        t = time.perf_counter()
        try:
            self.report[name] = fn()
        except Exception as e:  # noqa: BLE001 - the run is unattended: record and go on
            traceback.print_exc()
            self.report[name] = {"error": f"{type(e).__name__}: {e}", "trace": _tail(e)}
        if isinstance(self.report[name], dict):
            self.report[name]["section_s"] = round(time.perf_counter() - t, 1)
        self.save()
        if not self.dry:
            self.torch.cuda.empty_cache()

    # ---- measuring ---------------------------------------------------------------------------
    def ms(self, fn, rep: int = 50, warmup: int = 10) -> float:
        """Median milliseconds per call."""
        torch = self.torch
        if self.dry:
            fn()
            times = []
            for _ in range(3):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            return sorted(times)[1]
        import triton.testing

        torch.cuda.synchronize()
        try:
            return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
        except TypeError:  # older triton without return_mode
            return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])[0])

    def graph_ms(self, fn) -> float | None:
        """Median ms per call replayed from a CUDA graph (no launch overhead); None if it fails."""
        if self.dry:
            return None
        import triton.testing

        try:
            return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))
        except Exception as e:  # noqa: BLE001
            print(f"   (cuda graph timing failed: {type(e).__name__}: {e})", flush=True)
            return None


def _tail(e: BaseException, n: int = 3000) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))[-n:]


def _gbps(nbytes: float, ms: float) -> float:
    return round(nbytes / (ms * 1e-3) / 1e9, 1) if ms and ms > 0 else float("nan")


# ---------------------------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------------------------
def env_info(b: Bench) -> dict:
    torch = b.torch
    import triton

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "torch_cuda": torch.version.cuda,
        "host": platform.node(),
    }
    if not b.dry:
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=p.name,
            capability=f"{p.major}.{p.minor}",
            multiprocessors=p.multi_processor_count,
            memory_gib=round(p.total_memory / 2**30, 1),
            l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
        )
    for k, v in info.items():
        print(f"   {k}: {v}")
    return info


def copy_bandwidth(b: Bench) -> dict:
    torch = b.torch
    nbytes = (1 << 20) if b.dry else (1 << 30)
    x = torch.randn(nbytes // 2, device=b.device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    ms = b.ms(lambda: y.copy_(x), rep=100)
    res = {"bytes_copied": nbytes, "ms": round(ms, 4), "GBps": _gbps(2 * nbytes, ms)}
    print(f"   device-to-device copy of {nbytes / 2**30:.2f} GiB: {ms:.3f} ms, "
          f"{res['GBps']} GB/s (read + write)", flush=True)
    b.copy_gbps = res["GBps"]
    return res


def _paged_case(b: Bench, layout, dtype, seq_lens, q_lens, block_size=BLOCK_SIZE, seed=0):
    """Random pool with shuffled blocks; returns tensors and host lists for one step."""
    torch = b.torch
    _, h, kvh, d = layout
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + 3
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, i = [], 0
    for nb in need:
        tables.append(perm[i : i + nb])
        i += nb
    shape = (num_blocks, block_size, kvh, d)
    kc = torch.randn(shape, generator=g).to(dtype).to(b.device)
    vc = torch.randn(shape, generator=g).to(dtype).to(b.device)
    t = sum(q_lens)
    q = torch.randn((t, h, d), generator=g).to(dtype).to(b.device)
    slots = []
    for (ql, n), row in zip(zip(q_lens, seq_lens), tables):
        for pos in range(n - ql, n):
            slots.append(row[pos // block_size] * block_size + pos % block_size)
    return kc, vc, q, tables, slots


def correctness(b: Bench) -> dict:
    torch = b.torch
    from engine.model.attention import TorchAttention, build_metadata
    from kernels.backend import TritonAttention
    from kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
    from kernels.extend_attention import paged_extend_attention, paged_extend_attention_ref
    from kernels.store_kv import store_kv, store_kv_ref

    def rel(o, r):
        o, r = o.float(), r.float()
        return float((o - r).abs().max() / r.abs().max().clamp_min(1e-12))

    tol = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}
    if b.dry:
        dec_lens = [1, 16, 37, 70]
        ext_rows = [(1, 16), (7, 7), (16, 37), (5, 50)]
    else:
        dec_lens = [1, 16, 37, 300, 1025, 4096]
        ext_rows = [(1, 16), (7, 7), (16, 37), (5, 50), (37, 45), (512, 1500), (5, 4096)]
    rows = []

    def record(kernel, layout, dtype, err, nan_free=True, extra=None):
        ok = bool(nan_free and err < tol[dtype])
        row = {"kernel": kernel, "layout": layout[0], "dtype": str(dtype).split(".")[-1],
               "rel_err": err, "tol": tol[dtype], "fully_written": nan_free, "ok": ok}
        row.update(extra or {})
        rows.append(row)
        flag = "ok " if ok else "BAD"
        print(f"   {flag} {kernel:<28} {layout[0]:<16} {row['dtype']:<9} rel_err={err:.2e}",
              flush=True)

    for layout in LAYOUTS:
        _, h, kvh, d = layout
        scale = d**-0.5
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            # KV store: fresh tokens in the pool's dtype, with skipped slots
            kc, vc, q, tables, _ = _paged_case(b, layout, dtype, [40, 7], [1, 1], seed=1)
            n_tok = 11
            k = torch.randn((n_tok, kvh, d), device=b.device).to(dtype)
            v = torch.randn((n_tok, kvh, d), device=b.device).to(dtype)
            slots = torch.randperm(kc.shape[0] * BLOCK_SIZE)[:n_tok].to(b.device)
            slots[3] = -1
            a, c = kc.clone(), vc.clone()
            store_kv(a, c, k, v, slots)
            ra, rc = kc.clone(), vc.clone()
            store_kv_ref(ra, rc, k, v, slots)
            exact = bool(torch.equal(a, ra) and torch.equal(c, rc))
            record("store_kv", layout, dtype, 0.0 if exact else 1.0, extra={"exact": exact})

            # decode: automatic split plan, and a forced 7-way split (combine kernel)
            kc, vc, q, tables, _ = _paged_case(b, layout, dtype, dec_lens, [1] * len(dec_lens))
            width = max(len(t) for t in tables)
            bt = torch.zeros((len(tables), width), dtype=torch.int32)
            for i, t in enumerate(tables):
                bt[i, : len(t)] = torch.tensor(t, dtype=torch.int32)
            bt = bt.to(b.device)
            sl = torch.tensor(dec_lens, dtype=torch.int32, device=b.device)
            ref = paged_decode_attention_ref(q, kc, vc, bt, sl, scale)
            for splits in (None, 7):
                out = torch.full_like(q, float("nan"))
                paged_decode_attention(q, kc, vc, bt, sl, scale, out, max_seq_len=max(dec_lens),
                                       num_splits=splits)
                name = "decode(auto splits)" if splits is None else "decode(7 splits)"
                record(name, layout, dtype, rel(out, ref), not bool(out.isnan().any()))

            # extend: decode row, whole prompt, chunk over a prefix, verification rows
            s_lens = [n for _, n in ext_rows]
            q_lens = [ql for ql, _ in ext_rows]
            kc, vc, q, tables, slots = _paged_case(b, layout, dtype, s_lens, q_lens, seed=2)
            meta = build_metadata(q_lens, s_lens, tables, slots, BLOCK_SIZE, device=b.device)
            ref = paged_extend_attention_ref(
                q, kc, vc, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale
            )
            out = torch.full_like(q, float("nan"))
            paged_extend_attention(q, kc, vc, meta.block_tables, meta.seq_lens,
                                   meta.query_start_loc, scale, out,
                                   max_query_len=max(q_lens))
            record("extend", layout, dtype, rel(out, ref), not bool(out.isnan().any()))

            # backend against the engine's torch backend: mixed step, then decode-only step
            for label, qls in (("backend mixed", q_lens), ("backend decode", [1] * len(q_lens))):
                kc, vc, q, tables, slots = _paged_case(b, layout, dtype, s_lens, qls, seed=3)
                kn = torch.randn((q.shape[0], kvh, d), device=b.device).to(dtype)
                vn = torch.randn((q.shape[0], kvh, d), device=b.device).to(dtype)
                meta_t = build_metadata(qls, s_lens, tables, slots, BLOCK_SIZE, device=b.device)
                meta_x = build_metadata(qls, s_lens, tables, slots, BLOCK_SIZE, device=b.device)
                kt, vt, kx, vx = kc.clone(), vc.clone(), kc.clone(), vc.clone()
                TorchAttention().store_kv(kt, vt, kn, vn, meta_t)
                TritonAttention().store_kv(kx, vx, kn, vn, meta_x)
                same_pool = bool(torch.equal(kt, kx) and torch.equal(vt, vx))
                ref = TorchAttention().forward(q, kt, vt, meta_t, scale)
                out = TritonAttention().forward(q, kx, vx, meta_x, scale)
                record(label + " vs torch", layout, dtype, rel(out, ref),
                       not bool(out.isnan().any()) and same_pool, {"pools_equal": same_pool})
    if not b.dry:
        torch.cuda.synchronize()
    all_ok = all(r["ok"] for r in rows)
    print(f"   correctness: {'ALL OK' if all_ok else 'FAILURES'} ({len(rows)} checks)", flush=True)
    return {"all_ok": all_ok, "checks": rows}


def _pool(b: Bench, layout, num_blocks, dtype):
    torch = b.torch
    _, h, kvh, d = layout
    shape = (num_blocks, BLOCK_SIZE, kvh, d)
    kc = torch.randn(shape, device=b.device, dtype=dtype)
    vc = torch.randn(shape, device=b.device, dtype=dtype)
    return kc, vc


def _uniform_batch(b: Bench, batch, ctx, num_blocks):
    """`batch` requests of `ctx` tokens each, on distinct random blocks of a num_blocks pool.

    Returns (block_tables [batch, cdiv(ctx, BLOCK_SIZE)] int32, seq_lens [batch] int32 = ctx).
    """
    torch = b.torch
    nb = -(-ctx // BLOCK_SIZE)
    perm = torch.randperm(num_blocks, device=b.device)[: batch * nb]
    bt = perm.view(batch, nb).to(torch.int32).contiguous()
    return bt, torch.full((batch,), ctx, dtype=torch.int32, device=b.device)


def timings(b: Bench) -> dict:
    torch = b.torch
    from engine.model.attention import AttentionMetadata, TorchAttention
    from kernels.decode_attention import choose_splits, paged_decode_attention
    from kernels.extend_attention import paged_extend_attention
    from kernels.store_kv import store_kv

    dtype = torch.bfloat16
    es = 2  # bytes per bf16 element
    copy = getattr(b, "copy_gbps", None)
    batches, contexts = BATCHES, CONTEXTS
    prefills, store_tokens = PREFILLS, STORE_TOKENS
    if b.dry:
        batches, contexts = [1, 3], [16, 48]
        prefills, store_tokens = [(1, 16, 16), (2, 8, 40)], [1, 7]
    res = {"dtype": "bf16", "block_size": BLOCK_SIZE, "copy_GBps": copy, "decode": [],
           "verify": [], "prefill": [], "store_kv": [], "skipped": []}

    def frac(gbps):
        return round(gbps / copy, 3) if copy else None

    hdr = f"   {'layout':<16} {'batch':>5} {'ctx':>5} {'kernel':<8} {'ms':>8} {'GB/s':>7}"
    print(hdr + f" {'of copy':>7} {'torch ms':>9} {'graph ms':>9}", flush=True)

    def torch_meta(bt, sl, q_len, ctx, batch):
        qsl = torch.arange(batch + 1, device=b.device, dtype=torch.int32) * q_len
        return AttentionMetadata(
            slot_mapping=torch.empty(0, dtype=torch.int64, device=b.device),
            query_start_loc=qsl, seq_lens=sl, block_tables=bt, block_size=BLOCK_SIZE,
            query_lens=[q_len] * batch, seq_lens_host=[ctx] * batch,
        )

    def torch_ms(q, kc, vc, meta, scale):
        try:
            be = TorchAttention()
            be.forward(q, kc, vc, meta, scale)  # builds and caches the gather plan
            return round(b.ms(lambda: be.forward(q, kc, vc, meta, scale), rep=30), 4)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory for the padded gather
            print(f"   (torch backend failed: {type(e).__name__}: {str(e)[:120]})", flush=True)
            return None
        finally:
            meta._cache.clear()

    for layout in LAYOUTS:
        name, h, kvh, d = layout
        scale = d**-0.5
        num_blocks = max(batches) * (-(-max(contexts) // BLOCK_SIZE)) + 8
        kc, vc = _pool(b, layout, num_blocks, dtype)
        kv_token_bytes = 2 * kvh * d * es  # K and V of one token, all KV heads
        for batch in batches:
            for ctx in contexts:
                if b.out_of_time(res["skipped"], f"{name} batch={batch} ctx={ctx}"):
                    continue
                try:
                    bt, sl = _uniform_batch(b, batch, ctx, num_blocks)
                    table_bytes = bt.numel() * 4 + batch * 4

                    # decode: one query token per request
                    q = torch.randn((batch, h, d), device=b.device, dtype=dtype)
                    out = torch.empty_like(q)
                    ws: dict = {}

                    def dec(q=q, kc=kc, vc=vc, bt=bt, sl=sl, out=out, ws=ws, ctx=ctx, scale=scale):
                        paged_decode_attention(q, kc, vc, bt, sl, scale, out, max_seq_len=ctx,
                                               workspace=ws)

                    ms = b.ms(dec)
                    nbytes = batch * ctx * kv_token_bytes + 2 * q.numel() * es + table_bytes
                    splits, split_len = choose_splits(batch, kvh, ctx, 64, q.device)
                    t_ms = torch_ms(q, kc, vc, torch_meta(bt, sl, 1, ctx, batch), scale)
                    g_ms = b.graph_ms(dec)
                    row = {"layout": name, "batch": batch, "ctx": ctx, "ms": round(ms, 4),
                           "bytes": nbytes, "GBps": _gbps(nbytes, ms),
                           "frac_of_copy": frac(_gbps(nbytes, ms)), "num_splits": splits,
                           "split_len": split_len, "torch_ms": t_ms,
                           "graph_ms": None if g_ms is None else round(g_ms, 4)}
                    res["decode"].append(row)
                    _print_row(row, "decode")

                    # speculative verification: VERIFY_Q query tokens per request
                    qv = torch.randn((batch * VERIFY_Q, h, d), device=b.device, dtype=dtype)
                    outv = torch.empty_like(qv)
                    meta = torch_meta(bt, sl, VERIFY_Q, ctx, batch)
                    qsl = meta.query_start_loc

                    def ver(qv=qv, kc=kc, vc=vc, bt=bt, sl=sl, qsl=qsl, outv=outv, scale=scale):
                        paged_extend_attention(qv, kc, vc, bt, sl, qsl, scale, outv,
                                               max_query_len=VERIFY_Q)

                    ms = b.ms(ver)
                    nbytes = batch * ctx * kv_token_bytes + 2 * qv.numel() * es + table_bytes
                    visible = batch * (VERIFY_Q * (ctx - VERIFY_Q) + VERIFY_Q * (VERIFY_Q + 1) // 2)
                    flops = 4 * h * d * visible
                    row = {"layout": name, "batch": batch, "ctx": ctx, "q_len": VERIFY_Q,
                           "ms": round(ms, 4), "bytes": nbytes, "GBps": _gbps(nbytes, ms),
                           "frac_of_copy": frac(_gbps(nbytes, ms)),
                           "TFLOPs": round(flops / (ms * 1e-3) / 1e12, 2),
                           "torch_ms": torch_ms(qv, kc, vc, meta, scale)}
                    res["verify"].append(row)
                    _print_row(row, "verify")
                except Exception as e:  # noqa: BLE001
                    print(f"   {name} batch={batch} ctx={ctx}: {type(e).__name__}: {e}")
                    res["decode"].append({"layout": name, "batch": batch, "ctx": ctx,
                                          "error": f"{type(e).__name__}: {e}"})
        b.save()

        # prefill chunks (extend): compute-bound at long query lengths
        for batch, q_len, ctx in prefills:
            if b.out_of_time(res["skipped"], f"{name} prefill {batch}x{q_len}@{ctx}"):
                continue
            try:
                bt, sl = _uniform_batch(b, batch, ctx, num_blocks)
                qp = torch.randn((batch * q_len, h, d), device=b.device, dtype=dtype)
                outp = torch.empty_like(qp)
                meta = torch_meta(bt, sl, q_len, ctx, batch)

                def pre(qp=qp, kc=kc, vc=vc, bt=bt, sl=sl, qsl=meta.query_start_loc, outp=outp,
                        q_len=q_len, scale=scale):
                    paged_extend_attention(qp, kc, vc, bt, sl, qsl, scale, outp,
                                           max_query_len=q_len)

                ms = b.ms(pre)
                visible = batch * (q_len * (ctx - q_len) + q_len * (q_len + 1) // 2)
                flops = 4 * h * d * visible
                nbytes = batch * ctx * kv_token_bytes + 2 * qp.numel() * es
                row = {"layout": name, "batch": batch, "q_len": q_len, "ctx": ctx,
                       "ms": round(ms, 4), "TFLOPs": round(flops / (ms * 1e-3) / 1e12, 2),
                       "GBps": _gbps(nbytes, ms), "torch_ms": torch_ms(qp, kc, vc, meta, scale)}
                res["prefill"].append(row)
                print(f"   {name:<16} prefill {batch}x{q_len}@{ctx}: {ms:.3f} ms, "
                      f"{row['TFLOPs']} TFLOP/s (torch {row['torch_ms']} ms)", flush=True)
            except Exception as e:  # noqa: BLE001
                res["prefill"].append({"layout": name, "batch": batch, "q_len": q_len,
                                       "ctx": ctx, "error": f"{type(e).__name__}: {e}"})

        # KV store: this step's K/V for n tokens into random slots
        for n in store_tokens:
            if b.out_of_time(res["skipped"], f"{name} store_kv {n}"):
                continue
            k = torch.randn((n, kvh, d), device=b.device, dtype=dtype)
            v = torch.randn_like(k)
            slots = torch.randperm(num_blocks * BLOCK_SIZE, device=b.device)[:n]
            ms = b.ms(lambda k=k, v=v, slots=slots, kc=kc, vc=vc: store_kv(kc, vc, k, v, slots))
            nbytes = 2 * n * kv_token_bytes + n * 8  # read k, v; write them; read slots
            row = {"layout": name, "tokens": n, "ms": round(ms, 4), "GBps": _gbps(nbytes, ms)}
            res["store_kv"].append(row)
            print(f"   {name:<16} store_kv {n:>6} tokens: {ms:.4f} ms, {row['GBps']} GB/s",
                  flush=True)
        kc = vc = None  # free this layout's pools before the next one
        if not b.dry:
            torch.cuda.empty_cache()
        b.save()
    return res


def _print_row(row: dict, kernel: str) -> None:
    f = row.get("frac_of_copy")
    print(
        f"   {row['layout']:<16} {row['batch']:>5} {row['ctx']:>5} {kernel:<8} "
        f"{row['ms']:>8.4f} {row['GBps']:>7} {'' if f is None else f'{f:.0%}':>7} "
        f"{row.get('torch_ms') or '-':>9} {row.get('graph_ms') or '-':>9}",
        flush=True,
    )


def tuning(b: Bench) -> dict:
    """Launch-parameter sweep: which tile sizes / warps / stages suit this GPU best."""
    torch = b.torch
    from kernels.decode_attention import paged_decode_attention
    from kernels.extend_attention import paged_extend_attention

    dtype = torch.bfloat16
    layout = LAYOUTS[0]
    name, h, kvh, d = layout
    scale = d**-0.5
    res = {"layout": name, "dtype": "bf16", "decode": [], "extend": [], "skipped": []}
    if b.dry:
        dec_sizes, ext_sizes = [(2, 48)], [(1, 16, 32)]
        dec_variants = [(16, 4, 2)]
        ext_variants = [(8, 16, 4, 2)]
    else:
        dec_sizes, ext_sizes = [(1, 4096), (64, 4096), (256, 1024)], [(4, 2048, 2048),
                                                                       (64, VERIFY_Q, 4096)]
        dec_variants = [(bn, w, s) for bn in (32, 64, 128) for w in (4, 8) for s in (2, 3)]
        ext_variants = [(bq, bn, w, 2) for bq in (16, 32) for bn in (32, 64) for w in (4, 8)]
    max_ctx = max(c for _, c in dec_sizes + [(0, c) for *_, c in ext_sizes])
    max_batch = max(bb for bb, _ in dec_sizes + [(bb, 0) for bb, *_ in ext_sizes])
    num_blocks = max_batch * (-(-max_ctx // BLOCK_SIZE)) + 8
    kc, vc = _pool(b, layout, num_blocks, dtype)

    def rel(o, r):
        return float((o.float() - r.float()).abs().max() / r.float().abs().max())

    for batch, ctx in dec_sizes:
        bt, sl = _uniform_batch(b, batch, ctx, num_blocks)
        q = torch.randn((batch, h, d), device=b.device, dtype=dtype)
        ref = paged_decode_attention(q, kc, vc, bt, sl, scale, max_seq_len=ctx)
        for bn, w, s in dec_variants:
            if b.out_of_time(res["skipped"], f"decode {batch}x{ctx} bn={bn} w={w} s={s}"):
                continue
            out = torch.empty_like(q)
            ws: dict = {}
            row = {"batch": batch, "ctx": ctx, "block_n": bn, "num_warps": w, "num_stages": s}
            try:
                def fn(q=q, bt=bt, sl=sl, out=out, ws=ws, bn=bn, w=w, s=s, ctx=ctx):
                    paged_decode_attention(q, kc, vc, bt, sl, scale, out, max_seq_len=ctx,
                                           block_n=bn, num_warps=w, num_stages=s, workspace=ws)

                fn()
                row["rel_err_vs_default"] = rel(out, ref)
                row["ms"] = round(b.ms(fn, rep=30), 4)
            except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            res["decode"].append(row)
            print(f"   decode {batch}x{ctx} {bn=} {w=} {s=}: {row.get('ms', row.get('error'))}",
                  flush=True)

    for batch, q_len, ctx in ext_sizes:
        bt, sl = _uniform_batch(b, batch, ctx, num_blocks)
        qsl = torch.arange(batch + 1, device=b.device, dtype=torch.int32) * q_len
        q = torch.randn((batch * q_len, h, d), device=b.device, dtype=dtype)
        ref = paged_extend_attention(q, kc, vc, bt, sl, qsl, scale, max_query_len=q_len)
        for bq, bn, w, s in ext_variants:
            if b.out_of_time(res["skipped"], f"extend {batch}x{q_len}@{ctx} {bq=} {bn=} {w=}"):
                continue
            out = torch.empty_like(q)
            row = {"batch": batch, "q_len": q_len, "ctx": ctx, "block_q": bq, "block_n": bn,
                   "num_warps": w, "num_stages": s}
            try:
                def fn(q=q, bt=bt, sl=sl, qsl=qsl, out=out, bq=bq, bn=bn, w=w, s=s, ql=q_len):
                    paged_extend_attention(q, kc, vc, bt, sl, qsl, scale, out, max_query_len=ql,
                                           block_q=bq, block_n=bn, num_warps=w, num_stages=s)

                fn()
                row["rel_err_vs_default"] = rel(out, ref)
                row["ms"] = round(b.ms(fn, rep=30), 4)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            res["extend"].append(row)
            print(f"   extend {batch}x{q_len}@{ctx} {bq=} {bn=} {w=}: "
                  f"{row.get('ms', row.get('error'))}", flush=True)
    return res


def engine_bench(b: Bench, timeout_s: float | None) -> dict:
    """`python -m benchmarks.bench` in a subprocess with the time left; failures are recorded."""
    path = os.path.join(b.out_dir, "engine.json")
    cmd = [sys.executable, "-m", "benchmarks.bench", "--json", path,
           "--concurrency", ENGINE_CONCURRENCY]
    left = b.budget_s - b.elapsed() - 10
    limit = left if timeout_s is None else min(timeout_s, left)
    res: dict = {"cmd": " ".join(cmd[1:]), "json": path, "timeout_s": round(limit, 1)}
    if limit < 30:
        res.update(ok=False, error=f"skipped: only {left:.0f}s of the time budget left")
        print("   " + res["error"], flush=True)
        return res
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if not b.dry:
        env.pop("TRITON_INTERPRET", None)
    print(f"   $ {' '.join(cmd)}   (timeout {limit:.0f}s)", flush=True)
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=limit)
        res.update(rc=proc.returncode, stdout_tail=proc.stdout[-4000:],
                   stderr_tail=proc.stderr[-4000:])
        res["ok"] = proc.returncode == 0
        if proc.returncode != 0:
            res["error"] = f"benchmarks.bench exited with status {proc.returncode}"
    except subprocess.TimeoutExpired as e:
        res.update(ok=False, error=f"timed out after {limit:.0f}s",
                   stdout_tail=_text(e.stdout)[-4000:], stderr_tail=_text(e.stderr)[-4000:])
    except Exception as e:  # noqa: BLE001
        res.update(ok=False, error=f"{type(e).__name__}: {e}")
    res["wall_s"] = round(time.perf_counter() - t, 1)
    res["json_written"] = os.path.exists(path)
    if res["json_written"]:
        try:
            with open(path) as f:
                res["result"] = json.load(f)
        except Exception as e:  # noqa: BLE001
            res["json_error"] = f"{type(e).__name__}: {e}"
    print(f"   engine bench: {'ok' if res.get('ok') else res.get('error')} "
          f"({res['wall_s']}s)", flush=True)
    if not res.get("ok"):
        print("   stderr tail:\n" + (res.get("stderr_tail") or "")[-1500:], flush=True)
    else:
        print((res.get("stdout_tail") or "")[-2000:], flush=True)
    return res


def _text(x) -> str:
    if x is None:
        return ""
    return x.decode(errors="replace") if isinstance(x, bytes) else x


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kernels.bench",
        description="Check and time the paged-attention Triton kernels on a CUDA GPU, then run "
        "the engine benchmark; results as JSON under --out.",
    )
    ap.add_argument("--out", required=True, help="folder for kernels.json and engine.json")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="whole run, engine bench included (default 450 s = 7.5 min)")
    ap.add_argument("--kernel-budget-s", type=float, default=240.0,
                    help="stop starting new kernel measurements after this many seconds")
    ap.add_argument("--engine-timeout-s", type=float, default=None,
                    help="cap for the engine bench (default: whatever the budget leaves)")
    ap.add_argument("--no-engine", action="store_true", help="skip the engine benchmark")
    ap.add_argument("--no-tuning", action="store_true", help="skip the launch-parameter sweep")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="tiny shapes through the Triton interpreter on CPU (checks the script)")
    args = ap.parse_args(argv)

    if args.dry_run_cpu:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            print("--dry-run-cpu: triton was imported before TRITON_INTERPRET=1 could be set",
                  file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    if not args.dry_run_cpu:
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            print("kernels.bench: unset TRITON_INTERPRET to benchmark on the GPU", file=sys.stderr)
            return 2
        if not torch.cuda.is_available():
            print("kernels.bench needs a CUDA GPU: torch.cuda.is_available() is False "
                  f"(torch {torch.__version__}). Nothing was measured. "
                  "Use --dry-run-cpu to check the script itself on CPU.", file=sys.stderr)
            return 2
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 references stay exact
    try:
        import triton  # noqa: F401
    except ImportError:
        print("kernels.bench needs triton (pip install triton)", file=sys.stderr)
        return 2

    os.makedirs(args.out, exist_ok=True)
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    torch.manual_seed(0)
    b = Bench(args.out, args.dry_run_cpu, args.budget_s, args.kernel_budget_s)
    print(f"kernels.bench -> {b.path} (budget {args.budget_s:.0f}s, kernels "
          f"{args.kernel_budget_s:.0f}s)", flush=True)
    b.section("env", lambda: env_info(b))
    b.section("copy_bandwidth", lambda: copy_bandwidth(b))
    b.section("correctness", lambda: correctness(b))
    b.section("timings", lambda: timings(b))
    if not args.no_tuning:
        b.section("tuning", lambda: tuning(b))
    if args.no_engine:
        b.report["engine"] = {"skipped": "--no-engine"}
    else:
        b.section("engine", lambda: engine_bench(b, args.engine_timeout_s))
    b.report["finished"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    b.save()
    _summary(b)
    corr = b.report.get("correctness", {})
    return 0 if isinstance(corr, dict) and corr.get("all_ok") else 1


def _summary(b: Bench) -> None:
    r = b.report
    print(f"\n== summary (t={b.elapsed():.0f}s) -> {b.path}")
    copy = r.get("copy_bandwidth", {}).get("GBps")
    print(f"   copy bandwidth: {copy} GB/s")
    corr = r.get("correctness", {})
    print(f"   correctness: {'all ok' if corr.get('all_ok') else corr.get('error', 'FAILURES')}")
    dec = [x for x in r.get("timings", {}).get("decode", []) if "GBps" in x]
    if dec:
        best = max(dec, key=lambda x: x["GBps"])
        print(f"   best decode bandwidth: {best['GBps']} GB/s ({best['layout']}, batch "
              f"{best['batch']}, ctx {best['ctx']}; {best['frac_of_copy']} of copy)")
    eng = r.get("engine", {})
    print(f"   engine bench: {'ok' if eng.get('ok') else eng.get('error', eng.get('skipped'))}")
    if math.isfinite(b.elapsed()):
        print(f"   total {b.elapsed():.0f}s")


if __name__ == "__main__":
    sys.exit(main())
