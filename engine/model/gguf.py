"""The bundled model's linear weights exactly as its GGUF file ships them (weights="gguf").

The default model ships as `SmolLM2-135M-Instruct.Q4_1.gguf`: every linear layer in GGUF's
Q4_1 blocks (32 weights in 20 bytes: an fp16 scale d and minimum m, 4-bit q; w = d * q + m)
and the embedding, which is also the lm_head, in Q8_0 (32 int8 and an fp16 scale; w = d * q).
The loader dequantizes them once into an fp32 folder for the dense path; the "gguf" path keeps
the blocks and multiplies them with the C++ kernels (engine/model/cpu/matmul.cpp), which
dequantize each block in registers: about a third of bf16's bytes to stream (20 bytes per 32
weights against 64), and the model's own values rather than bf16 roundings of them.

Each weight here is the file's raw rows as a uint8 tensor [out, row bytes], q/k/v and
gate/up fused by stacking rows (rows are independent), and attn_q / attn_k rows put back in
the Hugging Face order: llama.cpp's converter permutes them for its rotary layout, and
transformers' GGUF loader undoes it (`reverse_permute`, same row permutation below).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.model import cache
from engine.model.loader import BUNDLED_MODELS, LoadedModel, ModelConfig, _bundled_gguf

# GGUF tensor type -> the kernel's format name (engine/model/cpu/matmul.cpp)
KERNEL_FORMATS = {"Q4_1": "q4_1", "Q8_0": "q8_0"}
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}  # bytes per block of 32 weights


def row_format(w: torch.Tensor, in_features: int) -> str:
    """The kernel format of a weight: "bf16" (dense [out, in]) or a GGUF block format, told
    apart by its bytes per row (torch.ops.servelab.matmul infers it the same way)."""
    if w.dtype == torch.bfloat16:
        return "bf16"
    for name, bb in BLOCK_BYTES.items():
        if w.dtype == torch.uint8 and w.shape[1] == in_features // 32 * bb:
            return name
    raise ValueError(f"not a bf16 or GGUF Q4_1/Q8_0 weight for {in_features} inputs: "
                     f"{w.dtype} {tuple(w.shape)}")


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row permutation of attn_q / attn_k (transformers'
    `_reverse_permute_weights`), on raw rows: [out, ...] -> [out, ...]."""
    half = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, half, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def gguf_path(loaded: LoadedModel):
    """The GGUF file behind a loaded model; ValueError for a model that has none."""
    if loaded.name not in BUNDLED_MODELS:
        raise ValueError(f"weights='gguf' needs a model shipped as a GGUF file "
                         f"({sorted(BUNDLED_MODELS)}); {loaded.name!r} is a Hugging Face folder "
                         f"(use weights='dense')")
    return _bundled_gguf(loaded.name)


def _read(path, cfg: ModelConfig) -> dict:
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}

    def raw(name: str, n_head: int | None = None) -> tuple[np.ndarray, str]:
        t = tensors.get(name)
        if t is None:
            raise ValueError(f"{path.name}: no tensor {name!r}")
        kind = t.tensor_type.name
        if kind not in KERNEL_FORMATS:
            raise ValueError(f"{path.name}: {name} is {kind}; the GGUF kernels read "
                             f"{sorted(KERNEL_FORMATS)}")
        rows = np.asarray(t.data)
        if n_head is not None:
            rows = unpermute_rows(rows, n_head)
        return rows, KERNEL_FORMATS[kind]

    def fused(parts: list[tuple[np.ndarray, str]], what: str) -> torch.Tensor:
        if len({fmt for _, fmt in parts}) != 1:
            raise ValueError(f"{path.name}: {what} mixes formats {[f for _, f in parts]}")
        return torch.from_numpy(np.ascontiguousarray(np.concatenate([r for r, _ in parts])))

    layers = []
    for i in range(cfg.num_layers):
        p = f"blk.{i}."
        layers.append({
            "qkv": fused([raw(p + "attn_q.weight", cfg.num_heads),
                          raw(p + "attn_k.weight", cfg.num_kv_heads),
                          raw(p + "attn_v.weight")], f"layer {i} q/k/v"),
            "o": fused([raw(p + "attn_output.weight")], f"layer {i} o"),
            "gate_up": fused([raw(p + "ffn_gate.weight"), raw(p + "ffn_up.weight")],
                             f"layer {i} gate/up"),
            "down": fused([raw(p + "ffn_down.weight")], f"layer {i} down"),
        })
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    return {"layers": layers, "lm_head": fused([raw(head)], "lm_head")}


def read_linear_weights(loaded: LoadedModel) -> dict:
    """{"layers": [{"qkv", "o", "gate_up", "down"} per layer], "lm_head"}: uint8 GGUF rows,
    read once per process (engine/model/cache.py)."""
    path = gguf_path(loaded)
    return cache.get("gguf", (str(path),), lambda: _read(path, loaded.config))


def quantize_q8_0(w: torch.Tensor) -> torch.Tensor:
    """A float [out, in] weight as GGUF Q8_0 rows, uint8 [out, in / 32 * 34], as llama.cpp's
    quantize_row_q8_0 writes them: per block of 32 weights an fp16 scale d = max|w| / 127, then
    32 int8 q = roundf(w / d) (w ~ d * q), bit for bit as gguf-py's own quantizer. For weights
    this project trains itself (the EAGLE head): the same kernel then reads them in 1.06 bytes
    a weight instead of 4 (fp32)."""
    out, k = w.shape
    if k % 32:
        raise ValueError(f"Q8_0 needs a multiple of 32 inputs, got {k}")
    blocks = w.detach().float().reshape(out, k // 32, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127  # fp32, as ggml-quants.c computes it
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    x = blocks * inv
    q = (x.sign() * (x.abs() + 0.5).floor()).to(torch.int8)  # C's roundf: halves away from 0
    d = d.to(torch.float16)
    rows = torch.cat([d.view(torch.uint8).reshape(out, k // 32, 2), q.view(torch.uint8)], -1)
    return rows.reshape(out, k // 32 * 34).contiguous()
