"""Our own Llama-family forward pass over one flat batch of tokens from many requests.

RMSNorm, rotary position embedding (with the config's scaling), grouped-query attention,
SwiGLU MLP, tied embeddings; Qwen2 q/k/v bias and Qwen3 per-head q/k norm. There is no
padding and no batch dimension: `input_ids` holds every scheduled token of every request
back to back, and the attention backend finds each request's context in the KV pool through
`AttentionMetadata` (slot_mapping for writes, block_tables for reads).

q/k/v and gate/up projections are fused into one matmul each: fewer, larger matmuls are
what a CPU (and a GPU) runs best. On a CPU in bf16, `pack_for_cpu()` also reorders every
linear weight once, for our AMX kernel (engine/model/cpu_linear.cpp) where the CPU has AMX
and the C++ kernels are on, else into oneDNN's blocked layout (measured in its docstring).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.model.attention import AttentionMetadata
from engine.model.loader import LoadedModel, ModelConfig

# oneDNN's prepacked linear (what torch.compile's CPU "freezing" pass uses): the weight is
# reordered once, for a typical row count, into the blocked layout the AMX/AVX-512 bf16
# kernels read directly, instead of on every call.
PACK_ROWS_HINT = 16


def cpu_packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def packed_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  ) -> torch.Tensor:
    """F.linear for a weight packed by `torch.ops.mkldnn._reorder_linear_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, bias, "none", [], "")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # computed in fp32, as transformers' LlamaRMSNorm does (x * rsqrt(mean(x^2) + eps), then
    # cast back and scaled); torch's fused rms_norm, 4 ops instead of 8, gave identical bits
    # on every captured step we compared (bf16 and fp32)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual step: h + delta, and its RMSNorm (one C++ call with the kernels)."""
    h = h + delta
    return h, rms_norm(h, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """The SwiGLU activation on the fused [gate; up] projection: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1] written as the halves
    swapped ([x2, x1], one roll by d/2) times a sin whose first half is negated: the same
    products, bit for bit, in 4 ops instead of 7. x: [tokens, heads, d]; cos, sin_signed:
    [tokens, 1, d]."""
    swapped = x.roll(x.shape[-1] // 2, dims=-1)
    return x * cos + swapped * sin_signed


def vnni_pack(w: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [N/16, K/2, 32]: per block of 16 output columns, K/2 rows of 16 (even, odd)
    pairs, the AMX tile layout `torch.ops.servelab.amx_linear` reads (cpu_linear.cpp)."""
    n, k = w.shape
    return w.reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).reshape(n // 16, k // 2, 32
                                                                          ).contiguous()


def amx_fits(w: torch.Tensor) -> bool:
    return w.dtype == torch.bfloat16 and w.shape[0] % 16 == 0 and w.shape[1] % 32 == 0


def amx_linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
               ) -> torch.Tensor:
    """F.linear for a weight packed by `vnni_pack`."""
    return torch.ops.servelab.amx_linear(x, w, bias)


class LlamaModel:
    """Weights on one device in one dtype; `forward` runs the flat batch through every layer."""

    def __init__(self, loaded: LoadedModel, device: torch.device, dtype: torch.dtype,
                 max_positions: int):
        cfg = self.cfg = loaded.config
        self.device, self.dtype = device, dtype
        self.loaded = loaded  # the loader's per-process copy: plain weights stay reachable
        w = loaded.weights

        def get(name: str) -> torch.Tensor:
            return w[name].to(device=device, dtype=dtype)

        self.embed = get("embed_tokens.weight")  # [vocab, hidden]
        self.lm_head = self.plain_lm_head
        self.final_norm = get("norm.weight")
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            layer = {
                "in_norm": get(p + "input_layernorm.weight"),
                "post_norm": get(p + "post_attention_layernorm.weight"),
                **self.plain_linear_weights(i),
                "qkv_bias": None, "q_norm": None, "k_norm": None,
            }
            if cfg.qkv_bias:
                layer["qkv_bias"] = torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
            if cfg.qk_norm:
                layer["q_norm"] = get(p + "self_attn.q_norm.weight")
                layer["k_norm"] = get(p + "self_attn.k_norm.weight")
            self.layers.append(layer)
        self.ensure_positions(max_positions)
        self.scale = cfg.head_dim ** -0.5
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # y = x W^T (+ b); a draft model swaps in int8 weights and int8_linear (engine/spec/draft.py)
        self.linear = F.linear
        self.packed = False
        self.pack_layout = "plain"  # pack_for_cpu: "amx" or "onednn"
        # the small per-layer ops; use_cpu_ops() swaps in C++ kernels with the same arithmetic
        self.rms_norm, self.add_rms_norm = rms_norm, add_rms_norm
        self.rope, self.silu_mul = apply_rope, silu_mul
        self.cpu_ops = False
        # use_cpu_ops(): every layer's weights in the order torch.ops.servelab.decode_layers
        # takes them, when it can run this model; None: the Python loop always
        self.fused_weights: list[torch.Tensor] | None = None
        n = sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values()
                if t is not None)
        self._weight_bytes = n + self.lm_head.numel() * self.lm_head.element_size()

    @property
    def weight_bytes(self) -> int:
        """Bytes a decode step must read: every layer's weights plus the lm_head."""
        return self._weight_bytes

    def plain_linear_weights(self, i: int) -> dict[str, torch.Tensor]:
        """Layer i's linear weights, [out, in], q/k/v and gate/up fused, built from the loaded
        weights (so still available after `pack_for_cpu`; the built-in draft quantizes them)."""
        w, p = self.loaded.weights, f"layers.{i}."

        def get(name: str) -> torch.Tensor:
            return w[p + name].to(device=self.device, dtype=self.dtype)

        return {
            # fused [q; k; v]: [(Hq + 2 Hkv) * d, hidden]
            "qkv": torch.cat([get(f"self_attn.{n}_proj.weight") for n in "qkv"]),
            "o": get("self_attn.o_proj.weight"),
            # fused [gate; up]: [2 * intermediate, hidden]
            "gate_up": torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")]),
            "down": get("mlp.down_proj.weight"),
        }

    @property
    def plain_lm_head(self) -> torch.Tensor:
        """[vocab, hidden], plain layout: the embedding itself when the two are tied."""
        if self.cfg.tie_word_embeddings:
            return self.embed
        return self.loaded.weights["lm_head.weight"].to(device=self.device, dtype=self.dtype)

    def ensure_positions(self, max_positions: int) -> None:
        """Rotary tables for every position a request can reach: [max_positions, head_dim]."""
        if getattr(self, "cos", None) is not None and self.cos.shape[0] >= max_positions:
            return
        cfg = self.cfg
        inv_freq = rope_inv_freq(cfg)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=self.device, dtype=self.dtype)
        sin = emb.sin()
        sin[:, : cfg.head_dim // 2] *= -1  # rotate_half's minus sign, folded in (apply_rope)
        self.sin_signed = sin.to(device=self.device, dtype=self.dtype)

    LINEAR_WEIGHTS = ("qkv", "o", "gate_up", "down")

    def pack_for_cpu(self, amx: bool = False) -> bool:
        """Reorder every linear weight (and the lm_head) once, in place, for the CPU's bf16
        matmul; True if done. Only on a CPU in bf16 (`plain_linear_weights` still gives the
        plain ones).

        amx=True (the engine asks when its C++ kernels load and the CPU has AMX): VNNI pairs
        for `amx_linear`, which read the weights 1.3-1.7x faster than oneDNN's prepacked
        linear at 1 to 64 rows (`python -m benchmarks.kernel_bench`; README, Performance). Otherwise
        oneDNN's blocked layout: 1.04x to 1.72x the decode rate of plain weights at 1 to 32
        running in earlier runs of `python -m benchmarks.bench` (2-core Sapphire Rapids)."""
        if self.packed or not cpu_packing_available(self.device, self.dtype):
            return False
        mats = [self.lm_head] + [layer[n] for layer in self.layers for n in self.LINEAR_WEIGHTS]
        if amx and all(amx_fits(w) for w in mats):
            pack, self.linear, self.pack_layout = vnni_pack, amx_linear, "amx"
        else:
            reorder = torch.ops.mkldnn._reorder_linear_weight
            pack, self.linear, self.pack_layout = (lambda w: reorder(w, PACK_ROWS_HINT),
                                                   packed_linear, "onednn")
        for layer in self.layers:
            for name in self.LINEAR_WEIGHTS:
                layer[name] = pack(layer[name])
        # the lm_head is tied to the embedding, which lookups still read plain: a packed copy
        self.lm_head = pack(self.lm_head)
        self.packed = True
        return True

    def use_cpu_ops(self) -> bool:
        """Run norms, rotary embedding and SwiGLU as one C++ call each (engine/model/
        cpu_ops.cpp) instead of 3 to 8 PyTorch operators; True if the kernels loaded. Same
        arithmetic and roundings (tests/test_cpu_ops.py); measured by `python -m
        benchmarks.bench` (README, Performance)."""
        from engine.model import cpu_ops

        if not self.cpu_ops and cpu_ops.supports(self.device, self.dtype):
            ops = torch.ops.servelab
            self.rms_norm, self.add_rms_norm = ops.rms_norm, ops.add_rms_norm
            self.rope, self.silu_mul = ops.rope, ops.silu_mul
            self.cpu_ops = True
            # with AMX weights and a plain Llama layer (no q/k/v bias, no q/k norm), a step
            # whose attention one kernel call serves runs the whole layer loop in C++ (forward)
            if self.pack_layout == "amx" and all(
                    layer["qkv_bias"] is None and layer["q_norm"] is None for layer in self.layers):
                self.fused_weights = [layer[name] for layer in self.layers for name in (
                    "in_norm", "qkv", "o", "post_norm", "gate_up", "down")]
        return self.cpu_ops

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], backend) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> final hidden states [num_tokens, hidden]."""
        cfg = self.cfg
        n = input_ids.shape[0]
        h = self.embed[input_ids]  # [num_tokens, hidden]
        cos = self.cos[positions].unsqueeze(1)  # [num_tokens, 1, head_dim]
        sin = self.sin_signed[positions].unsqueeze(1)
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qk_size = self.q_size + self.kv_size
        eps = cfg.rms_norm_eps
        if self.fused_weights and backend.whole_step_in_kernel(meta, hq, hkv, d):
            # one attention kernel call per layer serves the step: the loop below, in C++
            return torch.ops.servelab.decode_layers(
                h, cos, sin, self.fused_weights, self.final_norm, [kv[0] for kv in kv_caches],
                [kv[1] for kv in kv_caches], meta.slot_mapping, meta.block_tables, meta.seq_lens,
                meta.query_start_loc, hq, hkv, self.scale, eps)
        x = self.rms_norm(h, self.layers[0]["in_norm"], eps)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            qkv = self.linear(x, layer["qkv"], layer["qkv_bias"])
            v = qkv[:, qk_size:].view(n, hkv, d)  # [num_tokens, Hkv, d]
            if layer["q_norm"] is None:  # rotate q and k heads together: [num_tokens, Hq + Hkv, d]
                qk = self.rope(qkv[:, :qk_size].view(n, hq + hkv, d), cos, sin)
                q, k = qk[:, :hq], qk[:, hq:]
            else:  # Qwen3: per-head RMSNorm on q and k before the rotation
                q = self.rope(self.rms_norm(qkv[:, :self.q_size].view(n, hq, d), layer["q_norm"],
                                            eps), cos, sin)
                k = self.rope(self.rms_norm(qkv[:, self.q_size:qk_size].view(n, hkv, d),
                                            layer["k_norm"], eps), cos, sin)
            backend.store_kv(k_cache, v_cache, k, v, meta.slot_mapping)
            attn = backend.forward(q, k_cache, v_cache, meta, self.scale)  # [num_tokens, Hq, d]
            # h += attention, then the norm before the MLP
            h, x = self.add_rms_norm(h, self.linear(attn.reshape(n, self.q_size), layer["o"]),
                                     layer["post_norm"], eps)
            mlp = self.linear(self.silu_mul(self.linear(x, layer["gate_up"])), layer["down"])
            # h += MLP, then the next layer's input norm (after the last layer: the final norm)
            norm = self.layers[i + 1]["in_norm"] if i + 1 < len(self.layers) else self.final_norm
            h, x = self.add_rms_norm(h, mlp, norm, eps)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] -> [rows, vocab] in fp32."""
        return self.linear(hidden, self.lm_head).float()


_shared: dict[tuple, LlamaModel] = {}


def shared_model(loaded: LoadedModel, device: torch.device, dtype: torch.dtype,
                 max_positions: int, pack: bool, cpu_ops: bool = False) -> LlamaModel:
    """One LlamaModel per (weights, device, dtype, packing) per process. Its weights are
    read-only, so engines (the app keeps one per switch setting) share it and own only their
    KV pools; the rotary tables grow to the longest max_positions asked for."""
    key = (str(loaded.folder), str(device), dtype, pack, cpu_ops)
    model = _shared.get(key)
    if model is None or model.loaded is not loaded:
        model = LlamaModel(loaded, device, dtype, max_positions)
        if pack:
            from engine.model import cpu_ops as cpu_kernels

            model.pack_for_cpu(amx=cpu_ops and cpu_kernels.amx_linear_available())
        if cpu_ops:
            model.use_cpu_ops()
        _shared[key] = model
    model.ensure_positions(max_positions)
    return model
