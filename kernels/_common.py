"""Small helpers shared by the kernels: interpreter detection and launch-size choices."""

from __future__ import annotations

import os

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1): Triton block shapes must be powers of two."""
    return 1 << max(0, int(n) - 1).bit_length()


def check_device(t: torch.Tensor) -> None:
    """Triton needs CUDA tensors, or CPU tensors under the interpreter."""
    if t.device.type == "cpu" and not interpreting():
        raise RuntimeError(
            "the Triton kernels need CUDA tensors; for CPU tensors set TRITON_INTERPRET=1 "
            "before triton or kernels.* is imported"
        )


def dot_in_storage_dtype(cache_dtype: torch.dtype) -> bool:
    """Run tl.dot on 16-bit K/V directly (fp32 accumulation), as tensor cores want.

    fp32 storage uses exact fp32 products (input_precision="ieee", not TF32). The interpreter
    computes bf16 dots wrongly (numpy has no bf16), so there bf16 is widened to fp32 first.
    """
    if cache_dtype not in LOW_PRECISION:
        return False
    return not (interpreting() and cache_dtype == torch.bfloat16)
