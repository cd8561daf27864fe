"""Our own Llama-family forward pass over one flat batch of tokens from many requests.

RMSNorm, rotary position embedding (with the config's scaling), grouped-query attention,
SwiGLU MLP, tied embeddings; Qwen2 q/k/v bias and Qwen3 per-head q/k norm. There is no
padding and no batch dimension: `input_ids` holds every scheduled token of every request
back to back, and the attention backend finds each request's context in the KV pool through
`AttentionMetadata` (slot_mapping for writes, block_tables for reads).

q/k/v and gate/up projections are fused into one matmul each: fewer, larger matmuls are
what a CPU (and a GPU) runs best.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.model.attention import AttentionMetadata
from engine.model.loader import LoadedModel, ModelConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # computed in fp32, as transformers' LlamaRMSNorm does
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies, with 'linear' and 'llama3' scaling (transformers' definitions)."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = cfg.rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type") or "default"
    if kind == "linear":
        inv_freq = inv_freq / sc["factor"]
    elif kind == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old_len = sc["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif kind not in ("default",):
        raise ValueError(f"unsupported rope scaling {kind!r} (default, linear, llama3 are)")
    return inv_freq


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaModel:
    """Weights on one device in one dtype; `forward` runs the flat batch through every layer."""

    def __init__(self, loaded: LoadedModel, device: torch.device, dtype: torch.dtype,
                 max_positions: int):
        cfg = self.cfg = loaded.config
        self.device, self.dtype = device, dtype
        w = loaded.weights

        def get(name: str) -> torch.Tensor:
            return w[name].to(device=device, dtype=dtype)

        self.embed = get("embed_tokens.weight")  # [vocab, hidden]
        self.lm_head = self.embed if cfg.tie_word_embeddings else w["lm_head.weight"].to(
            device=device, dtype=dtype)
        self.final_norm = get("norm.weight")
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            layer = {
                "in_norm": get(p + "input_layernorm.weight"),
                "post_norm": get(p + "post_attention_layernorm.weight"),
                # fused [q; k; v]: [(Hq + 2 Hkv) * d, hidden]
                "qkv": torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"]),
                "o": get(p + "self_attn.o_proj.weight"),
                # fused [gate; up]: [2 * intermediate, hidden]
                "gate_up": torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]),
                "down": get(p + "mlp.down_proj.weight"),
                "qkv_bias": None, "q_norm": None, "k_norm": None,
            }
            if cfg.qkv_bias:
                layer["qkv_bias"] = torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
            if cfg.qk_norm:
                layer["q_norm"] = get(p + "self_attn.q_norm.weight")
                layer["k_norm"] = get(p + "self_attn.k_norm.weight")
            self.layers.append(layer)
        # rotary tables for every position a request can reach: [max_positions, head_dim]
        inv_freq = rope_inv_freq(cfg)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)
        self.scale = cfg.head_dim ** -0.5
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # y = x W^T (+ b); a draft model swaps in int8 weights and int8_linear (engine/spec/draft.py)
        self.linear = F.linear

    @property
    def weight_bytes(self) -> int:
        """Bytes a decode step must read: every layer's weights plus the lm_head."""
        n = sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values()
                if t is not None)
        return n + self.lm_head.numel() * self.lm_head.element_size()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], backend) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> final hidden states [num_tokens, hidden]."""
        cfg = self.cfg
        n = input_ids.shape[0]
        h = self.embed[input_ids]  # [num_tokens, hidden]
        cos = self.cos[positions].unsqueeze(1)  # [num_tokens, 1, head_dim]
        sin = self.sin[positions].unsqueeze(1)
        eps = cfg.rms_norm_eps
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            x = rms_norm(h, layer["in_norm"], eps)
            qkv = self.linear(x, layer["qkv"], layer["qkv_bias"])
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(n, cfg.num_heads, cfg.head_dim)  # [num_tokens, Hq, d]
            k = k.view(n, cfg.num_kv_heads, cfg.head_dim)  # [num_tokens, Hkv, d]
            v = v.view(n, cfg.num_kv_heads, cfg.head_dim)
            if layer["q_norm"] is not None:
                q = rms_norm(q, layer["q_norm"], eps)
                k = rms_norm(k, layer["k_norm"], eps)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            backend.store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
            attn = backend.forward(q, k_cache, v_cache, meta, self.scale)  # [num_tokens, Hq, d]
            h = h + self.linear(attn.reshape(n, self.q_size), layer["o"])
            x = rms_norm(h, layer["post_norm"], eps)
            gate, up = self.linear(x, layer["gate_up"]).chunk(2, dim=-1)
            h = h + self.linear(F.silu(gate) * up, layer["down"])
        return rms_norm(h, self.final_norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] -> [rows, vocab] in fp32."""
        return self.linear(hidden, self.lm_head).float()
