"""The apprentice: an EAGLE-style feature-level draft head, trained here on the target's own
outputs, with a frequency-ranked reduced vocabulary (FR-Spec).

Why not a smaller copy of the target? A draft pays only if it is both accurate and much
cheaper than the target. The built-in int4 twin (`draft.py`) agrees often but runs all 30
layers over a large share of the target's bytes, so where the target itself is fast its step
costs nearly a target step. A self-speculative draft that skips the target's layers
(LayerSkip, Elhoushi et al. 2024, arXiv:2404.16710; SWIFT, Xia et al. 2024, arXiv:2410.06916)
without training agrees far less and still runs many layers (`benchmarks.draft_study`
measures both; docs/performance.md has the figures).

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty", arXiv:2401.15077) drafts at the feature level: ONE decoder layer reads the
target's own hidden state f_j at position j and the embedding of the token at j + 1, and
predicts the target's next hidden state f_{j+1}; the target's output head turns that into a
distribution for the token at j + 2. The head is small (one layer of 30), and the target has
already done the hard work: its feature f_j summarizes the context. EAGLE-2 (Li et al. 2024,
arXiv:2406.16858) adds dynamic draft trees; here a chain with a confidence stop (dynamic k:
drafting ends before the first token whose probability under the head is below
`min_confidence`).
Medusa (Cai et al. 2024, arXiv:2401.10774) instead puts k independent heads on f_j; EAGLE's
autoregressive head is more accurate at the same cost.

The readout. SmolLM2's output head is 49152 x 576, a fifth of the model's weights: read in
full it alone would cost a fifth of a target step. FR-Spec (Zhao et al. 2025, "FR-Spec: Accelerating
Large-Vocabulary Language Models via Frequency-Ranked Speculative Sampling",
arXiv:2502.14856) drafts from the most frequent tokens only: here the `vocab_size` tokens the
target emits most often on the training prompts (ties and the rest by token id, i.e. by the
tokenizer's merge order), with their rows of the target's own output head (frozen, not stored).
A token outside that set is never drafted; verification still uses the full vocabulary, so
the output is unchanged (lossless): the draft's distribution is simply 0 there.

Which feature: the engine's forward returns the final-normed hidden state (the C++ layer loop
returns only that), whose product with lm_head IS the target's logits. EAGLE reads the
second-to-top (pre-norm) features; the normed ones carry the same information up to a
per-token scale, need no change to the target's kernels, and make the head's output directly
comparable to the target's (`target logits = lm_head(f)`), so the head is trained to predict
exactly them.

The layer: RMSNorm -> attention (GQA, RoPE, its own one-layer paged KV cache) -> RMSNorm ->
SwiGLU, the target's layer shape, initialized from the target's last layer; an input
projection fc: [f_j ; embed(token_{j+1})] (2 x 576) -> 576 before it and an RMSNorm after it.
Training (`train_draft.py`): self-distillation, smooth-L1 on the predicted feature plus
cross-entropy against the target's own greedy token, over the reduced vocabulary, for the
first draft step (the target's true feature) and, unrolled (`unrolled_forward`, EAGLE-3's
training-time test), for the next ones (the head's own predicted feature).

How it runs in the engine (`EagleProposer`): the target's verification forward hands every
computed token's feature to the proposer (`observe`); at the next `propose` the head catches
up over the positions whose features are now known (one batched forward over all requests,
the accepted tokens and the new one), which gives x_1; then one batched one-token step per
further draft token, each feeding the head's own predicted feature back in. The head's K/V
for drafted positions is dropped before the next catch-up (they were computed from its own
guesses, not from the target's features).
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kv import KVPool, PagedAllocator
from engine.model.attention import build_metadata
from engine.model.llama import LlamaModel, rope_inv_freq
from engine.request import Request
from engine.sampler import probabilities
from engine.spec.draft import Proposal
from engine.spec.rejection import sample_from

VOCAB_SIZE = 8192  # the reduced readout: tokens the head may draft (FR-Spec)
WEIGHT_NAMES = ("fc", "in_norm", "qkv", "o", "post_norm", "gate_up", "down", "out_norm")
LINEAR_NAMES = ("fc", "qkv", "o", "gate_up", "down")
TRAIN_COMMAND = "python -m engine.spec.train_draft"


def head_path(model_name: str = "smollm2-135m") -> Path:
    """Where train_draft writes the trained head for this target (the ServeLab cache)."""
    from engine.model.loader import cache_root

    return cache_root() / "drafts" / f"eagle-{Path(model_name).name}.safetensors"


# ---------------------------------------------------------------------------------------------
# The weights: a dict of tensors, saved as safetensors


def init_weights(target: LlamaModel, vocab: Tensor, seed: int = 0, fc: Tensor | None = None,
                 ) -> dict[str, Tensor]:
    """A fresh head for `target` in fp32: the decoder layer copied from the target's last
    layer, fc = [identity | small random] (so at first the head reads the target's feature and
    a little of the next token), out_norm = the target's final norm. vocab: [V'] token ids.
    Given `fc` (train_draft.ridge_fc: the best linear head), the head starts as that linear
    map instead: fc is used as given and the layer's output projections (o, down) are zero,
    so attention and MLP add nothing until training moves them."""
    cfg = target.cfg
    h = cfg.hidden_size
    gen = torch.Generator().manual_seed(seed)
    last = target.plain_linear_weights(cfg.num_layers - 1)
    layer = target.loaded.weights
    p = f"layers.{cfg.num_layers - 1}."
    start = torch.cat([torch.eye(h), torch.randn(h, h, generator=gen) * (0.02 / h ** 0.5) * 10],
                      dim=1)
    w = {
        "fc": start if fc is None else fc,  # [H, 2H]
        "in_norm": layer[p + "input_layernorm.weight"],
        "qkv": last["qkv"], "o": last["o"],
        "post_norm": layer[p + "post_attention_layernorm.weight"],
        "gate_up": last["gate_up"], "down": last["down"],
        "out_norm": layer["norm.weight"],
    }
    w = {k: v.detach().float().clone().contiguous() for k, v in w.items()}
    if fc is not None:
        w["o"].zero_()
        w["down"].zero_()
    w["vocab"] = vocab.to(torch.int64).contiguous()
    return w


def save_weights(weights: dict[str, Tensor], path: Path, meta: dict | None = None) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own, then one rename: two writers never share a half-written file
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp),
                  metadata={k: str(v) for k, v in (meta or {}).items()})
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def load_weights(path: Path) -> tuple[dict[str, Tensor], dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})


def check_weights(w: dict[str, Tensor], target: LlamaModel, where: str) -> None:
    cfg = target.cfg
    h = cfg.hidden_size
    missing = [n for n in (*WEIGHT_NAMES, "vocab") if n not in w]
    if missing:
        raise ValueError(f"{where}: not an EAGLE head for this model (missing {missing})")
    if w["fc"].shape != (h, 2 * h) or w["qkv"].shape[1] != h:
        raise ValueError(f"{where}: made for hidden size {w['fc'].shape[0]}, the target has {h}")
    v = w["vocab"]
    if v.ndim != 1 or len(v) == 0 or int(v.min()) < 0 or int(v.max()) >= cfg.vocab_size:
        raise ValueError(f"{where}: its vocabulary ids do not fit the target's "
                         f"{cfg.vocab_size} tokens")


def rope_tables(cfg, max_positions: int) -> tuple[Tensor, Tensor]:
    """fp32 cos and sign-folded sin [max_positions, head_dim], as LlamaModel builds them."""
    inv_freq = rope_inv_freq(cfg)
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    sin = emb.sin()
    sin[:, : cfg.head_dim // 2] *= -1
    return emb.cos(), sin


def _rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


# ---------------------------------------------------------------------------------------------
# Training forward: whole sequences at once, fp32 parameters (autograd)


def train_forward(w: dict[str, Tensor], cfg, feats: Tensor, next_emb: Tensor, cos: Tensor,
                  sin: Tensor) -> Tensor:
    """feats: [B, T, H] the target's features f_0..f_{T-1}; next_emb: [B, T, H] embeddings of
    tokens 1..T; cos, sin: [T, d] -> predicted features [B, T, H] (row j predicts f_{j+1}).
    Causal attention over the sequence (right padding does not disturb real positions)."""
    b, t, h = feats.shape
    hq, hkv, d, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    x = F.linear(torch.cat([feats, next_emb], dim=-1), w["fc"])  # [B, T, H]
    a = F.rms_norm(x, (h,), eps=eps) * w["in_norm"]
    qkv = F.linear(a, w["qkv"])
    q = qkv[..., : hq * d].view(b, t, hq, d)
    k = qkv[..., hq * d: (hq + hkv) * d].view(b, t, hkv, d)
    v = qkv[..., (hq + hkv) * d:].view(b, t, hkv, d)
    q, k = _rope(q, cos[:, None], sin[:, None]), _rope(k, cos[:, None], sin[:, None])
    q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, heads, T, d]
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + F.linear(att.transpose(1, 2).reshape(b, t, hq * d), w["o"])
    m = F.rms_norm(x, (h,), eps=eps) * w["post_norm"]
    gate, up = F.linear(m, w["gate_up"]).chunk(2, dim=-1)
    x = x + F.linear(F.silu(gate) * up, w["down"])
    return F.rms_norm(x, (h,), eps=eps) * w["out_norm"]


def unrolled_forward(w: dict[str, Tensor], cfg, feats: Tensor, next_embs: list[Tensor],
                     cos: Tensor, sin: Tensor) -> list[Tensor]:
    """The training-time test (EAGLE-3, Li et al. 2025, arXiv:2503.01840; HASS): the head run
    as `EagleProposer.propose` runs it, `depth = len(next_embs)` draft steps after every
    position at once.

    feats: [B, T, H] the target's features f_0..f_{T-1}; next_embs[r]: [B, T, H] the
    embeddings of tokens r + 1 .. r + T; cos, sin: [T + depth, d] -> depth predictions
    [B, T, H]: block r row j is the (r + 1)-th draft step after the target's feature f_j, so it
    predicts f_{j+1+r} (and, through the readout, token j + 2 + r). Block 0 is
    `train_forward`. Block r >= 1 reads block r - 1's prediction (the head's own feature, as
    when drafting) at position j + r and attends, as the head's paged KV does when drafting,
    to the target-fed positions 0..j (block 0's keys) and to its own chain (blocks 1..r,
    row j)."""
    b, t, h = feats.shape
    hq, hkv, d, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    i = torch.arange(t, device=feats.device)
    causal = i[:, None] >= i[None, :]
    diag = i[:, None] == i[None, :]
    keys: list[Tensor] = []
    values: list[Tensor] = []
    outs: list[Tensor] = []
    f = feats
    for r, emb in enumerate(next_embs):
        c, s = cos[r:r + t, None], sin[r:r + t, None]
        x = F.linear(torch.cat([f, emb], dim=-1), w["fc"])  # [B, T, H]
        a = F.rms_norm(x, (h,), eps=eps) * w["in_norm"]
        qkv = F.linear(a, w["qkv"])
        q = qkv[..., : hq * d].view(b, t, hq, d)
        k = qkv[..., hq * d: (hq + hkv) * d].view(b, t, hkv, d)
        v = qkv[..., (hq + hkv) * d:].view(b, t, hkv, d)
        q, k = _rope(q, c, s), _rope(k, c, s)
        keys.append(k.transpose(1, 2))
        values.append(v.transpose(1, 2))
        q = q.transpose(1, 2)  # [B, heads, T, d]
        if r == 0:
            att = F.scaled_dot_product_attention(q, keys[0], values[0], is_causal=True,
                                                 enable_gqa=True)
        else:
            mask = torch.cat([causal] + [diag] * r, dim=1)  # [T, (r + 1) T]
            att = F.scaled_dot_product_attention(q, torch.cat(keys, dim=2),
                                                 torch.cat(values, dim=2), attn_mask=mask,
                                                 enable_gqa=True)
        x = x + F.linear(att.transpose(1, 2).reshape(b, t, hq * d), w["o"])
        m = F.rms_norm(x, (h,), eps=eps) * w["post_norm"]
        gate, up = F.linear(m, w["gate_up"]).chunk(2, dim=-1)
        x = x + F.linear(F.silu(gate) * up, w["down"])
        f = F.rms_norm(x, (h,), eps=eps) * w["out_norm"]
        outs.append(f)
    return outs


# ---------------------------------------------------------------------------------------------
# Inference: the head in the engine's dtype, layout and kernels


class EagleHead:
    """The trained head on the target's device, dtype, weight layout, instruction set and layer
    ops: the engine's execution plan (engine/plan.py) decides them for both, and the head reads
    the plan's row of engine/model/layouts.py as the target does."""

    def __init__(self, target: LlamaModel, weights: dict[str, Tensor], plan=None):
        """plan: the engine's ExecutionPlan (its layout, instruction set and layer loop); None:
        the target's, which its plan built (tests that build a target without an engine)."""
        self.cfg, self.target = target.cfg, target
        self.device, self.dtype = target.device, target.dtype
        self.ops = target.ops
        dev, dt = target.device, target.dtype
        w = {n: weights[n].to(device=dev, dtype=dt).contiguous() for n in WEIGHT_NAMES}
        self.vocab = weights["vocab"].to(device=dev, dtype=torch.long)  # [V']
        readout = target.plain_lm_head[self.vocab].contiguous()  # [V', H], frozen, shared rows
        row, isa = (plan.row, plan.isa) if plan is not None else (target.row, target.isa)
        if (row, isa) != (target.row, target.isa):
            raise ValueError(f"the plan's layout {row.name!r} ({isa}) is not the target's "
                             f"{target.layout!r} ({target.isa})")
        self.row, self.isa = row, isa  # what the head runs: the plan's, read back by tests
        if row.gguf:
            # the target's format for the head too: its linear weights quantized to Q8_0 here
            # (a float head would read several times the bytes of the quantized one), its
            # readout the rows of the target's own Q8_0 output head
            from engine.model.gguf import quantize_q8_0, read_linear_weights

            for n in LINEAR_NAMES:
                w[n] = quantize_q8_0(weights[n])
            readout = read_linear_weights(target.loaded)["lm_head"][self.vocab].contiguous()
        if row.pack is not None:  # laid out as the target's: AMX tiles, or GGUF rows regrouped
            for n in LINEAR_NAMES:  # by 16 columns for the integer kernels
                w[n] = row.pack(w[n], weights[n].shape[1])
            readout = row.pack(readout, self.cfg.hidden_size)
        self.linear = row.linear_for(isa)  # the target's matmul, on the plan's instruction set
        self.w, self.readout = w, readout
        self.embed = target.embed  # [vocab, H], the target's
        self.num_params = sum(weights[n].numel() for n in WEIGHT_NAMES)
        self.readout_params = len(self.vocab) * self.cfg.hidden_size
        if row.gguf:  # the bytes a step reads: Q8_0 rows, fp32 norms
            self.weight_bytes = sum(t.numel() * t.element_size() for t in (*w.values(), readout))
        else:
            elt = torch.tensor([], dtype=dt).element_size()
            self.weight_bytes = (self.num_params + self.readout_params) * elt
        self.q_size = self.cfg.num_heads * self.cfg.head_dim
        self.kv_size = self.cfg.num_kv_heads * self.cfg.head_dim
        self.scale = self.cfg.head_dim ** -0.5
        # the layer in the C++ layer loop where the plan runs the target's there (one call
        # instead of ~15 operators), the same kernels, so the same bits
        # (tests/engine/test_spec_eagle.py)
        self.cpp_loop = (plan.layer_loop == "cpp" if plan is not None
                         else target.cpp_layer_weights is not None)
        self.cpp_weights = [w[n] for n in ("in_norm", "qkv", "o", "post_norm", "gate_up", "down")]

    @torch.inference_mode()
    def forward(self, feats: Tensor, token_ids: Tensor, positions: Tensor, meta, kv, backend,
                ) -> Tensor:
        """feats: [N, H] (f_j), token_ids: [N] (token j + 1), positions: [N] (j, for RoPE),
        meta: the head's attention metadata, kv: (k_cache, v_cache) -> features [N, H]."""
        cfg, w, ops, linear = self.cfg, self.w, self.ops, self.linear
        n, eps = feats.shape[0], cfg.rms_norm_eps
        hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        tm = self.target
        cos = tm.cos[positions].unsqueeze(1)  # [N, 1, d]
        sin = tm.sin_signed[positions].unsqueeze(1)
        x = linear(torch.cat([feats.to(self.dtype), self.embed[token_ids]], dim=-1), w["fc"])
        if self.cpp_loop and tm.runs_cpp_layer_loop(meta, backend):
            return torch.ops.servelab.decode_layers(
                x, cos, sin, self.cpp_weights, w["out_norm"], [kv[0]], [kv[1]],
                meta.slot_mapping, meta.block_tables, meta.seq_lens, meta.query_start_loc, hq,
                hkv, self.scale, eps, self.row.activations or "float", self.isa)
        a = ops.rms_norm(x, w["in_norm"], eps)
        qkv = linear(a, w["qkv"])
        qk_size = self.q_size + self.kv_size
        qk = ops.rope(qkv[:, :qk_size].view(n, hq + hkv, d), cos, sin)
        q, k = qk[:, :hq], qk[:, hq:]
        v = qkv[:, qk_size:].view(n, hkv, d)
        backend.store_kv(kv[0], kv[1], k, v, meta)
        attn = backend.forward(q, kv[0], kv[1], meta, self.scale)  # [N, Hq, d]
        x, m = ops.add_rms_norm(x, linear(attn.reshape(n, self.q_size), w["o"]),
                                w["post_norm"], eps)
        mlp = linear(ops.silu_mul(linear(m, w["gate_up"])), w["down"])
        _, out = ops.add_rms_norm(x, mlp, w["out_norm"], eps)
        return out

    def logits(self, feats: Tensor) -> Tensor:
        """[rows, H] -> fp32 logits over the reduced vocabulary [rows, V']."""
        return self.linear(feats, self.readout).float()


def load_head(target: LlamaModel, path: str | Path | None, model_name: str,
              plan=None) -> EagleHead:
    """The head at `path` (None: the trained one in the cache), laid out as `plan` (the
    engine's ExecutionPlan) says; a clear error if missing."""
    from engine.model import weights_cache

    p = Path(path) if path is not None else head_path(model_name)
    if not p.is_file():
        if path is not None:
            raise ValueError(f"spec.draft_model {str(path)!r}: no such EAGLE head file")
        raise ValueError(f"the EAGLE draft head is not trained yet ({p} is missing): build it "
                         f"with `{TRAIN_COMMAND}` (about 15 minutes on 2 CPU cores)")
    stat = p.stat()
    key = (str(p), stat.st_mtime_ns, stat.st_size, str(target.device), target.dtype,
           target.layout, id(target))

    def build() -> EagleHead:
        weights, _ = load_weights(p)
        check_weights(weights, target, str(p))
        return EagleHead(target, weights, plan)

    return weights_cache.get("eagle", key, build)


def head_info(path: str | Path | None = None, model_name: str = "smollm2-135m") -> dict | None:
    """What the trained head's file says about itself (None if not trained yet)."""
    p = Path(path) if path is not None else head_path(model_name)
    if not p.is_file():
        return None
    weights, meta = load_weights(p)
    info = dict(meta)
    info["path"] = str(p)
    info["params"] = sum(weights[n].numel() for n in WEIGHT_NAMES if n in weights)
    info["vocab_size"] = int(weights["vocab"].numel()) if "vocab" in weights else 0
    return info


# ---------------------------------------------------------------------------------------------
# The proposer


@dataclass
class FeatureBuffer:
    """The target's features of one request, for positions start .. start + len(tokens) - 1,
    with the token each was computed for (so a rejected draft's feature is recognized)."""

    start: int
    feats: Tensor  # [capacity, H]
    tokens: list[int] = field(default_factory=list)


@dataclass
class HeadSeq:
    """The head's KV for one request: positions start .. start + num_true - 1 hold K/V
    computed from the target's features; drafted positions after them are dropped next time."""

    request_id: str
    start: int = 0
    num_true: int = 0
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # slots in use (true + drafted), for the allocator


class EagleProposer:
    """Drafts with an EagleHead from the target's features, batched across requests."""

    def __init__(self, engine, spec_config):
        self.engine = engine
        self.head = load_head(engine.model, spec_config.draft_model, engine.config.model,
                              engine.plan)
        self.min_confidence = spec_config.min_confidence
        mc = engine.model_config
        num_blocks, bs = engine.allocator.num_blocks, engine.config.block_size
        self.block_size = bs
        self.pool = KVPool(1, num_blocks, bs, mc.num_kv_heads, mc.head_dim, engine.dtype,
                           engine.device)
        self.allocator = PagedAllocator(num_blocks, bs)
        self.capacity = engine.config.max_model_len + spec_config.num_speculative_tokens + 2
        self.seqs: dict[str, HeadSeq] = {}
        self.buffers: dict[str, FeatureBuffer] = {}
        self.vocab = mc.vocab_size
        self.forward_s = 0.0  # time in head forwards (benchmarks)
        self.num_forwards = 0

    # --- lifetime ---------------------------------------------------------------------------
    def release(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.allocator.free(seq)
        self.buffers.pop(request_id, None)

    def sync(self, running: list[Request]) -> None:
        live = {r.request_id for r in running}
        for rid in [rid for rid in set(self.seqs) | set(self.buffers) if rid not in live]:
            self.release(rid)

    # --- the target's features --------------------------------------------------------------
    def observe(self, req: Request, start: int, token_ids: list[int], feats: Tensor) -> None:
        """The target computed token_ids at positions start.. and these are its features
        [len, H]: keep them (overwriting anything from `start` on)."""
        buf = self.buffers.get(req.request_id)
        n = len(token_ids)
        if buf is None or start < buf.start or start > buf.start + len(buf.tokens):
            # new, or recomputed from before what we hold, or a gap (prefix cache): restart
            buf = FeatureBuffer(start, torch.empty(self.capacity, feats.shape[1],
                                                   dtype=feats.dtype, device=feats.device))
            self.buffers[req.request_id] = buf
            seq = self.seqs.get(req.request_id)
            if seq is not None and seq.start != start:
                self.allocator.free(seq)
                del self.seqs[req.request_id]
        off = start - buf.start
        if off + n > buf.feats.shape[0]:
            return
        buf.feats[off:off + n] = feats
        del buf.tokens[off:]
        buf.tokens.extend(token_ids)
        seq = self.seqs.get(req.request_id)
        if seq is not None and seq.num_true > off:
            seq.num_true = off  # recomputed: the head's K/V from there on is stale

    def _valid(self, req: Request, buf: FeatureBuffer) -> int:
        """How many of buf's features belong to the request's actual tokens (a prefix)."""
        toks = req.all_token_ids
        n = 0
        for i, t in enumerate(buf.tokens):
            if buf.start + i >= len(toks) or toks[buf.start + i] != t:
                break
            n += 1
        return n

    # --- one propose ------------------------------------------------------------------------
    def _forward(self, seqs: list[HeadSeq], starts: list[int], feats: list[Tensor],
                 tokens: list[list[int]]) -> Tensor:
        """One batched head forward: seq i computes head positions starts[i] .. (real
        positions; slots from starts[i] - seq.start) -> the last row's feature per seq [B, H]."""
        t0 = time.perf_counter()
        bs = self.block_size
        ids, pos, slots, qlens, slens, tables, last = [], [], [], [], [], [], []
        for seq, s, toks in zip(seqs, starts, tokens):
            n = len(toks)
            rel = s - seq.start
            ids.extend(toks)
            pos.extend(range(s, s + n))
            tab = seq.block_table
            slots.extend(tab[p // bs] * bs + p % bs for p in range(rel, rel + n))
            qlens.append(n)
            slens.append(rel + n)
            tables.append(tab)
            last.append(len(ids) - 1)
        dev = self.engine.device
        meta = build_metadata(qlens, slens, tables, slots, bs, dev)
        f = feats[0] if len(feats) == 1 else torch.cat(feats)
        out = self.head.forward(f, torch.tensor(ids, device=dev), torch.tensor(pos, device=dev),
                                meta, self.pool.layers[0], self.engine.backend)
        if len(last) != out.shape[0]:
            out = out[torch.tensor(last, device=dev)]
        self.forward_s += time.perf_counter() - t0
        self.num_forwards += 1
        return out  # [B, H]

    def propose(self, reqs: list[Request], ks: list[int]) -> list[Proposal]:
        out = [Proposal([], None, []) for _ in reqs]
        active, seqs, starts, feats, tokens = [], [], [], [], []
        for i, (req, k) in enumerate(zip(reqs, ks)):
            buf = self.buffers.get(req.request_id)
            if k <= 0 or buf is None:
                continue
            n = req.num_tokens
            valid = self._valid(req, buf)
            # head position j needs f_j and token j + 1: j up to n - 2, all features known
            if buf.start + valid < n - 1 or n - 1 <= buf.start:
                continue
            seq = self.seqs.get(req.request_id)
            if seq is None:
                seq = self.seqs[req.request_id] = HeadSeq(req.request_id, start=buf.start)
            keep = min(seq.num_true, n - 1 - seq.start)
            self.allocator.truncate(seq, keep)
            seq.num_computed_tokens = keep
            total = (n - 1 - seq.start) + k - 1  # true positions, then k - 1 drafted ones
            if not self.allocator.ensure_slots(seq, total):
                continue
            first = seq.start + keep  # the first head position to compute
            toks = req.all_token_ids
            active.append(i)
            seqs.append(seq)
            starts.append(first)
            feats.append(buf.feats[first - buf.start: n - 1 - buf.start])
            tokens.append(toks[first + 1: n])
            seq.num_true = seq.num_computed_tokens = n - 1 - seq.start
        if not active:
            return out
        h = self._forward(seqs, starts, feats, tokens)  # [B, H]: f^_{n-1}
        live = list(range(len(active)))
        step = 0
        while True:
            logits = self.head.logits(h)  # [B, V']
            chosen = self._choose(logits, [reqs[active[j]] for j in live],
                                  [out[active[j]] for j in live])
            step += 1
            nxt = [j for j, ok in zip(live, chosen) if ok and step < ks[active[j]]]
            if not nxt:
                break
            rows = [live.index(j) for j in nxt]
            h = h[rows] if len(rows) != len(live) else h
            live = nxt
            # feed (f^, x_step) at position n - 2 + step
            pos0 = [reqs[active[j]].num_tokens - 2 + step for j in live]
            for j in live:
                seqs[j].num_computed_tokens += 1
            h = self._forward([seqs[j] for j in live], pos0, [h],
                              [[out[active[j]].token_ids[-1]] for j in live])
        for p in out:
            if p.p_draft is not None:
                p.p_draft = torch.stack(p.p_draft)
        return out

    def _choose(self, logits: Tensor, reqs: list[Request], props: list[Proposal]) -> list[bool]:
        """Each row's next draft token (over the reduced vocabulary, mapped back to token ids);
        returns whether each row drafts on. Dynamic k: a greedy row whose head gives its best
        token less than min_confidence drafts nothing more, not even that token (a token the
        head doubts costs a verification row and is mostly rejected)."""
        soft = torch.softmax(logits, dim=-1)  # [B, V']
        best = soft.argmax(dim=-1).tolist()
        vocab = self.head.vocab
        go = []
        for row, (req, prop) in enumerate(zip(reqs, props)):
            if req.sampling.greedy:
                p = float(soft[row, best[row]])
                if p < self.min_confidence:
                    go.append(False)
                    continue
                tok = int(vocab[best[row]])
                prop.p_draft_x.append(p)
                go.append(True)
            else:
                full = torch.full((self.vocab,), float("-inf"), dtype=logits.dtype)
                full[vocab.cpu()] = logits[row].cpu()
                probs = probabilities(full, req.sampling)  # [V]
                tok = int(sample_from(probs[None], req.generator)[0])
                prop.p_draft_x.append(float(probs[tok]))
                if prop.p_draft is None:
                    prop.p_draft = []
                prop.p_draft.append(probs)
                go.append(True)
            prop.token_ids.append(tok)
        return go
