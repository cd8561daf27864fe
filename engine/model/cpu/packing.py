"""Linear weights laid out once for a CPU matmul, and the matmul reading each layout.

A decode step reads every weight matrix once, so on a CPU its cost is how fast the matmul
streams the weights. Each layout is made once, at model construction, instead of on every call:

  "plain"   the loaded [out, in] tensor, `F.linear` (fp32, or any device)
  "onednn"  oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, what torch.compile's CPU
            "freezing" pass uses), read by oneDNN's AMX / AVX-512 bf16 kernels
  "amx"     VNNI pairs for our AMX kernel (linear.cpp, `amx_linear`): needs the C++ kernels
            and a CPU with AMX tiles
  "bf16"    the plain bf16 [out, in] tensor, read by our weight-streaming matmul (matmul.cpp:
            AVX-512, AVX2 or portable C++, chosen at run time; batch-invariant)
  "gguf"    the GGUF file's own Q4_1 / Q8_0 rows (engine/model/gguf.py), read by the same
            matmul, which dequantizes them in registers (EngineConfig(weights="gguf"))
  "gguf-q8" the same bytes regrouped 16 output columns at a time (`pack_q8`), read by the
            int8 kernel (matmul.cpp `matmul_q8`): llama.cpp's arithmetic, the activations
            rounded to int8 per block of 32 (EngineConfig(weights="gguf-q8"))
  "gguf-q16" the same bytes regrouped 16 columns and 2 q bytes at a time (`pack_q16`), read by
            the int16 kernel (matmul.cpp `matmul_q16`): the activations rounded to int16 per
            block of 32, 2^-16 of the block's largest value at most (EngineConfig(weights=
            "gguf-q16"), the default on CPUs without AMX)

`choose_layout` picks one from the engine's switches and the hardware; README (Performance)
has the measured gains (`python -m benchmarks.kernel_bench`, `python -m benchmarks.bench`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LAYOUTS = ("plain", "onednn", "amx", "bf16", "gguf", "gguf-q8", "gguf-q16")
# layouts the C++ layer loop (ops.cpp decode_layers) reads
CPP_LOOP_LAYOUTS = ("amx", "bf16", "gguf", "gguf-q8", "gguf-q16")
# layouts whose weights are the GGUF file's blocks
GGUF_LAYOUTS = ("gguf", "gguf-q8", "gguf-q16")
# GGUF layouts regrouped 16 columns at a time for an integer kernel -> the activations'
# rounding, as ops.cpp decode_layers names it
GROUPED_ACTIVATIONS = {"gguf-q8": "q8", "gguf-q16": "q16"}
# oneDNN packs for a typical row count; decode batches are a few to a few dozen rows
PACK_ROWS_HINT = 16


def cpu_packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True if this torch's oneDNN has the bf16 packed linear (a CPU, bf16)."""
    return (device.type == "cpu" and dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packed_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  ) -> torch.Tensor:
    """F.linear for a weight packed by `torch.ops.mkldnn._reorder_linear_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, bias, "none", [], "")


def vnni_pack(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N/16, K/2, 32]: per block of 16 output columns, K/2 rows of 16 (even, odd)
    pairs, the AMX tile layout `torch.ops.servelab.amx_linear` reads (linear.cpp)."""
    n, k = w.shape
    return w.reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).reshape(n // 16, k // 2, 32
                                                                          ).contiguous()


def amx_fits(out_features: int, in_features: int) -> bool:
    """The AMX kernel's tiles: 16 output columns, 32 inputs (16 bf16 pairs) at a time."""
    return out_features % 16 == 0 and in_features % 32 == 0


def amx_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               ) -> torch.Tensor:
    """F.linear for a weight packed by `vnni_pack`."""
    return torch.ops.servelab.amx_linear(x, w, bias)


def kernel_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  ) -> torch.Tensor:
    """F.linear for a bf16 [out, in] weight or GGUF rows, by our matmul (matmul.cpp), which
    tells the format from the weight's dtype and bytes per row; y in x's dtype."""
    y = torch.ops.servelab.matmul(x, w)
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


def pack_grouped(layout: str, rows: torch.Tensor, in_features: int) -> torch.Tensor:
    """GGUF rows regrouped for a layout of GROUPED_ACTIVATIONS."""
    return (pack_q16 if layout == "gguf-q16" else pack_q8)(rows, in_features)


HUGE_PAGE = 2 << 20  # bytes of an x86-64 / AArch64 transparent huge page


def step_order_arena(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `weights` laid back to back, in the order a decode step reads them, in one
    anonymous mapping aligned to 2 MB and advised for transparent huge pages (Linux's
    MADV_HUGEPAGE, where the OS has it). The step then streams one region from start to end:
    each matrix begins where the last one ended, so the CPU's prefetcher, already running
    ahead, has its first lines on the way, and a huge page spares a TLB miss every 4 KB.
    As separate allocations the weights cost each of a batch-1 decode step's ~120 int8
    matmuls 4-10 us more than one matmul over them all (a one-off measurement on a Zen 4,
    README, Performance); in the arena, a decode step ran 1.05x as fast (median of 16 paired
    rounds). The copies are the same bytes: nothing computed changes."""
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
              ) -> torch.Tensor:
    """F.linear for `pack_q8`ed GGUF weights, x rounded to int8 per block of 32 first."""
    y = torch.ops.servelab.matmul_q8(x, w)
    return y if bias is None else y + bias


def q16_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               ) -> torch.Tensor:
    """F.linear for `pack_q16`ed GGUF weights, x rounded to int16 per block of 32 first."""
    y = torch.ops.servelab.matmul_q16(x, w)
    return y if bias is None else y + bias


def _onednn_pack(w: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS_HINT)


# layout -> (pack one [out, in] weight, the matmul that reads packed weights)
PACKERS: dict[str, tuple[Callable | None, Callable]] = {
    "plain": (None, F.linear),
    "onednn": (_onednn_pack, packed_linear),
    "amx": (vnni_pack, amx_linear),
    "bf16": (torch.Tensor.contiguous, kernel_linear),
    "gguf": (None, kernel_linear),  # the weights come from the GGUF file, not from packing
    "gguf-q8": (None, q8_linear),  # the GGUF file's, regrouped by pack_q8 in LlamaModel
    "gguf-q16": (None, q16_linear),  # and by pack_q16
}


def choose_layout(shapes: list[tuple[int, int]], device: torch.device, dtype: torch.dtype,
                  pack: bool, cpu_kernels: bool) -> str:
    """The weight layout for a model whose linear weights have these [out, in] shapes.

    pack=False, a GPU, or fp32: "plain". Else "amx" when the C++ kernels are in use, this CPU
    has AMX tiles and every shape fits them; else "bf16" (our matmul, AVX-512 or AVX2) when
    the kernels are in use and every input size is a multiple of 32; else "onednn" where oneDNN
    has the packed bf16 linear; else "plain"."""
    if not pack or device.type != "cpu" or dtype != torch.bfloat16:
        return "plain"
    from engine.model.cpu import library

    if cpu_kernels and library.amx_available() and all(amx_fits(*s) for s in shapes):
        return "amx"
    if (cpu_kernels and library.load() and library.matmul_isa() != "portable"
            and all(k % 32 == 0 for _, k in shapes)):
        return "bf16"
    return "onednn" if cpu_packing_available(device, dtype) else "plain"
