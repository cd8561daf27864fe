"""Shortcuts to single choices of the execution plan, for callers that need one of them
without an engine (the app's model preload, the draft's dense copy, the benchmarks).

engine/plan.py decides every one of them; nothing here decides anything of its own.
"""

from __future__ import annotations

import torch

from engine.config import EngineConfig


def _plan(**fields):
    from engine.model.loader import BUNDLED_MODELS
    from engine.plan import SMOLLM2, ModelFacts, plan_for

    cfg = EngineConfig(**fields)
    # a local folder's dtype and device do not depend on its shapes: the bundled ones stand in
    model = None if cfg.model in BUNDLED_MODELS else ModelFacts(False, SMOLLM2.linear_shapes, True)
    return plan_for(cfg, model)


def resolve_device(name: str = "auto") -> torch.device:
    """The plan's device for device=`name`: 'auto' is CUDA when there is a GPU, else the CPU."""
    return torch.device(_plan(device=name, cpu_kernels=False, weights="dense").device)


def draft_dtype() -> torch.dtype:
    """The plan's draft_dtype (the built-in draft's many-row dense copy) on the default
    device: bf16 on CUDA and on CPUs with bf16 matrix units (AMX or AVX512-BF16), else fp32."""
    return _plan(cpu_kernels=False, weights="dense").torch_draft_dtype


def resolve_dtype(name: str = "auto", device: torch.device | None = None, *,
                  model: str = "smollm2-135m", weights: str = "auto", cpu_kernels: bool = True,
                  pack: bool = True) -> torch.dtype:
    """The plan's dtype for these EngineConfig fields (device None: 'auto')."""
    return _plan(dtype=name, device=device.type if device is not None else "auto", model=model,
                 weights=weights, cpu_kernels=cpu_kernels, pack_weights=pack).torch_dtype
