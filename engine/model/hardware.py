"""Where and how the model runs: the device, the dtype and the attention backend behind "auto".

Every "auto" of `EngineConfig` (device, dtype, attention_backend) is resolved here and only
here; the engine, the app and the benchmarks all call these functions.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch


def resolve_device(name: str = "auto") -> torch.device:
    """'auto': CUDA when there is a GPU, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but no CUDA device is available")
    return torch.device(name)


@functools.lru_cache(maxsize=1)
def cpu_prefers_bf16() -> bool:
    """Does this CPU have bf16 matrix units (AMX or AVX512-BF16)?

    With them, bf16 decodes several times faster than fp32 (README, Performance); without
    them bf16 is emulated and slower than fp32. The choice rests on the CPU's flags rather than
    a timing at start-up, which a shared machine makes unstable."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(name: str = "auto", device: torch.device | None = None, *,
                  model: str = "smollm2-135m", weights: str = "auto", cpu_kernels: bool = True,
                  pack: bool = True) -> torch.dtype:
    """'auto': bfloat16 on CUDA and on CPUs with bf16 matrix units, else float32; and float32
    wherever the linear layers run the GGUF file's own blocks (weights "gguf", or "auto" where
    resolve_weights picks them: every CPU but one with AMX). The GGUF matmul multiplies and
    adds in fp32 whatever the activations, so bf16 ones only add a rounding and two
    conversions around each of a step's 121 matmuls. fp32 activations compute the file's fp32
    model, as transformers' reference does, at about the same speed (`python -m
    benchmarks.kernel_bench --weights` on a Zen 4: 106.7 against 113.1 tok/s at batch 1;
    README, Performance).
    device None: the one resolve_device('auto') picks. The keyword arguments are the
    EngineConfig fields the GGUF choice rests on (model, weights, cpu_kernels, pack_weights)."""
    if name != "auto":
        return getattr(torch, name)
    device = device if device is not None else resolve_device("auto")
    if device.type == "cuda":
        return torch.bfloat16
    if not cpu_prefers_bf16():
        return torch.float32
    if weights in ("gguf", "gguf-q8", "gguf-q16"):
        return torch.float32
    if weights == "auto":
        from engine.model.cpu import library

        kernels = cpu_kernels and library.available(device, torch.bfloat16)
        if _gguf_by_default(model, device, torch.bfloat16, kernels, pack):
            return torch.float32
    return torch.bfloat16


def resolve_backend(name: str, device: torch.device, cpu_kernels: bool) -> str:
    """'auto': Triton on CUDA; on a CPU the C++ kernels' backend if they loaded, else torch."""
    if name == "auto":
        if device.type == "cuda":
            return "triton"
        return "cpu" if cpu_kernels else "torch"
    if name == "cpu" and not cpu_kernels:
        raise ValueError("attention_backend='cpu' needs the C++ CPU kernels (cpu_kernels=True "
                         "on a CPU with g++); use 'torch'")
    return name


def resolve_weights(name: str, model: str, device: torch.device, dtype: torch.dtype,
                    cpu_kernels: bool, pack: bool = True, dtype_asked: str = "auto") -> str:
    """'auto': the GGUF blocks on a CPU whose bf16 weights would not run on AMX, else "dense".

    On such CPUs (AVX2 laptops, AVX-512 without AMX) the dense alternative streams 269 MB
    (bf16) or 538 MB (fp32) of weights a step through PyTorch's or our matmul, where the GGUF
    blocks are 97 MB, the shipped values themselves, multiplied batch-invariantly (README,
    Performance, measures both side by side on such a CPU). Which GGUF arithmetic follows the
    dtype the config asked for (`dtype_asked`, EngineConfig.dtype): "auto" gets "gguf-q16"
    (activations rounded to int16 per block of 32: the logits within ~0.05% of the fp32
    model's, 41-92x closer than bf16 activations, and 1.45-1.6x the fp32 engine's tokens a second
    on a Zen 4), an explicit dtype gets "gguf", that arithmetic itself (float32: transformers'
    fp32 model, token for token). "auto" keeps "dense" for models
    without a GGUF file, on GPUs, without the C++ kernels or a vector matmul path (the portable
    one is there for correctness), with pack_weights=False (the plain PyTorch reference), in
    float16, and in bf16 where the CPU has AMX (its tile matmul leads at serving loads).
    "gguf" asked for explicitly is checked here: a model shipped as GGUF, a CPU, the C++
    kernels, float32 or bfloat16 activations; else a ValueError saying which."""
    if name == "auto":
        if not _gguf_by_default(model, device, dtype, cpu_kernels, pack):
            return "dense"
        return "gguf-q16" if dtype_asked == "auto" else "gguf"
    if name == "dense":
        return "dense"
    from engine.model.loader import BUNDLED_MODELS

    if model not in BUNDLED_MODELS:
        raise ValueError(f"weights={name!r} needs a model shipped as a GGUF file "
                         f"({sorted(BUNDLED_MODELS)}); {model!r} is a Hugging Face folder, which "
                         f"runs with weights='dense'")
    if device.type != "cpu":
        raise ValueError(f"weights={name!r} runs on the CPU; device is {device.type}")
    if not cpu_kernels:
        raise ValueError(f"weights={name!r} needs the C++ CPU kernels (cpu_kernels=True, and "
                         "g++ to build them)")
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"weights={name!r} runs float32 or bfloat16 activations, not "
                         f"{str(dtype).removeprefix('torch.')}")
    from engine.model.cpu import library

    library.matmul_isa()  # a ValueError now if SERVELAB_CPU_ISA names a set this CPU lacks
    return name


def _gguf_by_default(model: str, device: torch.device, dtype: torch.dtype, cpu_kernels: bool,
                     pack: bool) -> bool:
    from engine.model.loader import BUNDLED_MODELS

    if (model not in BUNDLED_MODELS or device.type != "cpu" or not cpu_kernels or not pack
            or dtype not in (torch.float32, torch.bfloat16)):
        return False
    from engine.model.cpu import library

    try:
        if library.matmul_isa() == "portable":
            return False
    except ValueError:  # SERVELAB_CPU_ISA names a set this CPU lacks: said when asked for it
        return False
    return not (dtype == torch.bfloat16 and library.amx_available())
