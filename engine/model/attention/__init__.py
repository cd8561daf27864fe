"""Attention backends behind one interface, chosen by name (mini-sglang's attention package).

  base.py           `AttentionMetadata` + `build_metadata` / `build_step` (the step's slot
                    mapping and block tables as tensors, in one host buffer and one copy) and
                    `AttentionBackend` (store_kv, forward)
  torch_backend.py  "torch": gather through the block tables + SDPA; the reference
  triton_backend.py "triton": the Triton kernels of kernels/ (CUDA, or the interpreter in
                    tests); imported, with triton, only when asked for
  ../cpu/attention.py   "cpu": the torch backend with the C++ paged-attention kernel

`get_backend(name)` builds one; a backend module is imported only when asked for (triton is
optional, the C++ kernels are built on first use).
"""

from __future__ import annotations

import importlib

from engine.model.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    Staging,
    build_metadata,
    build_step,
)
from engine.model.attention.torch_backend import TorchAttention

# name -> (module, class)
BACKENDS: dict[str, tuple[str, str]] = {
    "torch": ("engine.model.attention.torch_backend", "TorchAttention"),
    "cpu": ("engine.model.cpu.attention", "CpuAttention"),
    "triton": ("engine.model.attention.triton_backend", "TritonAttention"),
}


def register_backend(name: str, module: str, cls: str) -> None:
    """Make `get_backend(name)` build `module.cls` (imported then)."""
    BACKENDS[name] = (module, cls)


def get_backend(name: str) -> AttentionBackend:
    """A backend by its registered name (the engine has resolved "auto" and loaded the C++
    kernels for "cpu")."""
    if name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {sorted(BACKENDS)}, got {name!r}")
    module, cls = BACKENDS[name]
    backend = getattr(importlib.import_module(module), cls)()
    if not isinstance(backend, AttentionBackend):
        raise TypeError(f"{module}.{cls} does not implement AttentionBackend")
    return backend


__all__ = ["AttentionBackend", "AttentionMetadata", "BACKENDS", "Staging", "TorchAttention",
           "build_metadata", "build_step", "get_backend", "register_backend"]
