"""Weight-only int8 linear layers: a draft model made of the target's own weights.

On a CPU, decoding one token is bound by memory traffic: every step reads every weight
once. Storing each weight as int8 with one float scale per output channel reads ~4x fewer
bytes than float32, so the same network, quantized, is a cheap draft that agrees with the
target most of the time (same family, same tokenizer, nearly the same logits); speculative
decoding's rejection sampler keeps the output exactly the target's either way.

    w[o, i] ~= w_int8[o, i] * scale[o],   scale[o] = max_i |w[o, i]| / 127   (symmetric)

`int8_linear` uses `torch.ops.aten._weight_int8pack_mm`, PyTorch's CPU kernel for exactly
this layout (int8 [out, in] weights, per-output-channel scales; torchao's int8 weight-only
path calls it) with bfloat16 activations: measured with torch 2.13 on this project's CPU
(`python -m benchmarks.int8_bench`), that is the fastest path for one row, about 2x float32
over SmolLM2-135M's linear layers, while the same op with float32 activations takes a slow
generic path (4-30x slower than a float32 matmul). Where the op is missing, or off the CPU,
it dequantizes on the fly. The bfloat16 activations add rounding about as large as the int8
rounding itself (~1e-2 absolute on outputs of size ~1): fine for a draft, whose every token
the target verifies.
"""

from __future__ import annotations

import torch
from torch import Tensor

_HAS_INT8PACK_MM = hasattr(torch.ops.aten, "_weight_int8pack_mm")


def quantize_linear_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel int8: w [out, in] -> (w_int8 [out, in], scale [out])."""
    w = w.float()
    scale = w.abs().amax(dim=1) / 127.0  # [out]
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    w_int8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [out, in]
    return w_int8.contiguous(), scale.contiguous()


def dequantize_linear_weight(w_int8: Tensor, scale: Tensor) -> Tensor:
    """(w_int8 [out, in], scale [out]) -> float32 w [out, in]."""
    return w_int8.float() * scale[:, None]


def int8_linear(x: Tensor, w_int8: Tensor, scale: Tensor) -> Tensor:
    """y = x @ (w_int8 * scale).T without materializing the float weight.

    x: [..., in] float32 or bfloat16; w_int8: [out, in] int8; scale: [out] (any float dtype;
    keep a bfloat16 copy to skip a cast per call). Returns [..., out] in x's dtype.
    """
    out_features, in_features = w_int8.shape
    x2d = x.reshape(-1, in_features)  # [M, in]
    if _HAS_INT8PACK_MM and x.device.type == "cpu":
        # the fast CPU kernel is the bfloat16 one; it wants the scales in the activation dtype
        x_bf16 = x2d.to(torch.bfloat16).contiguous()  # [M, in]
        y = torch.ops.aten._weight_int8pack_mm(x_bf16, w_int8, scale.to(torch.bfloat16))
        y = y.to(x.dtype)  # [M, out]
    else:
        y = (x2d.float() @ dequantize_linear_weight(w_int8, scale).T).to(x.dtype)
    return y.reshape(*x.shape[:-1], out_features)  # [..., out]
