"""Fused per-layer ops for the GPU path: RMSNorm (with the residual add), RoPE and SwiGLU.

Each is one Triton kernel where PyTorch runs three to eight operators (each a kernel launch and a
round trip through memory): a decode step of a small model is bound by launches, not arithmetic.
They compute what the engine's torch ops compute (engine/model/llama.py: `rms_norm`,
`add_rms_norm`, `apply_rope`, `silu_mul`, the references they are tested against), with the
same roundings: fp32 inside where torch computes in fp32, and every intermediate that torch rounds
to the activation dtype (bf16/fp16) rounded to it here too, at the same point.

The engine's `LayerOps` made of them is `engine.model.llama.triton_ops()` (this module imports
nothing of the engine); the execution plan picks it on CUDA only (engine/plan.py, `fused_ops`),
never on a CPU, where the C++ kernels do the same work.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from servelab_kernels._common import check_device, next_pow2


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [rows, N] input (the residual stream h when ADD)
    d_ptr,  # [rows, N] delta added to x first (ADD), else unused
    w_ptr,  # [N] norm weight
    out_ptr,  # [rows, N] weight * normalized, written
    sum_ptr,  # [rows, N] x + delta, written (ADD), else unused
    stride_x,  # elements between rows of x (the last dim is contiguous)
    stride_d,
    eps,
    N: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ADD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < N
    dt = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if ADD:
        d = tl.load(d_ptr + row * stride_d + offs, mask=mask, other=0.0)
        # h + delta in the activation dtype, as torch adds two tensors of that dtype
        x = (x.to(tl.float32) + d.to(tl.float32)).to(dt)
        tl.store(sum_ptr + row * N + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    # normalized in fp32, rounded to the dtype, then times the weight (rounded again)
    y = (xf * inv).to(dt).to(tl.float32) * tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * N + offs, y.to(dt), mask=mask)


@triton.jit
def _rope_kernel(
    x_ptr,  # [tokens, heads, D] (heads may be a view of the fused qkv rows: any token stride)
    cos_ptr,  # [tokens, D] cos of each token's position
    sin_ptr,  # [tokens, D] sin with its first half negated (rotate_half's sign folded in)
    out_ptr,  # [tokens, heads, D] contiguous, written
    stride_xt,  # x: elements between tokens
    stride_xh,  # x: elements between heads (the last dim is contiguous)
    stride_ct,  # cos / sin: elements between tokens
    HEADS: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D)
    # x.roll(D // 2): element j takes x[(j + D/2) % D]
    rolled = (offs_d + D // 2) % D
    mask = offs_h[:, None] < HEADS
    base = x_ptr + tok * stride_xt + offs_h[:, None] * stride_xh
    dt = out_ptr.dtype.element_ty
    x = tl.load(base + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    xs = tl.load(base + rolled[None, :], mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_ptr + tok * stride_ct + offs_d).to(tl.float32)
    s = tl.load(sin_ptr + tok * stride_ct + offs_d).to(tl.float32)
    # x * cos and swapped * sin each rounded to the dtype, then their sum (torch's three ops)
    a = (x * c[None, :]).to(dt).to(tl.float32)
    b = (xs * s[None, :]).to(dt).to(tl.float32)
    tl.store(out_ptr + tok * HEADS * D + offs_h[:, None] * D + offs_d[None, :], (a + b).to(dt),
             mask=mask)


@triton.jit
def _silu_mul_kernel(
    gu_ptr,  # [rows, 2 * N]: gate then up
    out_ptr,  # [rows, N] silu(gate) * up, written
    stride_gu,  # elements between rows of gate_up
    N: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    dt = out_ptr.dtype.element_ty
    g = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + N + offs, mask=mask, other=0.0).to(tl.float32)
    # silu in fp32 rounded to the dtype (torch's silu on bf16/fp16), then the product
    act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    tl.store(out_ptr + row * N + offs, (act * u).to(dt), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with a contiguous last dim (a view where it can be)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1])


def rms_norm_meta(n: int, add: bool) -> dict:
    """Constexprs and launch options of `_rms_norm_kernel`
    (also benchmarks/gpu/compile_check.py)."""
    return dict(N=n, BLOCK_N=next_pow2(n), ADD=add,
                num_warps=1 if n <= 256 else (4 if n <= 2048 else 8))


def rope_meta(heads: int, d: int) -> dict:
    """Constexprs and launch options of `_rope_kernel`
    (also benchmarks/gpu/compile_check.py)."""
    return dict(HEADS=heads, D=d, BLOCK_H=next_pow2(heads),
                num_warps=1 if heads * d <= 1024 else 4)


SILU_BLOCK = 1024  # columns per program: a row of a large MLP spreads over several programs


def silu_mul_meta(n: int) -> dict:
    """Constexprs and launch options of `_silu_mul_kernel`
    (also benchmarks/gpu/compile_check.py)."""
    return dict(N=n, BLOCK=min(SILU_BLOCK, next_pow2(n)), num_warps=4)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * RMSNorm(x) over the last dim; x: [..., N]. llama.py's `rms_norm`, one kernel."""
    check_device(x)
    x2 = _rows(x)
    n = x2.shape[-1]
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, x2, weight, out, out, x2.stride(0), x2.stride(0),
                                         eps, **rms_norm_meta(n, add=False))
    return out.view(x.shape)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(h + delta, weight * RMSNorm(h + delta)): llama.py's `add_rms_norm`, one kernel."""
    check_device(h)
    if h.shape != delta.shape or h.dtype != delta.dtype:
        raise ValueError(f"add_rms_norm: h {tuple(h.shape)} {h.dtype} and delta "
                         f"{tuple(delta.shape)} {delta.dtype} must match")
    h2, d2 = _rows(h), _rows(delta)
    n = h2.shape[-1]
    out = torch.empty(h2.shape, dtype=h.dtype, device=h.device)
    total = torch.empty(h2.shape, dtype=h.dtype, device=h.device)
    if h2.shape[0]:
        _rms_norm_kernel[(h2.shape[0],)](h2, d2, weight, out, total, h2.stride(0), d2.stride(0),
                                         eps, **rms_norm_meta(n, add=True))
    return total.view(h.shape), out.view(h.shape)


def rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """llama.py's `apply_rope`, one kernel. x: [tokens, heads, D] (a strided view is fine);
    cos, sin_signed: [tokens, 1, D]. Returns a new contiguous [tokens, heads, D]."""
    check_device(x)
    t, heads, d = x.shape
    if d != next_pow2(d) or d % 2:
        raise ValueError(f"rope: head_dim must be an even power of two, got {d}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos2, sin2 = cos.reshape(t, d), sin_signed.reshape(t, d)
    if cos2.stride(-1) != 1 or cos2.stride() != sin2.stride():
        cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    out = torch.empty((t, heads, d), dtype=x.dtype, device=x.device)
    if t:
        _rope_kernel[(t,)](x, cos2, sin2, out, x.stride(0), x.stride(1), cos2.stride(0),
                           **rope_meta(heads, d))
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up on the fused [gate; up] rows: llama.py's `silu_mul`, one kernel."""
    check_device(gate_up)
    gu = _rows(gate_up)
    if gu.shape[-1] % 2:
        raise ValueError(f"silu_mul: the last dim holds gate and up, got odd {gu.shape[-1]}")
    n = gu.shape[-1] // 2
    out = torch.empty((gu.shape[0], n), dtype=gate_up.dtype, device=gate_up.device)
    meta = silu_mul_meta(n)
    if gu.shape[0]:
        _silu_mul_kernel[(gu.shape[0], triton.cdiv(n, meta["BLOCK"]))](gu, out, gu.stride(0),
                                                                       **meta)
    return out.view(*gate_up.shape[:-1], n)

