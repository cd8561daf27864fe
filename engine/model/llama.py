"""Our own Llama-family forward pass over one flat batch of tokens from many requests.

RMSNorm, rotary position embedding (with the config's scaling), grouped-query attention,
SwiGLU MLP, tied embeddings; Qwen2 q/k/v bias and Qwen3 per-head q/k norm. There is no
padding and no batch dimension: `input_ids` holds every scheduled token of every request
back to back, and the attention backend finds each request's context in the KV pool through
`AttentionMetadata` (slot_mapping for writes, block_tables for reads).

q/k/v and gate/up projections are fused into one matmul each: fewer, larger matmuls are
what a CPU (and a GPU) runs best. Everything that differs between a GPU, a plain CPU and a
CPU with our C++ kernels is decided once, by the engine's execution plan (engine/plan.py),
and built here with the model as the plan says, without deciding again: the small per-layer
ops (`LayerOps`: PyTorch's, the C++ kernels or fused Triton ones), the weight layout and its
matmul (the plan's row of engine/model/layouts.py) on the plan's instruction set, and whether
the C++ copy of the layer loop may run; `forward` shows every path a step can take.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from engine.model import weights_cache
from engine.model.attention import AttentionBackend, AttentionMetadata
from engine.model.cpu.attention import CpuAttention
from engine.model.cpu.packing import step_order_arena
from engine.model.layouts import Layout
from engine.model.loader import LoadedModel, ModelConfig

if TYPE_CHECKING:
    from engine.plan import ExecutionPlan


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # computed in fp32, as transformers' LlamaRMSNorm does (x * rsqrt(mean(x^2) + eps), then
    # cast back and scaled); torch's fused rms_norm does it in fewer ops with the same
    # roundings (tests/engine/test_engine_equality.py holds the engine to transformers' tokens)
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


class LayerOps(NamedTuple):
    """The small per-layer ops of one model, chosen at construction: PyTorch's (above), the
    C++ kernels (cpu/ops.cpp) or the fused Triton kernels (servelab_kernels.fused_ops), which do
    the same arithmetic with the same roundings in one call instead of 3 to 8 operators
    (tests/engine/test_cpu_ops.py and tests/kernels/test_kernel_fused_ops.py hold them to it)."""

    name: str  # "torch", "cpu" or "triton"
    rms_norm: Callable
    add_rms_norm: Callable
    rope: Callable
    silu_mul: Callable


TORCH_OPS = LayerOps("torch", rms_norm, add_rms_norm, apply_rope, silu_mul)


def cpu_kernel_ops() -> LayerOps:
    """The C++ kernels' ops (engine/model/cpu/library.py must have loaded them)."""
    ops = torch.ops.servelab
    return LayerOps("cpu", ops.rms_norm, ops.add_rms_norm, ops.rope, ops.silu_mul)


def triton_ops() -> LayerOps:
    """The fused Triton kernels' ops (kernels/fused_ops.py, imported as servelab_kernels; CUDA,
    or CPU tensors under TRITON_INTERPRET=1). Imported here, when asked for: triton is
    optional."""
    from servelab_kernels import fused_ops as k

    return LayerOps("triton", k.rms_norm, k.add_rms_norm, k.rope, k.silu_mul)


class LlamaModel:
    """Weights on one device in one dtype; `forward` runs the flat batch through every layer.

    Built as `plan` (engine/plan.py's ExecutionPlan, resolved and checked once) says:
    device and dtype; `layer_ops`: the small per-layer ops as PyTorch's, the C++ kernels
    ("cpu") or the fused Triton kernels ("triton": kernels/fused_ops.py; CUDA, or CPU tensors
    under TRITON_INTERPRET=1); `layout`: the linear weights' row of engine/model/layouts.py
    (`self.row`), laid out here once by its pack and multiplied by its linear on the plan's
    instruction set (`self.isa`, passed with every C++ call):
        "gguf": the linear layers and the lm_head are the GGUF file's own Q4_1 / Q8_0 rows
        (engine/model/gguf.py); the embedding and norms stay the loaded (dequantized) tensors.
        "gguf-q8": the same bytes regrouped 16 columns at a time (pack_q8), multiplied as
        llama.cpp does, with the activations rounded to int8 per block of 32.
        "gguf-q16": regrouped two q bytes at a time (pack_q16), the activations rounded to
        int16 per block of 32.
    `layer_loop` "cpp": steps whose attention the C++ kernel takes whole run the layer loop in
        C++ ("python": the same kernels, called from Python; tests and the kernel bench
        compare the two with `dataclasses.replace(plan, layer_loop="python")`).
    """

    LINEAR_WEIGHTS = ("qkv", "o", "gate_up", "down")

    def __init__(self, loaded: LoadedModel, plan: ExecutionPlan, max_positions: int):
        cfg = self.cfg = loaded.config
        self.device, self.dtype = torch.device(plan.device), plan.torch_dtype
        device, dtype = self.device, self.dtype
        self.loaded = loaded  # the loader's per-process copy: plain weights stay reachable
        # the layout the plan chose and checked, and the instruction set its C++ matmul runs
        self.row: Layout = plan.row
        self.layout, self.isa = self.row.name, plan.isa
        row = self.row
        w = loaded.weights

        def get(name: str) -> torch.Tensor:
            return w[name].to(device=device, dtype=dtype)

        # each linear weight's input size, for the packers of GGUF rows
        ins = dict(zip((*self.LINEAR_WEIGHTS, "lm_head"), (k for _, k in self.linear_shapes(cfg))))
        gguf = None
        if row.gguf:  # the file's own blocks, read once per process
            from engine.model.gguf import read_linear_weights

            gguf = read_linear_weights(loaded)
            if row.pack is not None:  # regrouped for an integer kernel (a copy)
                packed = [row.pack(layer[n], ins[n]) for layer in gguf["layers"]
                          for n in self.LINEAR_WEIGHTS] + [row.pack(gguf["lm_head"],
                                                                   ins["lm_head"])]
                packed = step_order_arena(packed)  # one region, read front to back
                names = self.LINEAR_WEIGHTS
                gguf = {"lm_head": packed[-1],
                        "layers": [dict(zip(names, packed[i:i + len(names)]))
                                   for i in range(0, len(packed) - 1, len(names))]}
        self.embed = get("embed_tokens.weight")  # [vocab, hidden]
        self.lm_head = gguf["lm_head"] if gguf else self.plain_lm_head
        self.final_norm = get("norm.weight")
        self.layers = []
        for i in range(cfg.num_layers):
            p = f"layers.{i}."
            layer = {
                "in_norm": get(p + "input_layernorm.weight"),
                "post_norm": get(p + "post_attention_layernorm.weight"),
                **(gguf["layers"][i] if gguf else self.plain_linear_weights(i)),
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
        n = sum(t.numel() * t.element_size() for layer in self.layers for t in layer.values()
                if t is not None)
        self._weight_bytes = n + self.lm_head.numel() * self.lm_head.element_size()

        if plan.layer_ops == "triton":
            self.ops = triton_ops()
        else:
            self.ops = cpu_kernel_ops() if plan.layer_ops == "cpu" else TORCH_OPS
        # y = x W^T (+ b), for weights in this layout (the built-in draft: its int4/int8 ones)
        self.linear = row.linear_for(self.isa)
        if row.pack is not None and not row.gguf:
            for layer in self.layers:
                for name in self.LINEAR_WEIGHTS:
                    layer[name] = row.pack(layer[name], ins[name])
            # the lm_head may be the embedding, which lookups still read plain: a packed copy
            self.lm_head = row.pack(self.lm_head, ins["lm_head"])
        # every layer's weights in the order torch.ops.servelab.decode_layers takes them, where
        # the plan runs the C++ layer loop; None: the Python loop always
        self.cpp_layer_weights: list[torch.Tensor] | None = None
        if plan.layer_loop == "cpp":
            self.cpp_layer_weights = [layer[name] for layer in self.layers for name in (
                "in_norm", "qkv", "o", "post_norm", "gate_up", "down")]

    @staticmethod
    def linear_shapes(cfg: ModelConfig) -> list[tuple[int, int]]:
        """The [out, in] shapes of the fused linear weights and the lm_head."""
        from engine.plan import linear_shapes

        return linear_shapes(cfg)

    @property
    def packed(self) -> bool:
        """Are the linear weights laid out for one of our C++ bf16 matmuls (not F.linear)?"""
        return self.row is not None and not self.row.gguf and self.row.kernel != "torch"

    @property
    def weight_bytes(self) -> int:
        """Bytes a decode step must read: every layer's weights plus the lm_head."""
        return self._weight_bytes

    def plain_linear_weights(self, i: int) -> dict[str, torch.Tensor]:
        """Layer i's linear weights, [out, in], q/k/v and gate/up fused, built from the loaded
        weights (so available whatever the layout; the built-in draft quantizes them)."""
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

    def runs_cpp_layer_loop(self, meta: AttentionMetadata, backend: AttentionBackend) -> bool:
        """Does this step run the whole layer loop in C++? Only where the plan runs the C++
        layer loop (its layer_loop "cpp": the C++ loop's weights, plain Llama layers, the C++
        attention backend), when its kernel takes every request of the step in one call
        (CpuAttention.takes_whole_step)."""
        cfg = self.cfg
        return (self.cpp_layer_weights is not None and isinstance(backend, CpuAttention)
                and backend.takes_whole_step(meta, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                backend: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [num_tokens] -> final hidden states [num_tokens, hidden].

        A step takes one of two paths: the C++ layer loop (`runs_cpp_layer_loop`: the same
        kernels, in the same order, without Python between them), or the loop below, with this
        model's ops and matmul. The attention inside either is the backend's."""
        cfg = self.cfg
        n = input_ids.shape[0]
        h = self.embed[input_ids]  # [num_tokens, hidden]
        cos = self.cos[positions].unsqueeze(1)  # [num_tokens, 1, head_dim]
        sin = self.sin_signed[positions].unsqueeze(1)
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qk_size = self.q_size + self.kv_size
        eps = cfg.rms_norm_eps
        if self.runs_cpp_layer_loop(meta, backend):  # the loop below, in C++ (cpu/ops.cpp)
            return torch.ops.servelab.decode_layers(
                h, cos, sin, self.cpp_layer_weights, self.final_norm,
                [kv[0] for kv in kv_caches], [kv[1] for kv in kv_caches], meta.slot_mapping,
                meta.block_tables, meta.seq_lens, meta.query_start_loc, hq, hkv, self.scale, eps,
                self.row.activations or "float", self.isa)
        ops, linear = self.ops, self.linear
        x = ops.rms_norm(h, self.layers[0]["in_norm"], eps)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches)):
            qkv = linear(x, layer["qkv"], layer["qkv_bias"])
            v = qkv[:, qk_size:].view(n, hkv, d)  # [num_tokens, Hkv, d]
            if layer["q_norm"] is None:  # rotate q and k heads together: [num_tokens, Hq + Hkv, d]
                qk = ops.rope(qkv[:, :qk_size].view(n, hq + hkv, d), cos, sin)
                q, k = qk[:, :hq], qk[:, hq:]
            else:  # Qwen3: per-head RMSNorm on q and k before the rotation
                q = ops.rope(ops.rms_norm(qkv[:, :self.q_size].view(n, hq, d), layer["q_norm"],
                                          eps), cos, sin)
                k = ops.rope(ops.rms_norm(qkv[:, self.q_size:qk_size].view(n, hkv, d),
                                          layer["k_norm"], eps), cos, sin)
            backend.store_kv(k_cache, v_cache, k, v, meta)
            attn = backend.forward(q, k_cache, v_cache, meta, self.scale)  # [num_tokens, Hq, d]
            # h += attention, then the norm before the MLP
            h, x = ops.add_rms_norm(h, linear(attn.reshape(n, self.q_size), layer["o"]),
                                    layer["post_norm"], eps)
            mlp = linear(ops.silu_mul(linear(x, layer["gate_up"])), layer["down"])
            # h += MLP, then the next layer's input norm (after the last layer: the final norm)
            norm = self.layers[i + 1]["in_norm"] if i + 1 < len(self.layers) else self.final_norm
            h, x = ops.add_rms_norm(h, mlp, norm, eps)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] -> [rows, vocab] in fp32."""
        return self.linear(hidden, self.lm_head).float()


def shared_model(loaded: LoadedModel, plan: ExecutionPlan, max_positions: int) -> LlamaModel:
    """The LlamaModel for these weights as `plan` builds them (its device, dtype, layer ops,
    layout, instruction set and layer loop), built once per process
    (engine/model/weights_cache.py). Its weights are read-only, so engines share it and own only
    their KV pools; the rotary tables grow to the longest max_positions asked for."""
    key = (str(loaded.folder), plan.device, plan.dtype, plan.layer_ops, plan.layout, plan.isa,
           plan.layer_loop)
    model = weights_cache.get("model", key, lambda: LlamaModel(loaded, plan, max_positions))
    model.ensure_positions(max_positions)
    return model
