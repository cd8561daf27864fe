"""Linear weights laid out once for a CPU matmul, and the matmul reading each layout.

A decode step reads every weight matrix once, so on a CPU its cost is how fast the matmul
streams the weights. Each layout is made once, at model construction, instead of on every
call. The execution plan (engine/plan.py) chooses the layout from the table of them
(engine/model/layouts.py, one row each); this module holds the rows' pack and linear functions:

  "plain"    the loaded [out, in] tensor, `F.linear`: GPUs, fp32 dense weights, and the
             reference (pack_weights=False)
  "amx"      VNNI pairs for our AMX kernel (linear.cpp, `amx_linear`): bf16 on a CPU with AMX
             tiles and the C++ kernels
  "bf16"     the plain bf16 [out, in] tensor, read by our weight-streaming matmul (matmul.cpp:
             AVX-512, AVX2, NEON or portable C++, chosen at run time; batch-invariant)
  "gguf"     the GGUF file's own Q4_1 / Q8_0 rows (engine/model/gguf.py), read by the same
             matmul, which dequantizes them in registers; fp32 arithmetic
  "gguf-q8"  the same bytes regrouped 16 output columns at a time (`pack_q8`), read by the
             int8 kernel (matmul.cpp `matmul_q8`): llama.cpp's arithmetic, the activations
             rounded to int8 per block of 32
  "gguf-q16" the same bytes regrouped 16 columns and 2 q bytes at a time (`pack_q16`), read by
             the int16 kernel (matmul.cpp `matmul_q16`): the activations rounded to int16 per
             block of 32, at most 2^-16 of the block's largest value

Every layout but "plain" gives each row the same bits whatever rows share the call (the
batch-invariance tests hold all of them to that).
"""

from __future__ import annotations

import torch


def vnni_pack(w: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """[N, K] -> [N/16, K/2, 32]: per block of 16 output columns, K/2 rows of 16 (even, odd)
    pairs, the AMX tile layout `torch.ops.servelab.amx_linear` reads (linear.cpp)."""
    n, k = w.shape
    return w.reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).reshape(n // 16, k // 2, 32
                                                                          ).contiguous()


def contiguous(w: torch.Tensor, in_features: int | None = None) -> torch.Tensor:
    """The plain [out, in] tensor, contiguous: the layout "bf16" (matmul.cpp reads it)."""
    return w.contiguous()


def amx_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               ) -> torch.Tensor:
    """F.linear for a weight packed by `vnni_pack`."""
    return torch.ops.servelab.amx_linear(x, w, bias)


def kernel_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  isa: str = "") -> torch.Tensor:
    """F.linear for a bf16 [out, in] weight or GGUF rows, by our matmul (matmul.cpp) on the
    instruction set `isa` (the plan's; "" the widest here), which tells the format from the
    weight's dtype and bytes per row; y in x's dtype."""
    y = torch.ops.servelab.matmul(x, w, "auto", isa)
    return y if bias is None else y + bias


def pack_q8(rows: torch.Tensor, in_features: int) -> torch.Tensor:
    """GGUF Q4_1 / Q8_0 rows [out, bytes] of a layer with in_features inputs -> the same bytes
    in groups of 16 columns, the layout `q8_linear` reads (matmul.cpp pack_q8)."""
    from engine.model.gguf import row_format

    return torch.ops.servelab.pack_q8(rows, row_format(rows, in_features))


def pack_q16(rows: torch.Tensor, in_features: int) -> torch.Tensor:
    """The same regrouping two q bytes at a time, the layout `q16_linear` reads."""
    from engine.model.gguf import row_format

    return torch.ops.servelab.pack_q16(rows, row_format(rows, in_features))


HUGE_PAGE = 2 << 20  # bytes of an x86-64 / AArch64 transparent huge page


def step_order_arena(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `weights` laid back to back, in the order a decode step reads them, in one
    anonymous mapping aligned to 2 MB and advised for transparent huge pages (Linux's
    MADV_HUGEPAGE, where the OS has it). The step then streams one region from start to end:
    each matrix begins where the last one ended, so the CPU's prefetcher, already running
    ahead, has its first lines on the way, and a huge page spares a TLB miss every 4 KB.
    Separate allocations would cost each matmul of a decode step a cold start; the copies are
    the same bytes, so nothing computed changes."""
    import mmap

    align = 64
    sizes = [t.numel() * t.element_size() for t in weights]
    total = sum((n + align - 1) // align * align for n in sizes)
    region = mmap.mmap(-1, total + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # keeps the mapping alive
    at = -raw.data_ptr() % HUGE_PAGE
    out = []
    for t, n in zip(weights, sizes):
        view = raw[at:at + n].view(t.dtype).view(t.shape)
        view.copy_(t)
        out.append(view)
        at += (n + align - 1) // align * align
    return out


def q8_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
              isa: str = "") -> torch.Tensor:
    """F.linear for `pack_q8`ed GGUF weights, x rounded to int8 per block of 32 first."""
    y = torch.ops.servelab.matmul_q8(x, w, "auto", isa)
    return y if bias is None else y + bias


def q16_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               isa: str = "") -> torch.Tensor:
    """F.linear for `pack_q16`ed GGUF weights, x rounded to int16 per block of 32 first."""
    y = torch.ops.servelab.matmul_q16(x, w, "auto", isa)
    return y if bias is None else y + bias

