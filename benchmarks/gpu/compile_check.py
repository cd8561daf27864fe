"""Compile every paged-attention kernel for a GPU target without a GPU, and report its resources.

The interpreter (TRITON_INTERPRET=1) checks what the kernels compute, not whether they compile:
a kernel can interpret fine and still fail in Triton's GPU compiler, or spill registers. This
module compiles the same specialisations the wrappers launch (constexprs from the *_meta helpers,
pointer and stride arguments marked 16-divisible as the launcher marks them) for CUDA sm_90
(Hopper, the H200 the benchmark targets) and reads registers, spill stack and shared memory off
the cubin with the cuobjdump that ships inside Triton's wheel.

    python -m benchmarks.gpu.compile_check            # table on stdout, exit 1 if one fails
    python -m benchmarks.gpu.compile_check --json F   # the same as JSON

It must run without TRITON_INTERPRET (kernels decorated under the interpreter cannot be compiled).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

SIG_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# (num_heads, num_kv_heads, head_dim): the bundled SmolLM2-135M and a 7B-class GQA layout
LAYOUTS = [(9, 3, 64), (32, 8, 128)]
LAUNCH_OPTIONS = ("num_warps", "num_stages")


def _compile(fn, ptr_types: dict, meta: dict, capability: int):
    """Compile `fn` with the given pointer element types and constexprs for cuda:capability."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {k: v for k, v in meta.items() if k not in LAUNCH_OPTIONS}
    options = {k: v for k, v in meta.items() if k in LAUNCH_OPTIONS}
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in ptr_types:
            sig[name] = ptr_types[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("scale_log2", "eps"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name.startswith("stride"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", capability, 32), options=options)


def _resources(kernel) -> dict:
    """Registers, spill stack and shared memory of a compiled kernel (cuobjdump on its cubin)."""
    import triton

    res = {"shared_bytes": int(getattr(kernel.metadata, "shared", 0))}
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool) or "cubin" not in kernel.asm:
        return res
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(kernel.asm["cubin"])
        text = subprocess.run(
            [tool, "--dump-resource-usage", path], capture_output=True, text=True, timeout=60
        ).stdout
    for key, name in (("REG", "registers"), ("STACK", "stack_bytes")):
        m = re.search(rf"\b{key}:(\d+)", text)
        if m:
            res[name] = int(m.group(1))
    return res


def cases(layouts=LAYOUTS, dtypes=(torch.bfloat16, torch.float16, torch.float32)):
    """(label, kernel, pointer types, meta) for every specialisation the wrappers launch."""
    from servelab_kernels.decode_attention import (
        _decode_combine_kernel,
        _decode_split_kernel,
        combine_kernel_meta,
        split_kernel_meta,
    )
    from servelab_kernels.extend_attention import _extend_kernel, extend_kernel_meta
    from servelab_kernels.fused_ops import (
        _rms_norm_kernel,
        _rope_kernel,
        _silu_mul_kernel,
        rms_norm_meta,
        rope_meta,
        silu_mul_meta,
    )
    from servelab_kernels.store_kv import _store_kv_kernel, store_kernel_meta

    block_size = 16
    for h, kvh, d in layouts:
        for dtype in dtypes:
            t = SIG_DTYPE[dtype]
            ptrs = {
                "q_ptr": f"*{t}",
                "k_cache_ptr": f"*{t}",
                "v_cache_ptr": f"*{t}",
                "out_ptr": f"*{t}",
                "block_tables_ptr": "*i32",
                "seq_lens_ptr": "*i32",
                "query_start_loc_ptr": "*i32",
                "mid_o_ptr": "*fp32",
                "mid_lse_ptr": "*fp32",
                "k_ptr": f"*{t}",
                "v_ptr": f"*{t}",
                "slot_mapping_ptr": "*i64",
                # the fused per-layer ops (fused_ops.py)
                **{name: f"*{t}" for name in ("x_ptr", "d_ptr", "w_ptr", "sum_ptr", "cos_ptr",
                                              "sin_ptr", "gu_ptr")},
            }
            tag = f"{h}q{kvh}kv{d} {t}"
            yield f"store_kv {tag}", _store_kv_kernel, ptrs, store_kernel_meta(kvh, d, block_size)
            for direct in (True, False):
                meta = split_kernel_meta(h, kvh, d, block_size, dtype, direct=direct)
                yield f"decode_split direct={direct} {tag}", _decode_split_kernel, ptrs, meta
            yield f"decode_combine {tag}", _decode_combine_kernel, ptrs, combine_kernel_meta(d, 64)
            for q_len in (5, 512):  # speculative verification, prefill chunk
                meta = extend_kernel_meta(h, kvh, d, block_size, dtype, q_len)
                yield f"extend q_len={q_len} {tag}", _extend_kernel, ptrs, meta
            # the model's per-layer ops at this layout's sizes (hidden = heads x head_dim, the
            # MLP four times wider)
            for add in (False, True):
                yield (f"rms_norm add={add} {tag}", _rms_norm_kernel, ptrs,
                       rms_norm_meta(h * d, add))
            yield f"rope {tag}", _rope_kernel, ptrs, rope_meta(h + kvh, d)
            yield f"silu_mul {tag}", _silu_mul_kernel, ptrs, silu_mul_meta(4 * h * d)


def run(capability: int = 90, layouts=LAYOUTS, dtypes=None) -> list[dict]:
    """Compile all cases; one dict per case with ok/error and resources."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: interpreted kernels cannot be compiled")
    dtypes = dtypes or (torch.bfloat16, torch.float16, torch.float32)
    rows = []
    for label, fn, ptrs, meta in cases(layouts, dtypes):
        t0 = time.perf_counter()
        row = {"kernel": label, "meta": {k: v for k, v in meta.items()}}
        try:
            row.update(_resources(_compile(fn, ptrs, meta, capability)), ok=True)
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            row.update(ok=False, error=f"{type(e).__name__}: {str(e)[-2000:]}")
        row["compile_s"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capability", type=int, default=90, help="CUDA compute capability x10")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], action="append")
    args = ap.parse_args(argv)
    names = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    dtypes = [names[d] for d in args.dtype] if args.dtype else None
    rows = run(args.capability, dtypes=dtypes)
    for r in rows:
        if r["ok"]:
            print(
                f"{r['kernel']:<44} ok  regs={r.get('registers', '?'):>3} "
                f"spill={r.get('stack_bytes', '?'):>4}B smem={r['shared_bytes']:>6}B "
                f"({r['compile_s']}s)"
            )
        else:
            print(f"{r['kernel']:<44} FAILED {r['error'][:300]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
