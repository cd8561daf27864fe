"""Time int8 weight-only linear layers against float32 and bfloat16 on this CPU.

    python -m benchmarks.int8_bench [--threads N] [--min-time 0.2]

For SmolLM2-135M's linear shapes (hidden 576, MLP 1536, KV 3 heads x 64 = 192, vocab
49152) and 1..8 rows of activations (a decode step of 1..8 requests or a k-token draft),
prints microseconds per call for each path and the largest absolute error against float32:
`vs fp32` includes the quantization error itself, `vs deq` only the kernel's own rounding.
The last table estimates one decode token's linear layers for the whole 30-layer model.
Weights are random with LLM-like scale (std 0.02), activations unit normal.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from engine.spec.int8 import dequantize_linear_weight, quantize_linear_weight

# (in_features, out_features); the first four are the ones the study asked about
SHAPES = [(576, 576), (576, 1536), (1536, 576), (576, 49152), (576, 192)]
ROWS = [1, 4, 8]
NUM_LAYERS = 30
# per decoder layer: q, o [576, 576]; k, v [576, 192]; gate, up [576, 1536]; down [1536, 576]
LAYER_SHAPES = [(576, 576)] * 2 + [(576, 192)] * 2 + [(576, 1536)] * 2 + [(1536, 576)]
LM_HEAD = (576, 49152)


def _time_us(fn, min_time: float) -> float:
    """Median microseconds per call over blocks of calls lasting min_time in total."""
    for _ in range(3):
        fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    per_block = max(1, int(0.02 / max(once, 1e-7)))  # ~20 ms blocks
    samples = []
    deadline = time.perf_counter() + min_time
    while time.perf_counter() < deadline or len(samples) < 5:
        start = time.perf_counter()
        for _ in range(per_block):
            fn()
        samples.append((time.perf_counter() - start) / per_block)
    samples.sort()
    return samples[len(samples) // 2] * 1e6


def paths(w: torch.Tensor):
    """name -> (function of x [M, in] float32, bytes of weight it reads)."""
    w_bf16 = w.to(torch.bfloat16)
    w_int8, scale = quantize_linear_weight(w)
    scale_bf16 = scale.to(torch.bfloat16)
    int8pack = torch.ops.aten._weight_int8pack_mm
    n_bytes = w.numel()
    return {
        "fp32 matmul": (lambda x: F.linear(x, w), 4 * n_bytes),
        "bf16 matmul": (lambda x: F.linear(x.to(torch.bfloat16), w_bf16), 2 * n_bytes),
        "int8pack_mm fp32": (lambda x: int8pack(x, w_int8, scale), n_bytes),
        "int8pack_mm bf16": (lambda x: int8pack(x.to(torch.bfloat16), w_int8, scale_bf16), n_bytes),
        "dequant, then mm": (lambda x: x @ dequantize_linear_weight(w_int8, scale).T, n_bytes),
        "mm int8.float, * scale": (lambda x: (x @ w_int8.float().T) * scale, n_bytes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--min-time", type=float, default=0.2, help="seconds per measurement")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"{'shape [M,in]x[in,out]':<24}{'path':<24}{'us/call':>10}{'GB/s':>8}"
        f"{'err vs fp32':>13}{'err vs deq':>12}"
    )
    times: dict[tuple[str, int, tuple[int, int]], float] = {}
    for in_f, out_f in SHAPES:
        w = torch.randn(out_f, in_f) * 0.02  # [out, in]
        w_deq = dequantize_linear_weight(*quantize_linear_weight(w))
        for m in ROWS:
            x = torch.randn(m, in_f)  # [M, in]
            y_ref = F.linear(x, w)  # [M, out]
            y_deq = F.linear(x, w_deq)
            for name, (fn, n_bytes) in paths(w).items():
                y = fn(x).float()
                us = _time_us(lambda fn=fn, x=x: fn(x), args.min_time)
                times[(name, m, (in_f, out_f))] = us
                err = (y - y_ref).abs().max().item()
                err_deq = (y - y_deq).abs().max().item()
                print(
                    f"[{m},{in_f}]x[{in_f},{out_f}]".ljust(24) + f"{name:<24}{us:>10.1f}"
                    f"{n_bytes / us / 1e3:>8.1f}{err:>13.2e}{err_deq:>12.2e}"
                )
        print()
    print(f"one decode token's linear layers ({NUM_LAYERS} layers + lm_head), M = 1 and M = 8:")
    for name in paths(torch.zeros(1, 1)):
        totals = []
        for m in (1, 8):
            layer = sum(times[(name, m, s)] for s in LAYER_SHAPES)
            totals.append((NUM_LAYERS * layer + times[(name, m, LM_HEAD)]) / 1e3)
        print(f"  {name:<24}{totals[0]:>8.2f} ms   {totals[1]:>8.2f} ms")


if __name__ == "__main__":
    main()
