"""The draft-model proposer: a cheaper model with its own paged KV drafts k tokens per step.

Speculative decoding (Leviathan, Kalman & Matias 2023, arXiv:2211.17192; Chen et al. 2023,
arXiv:2302.01318) needs a draft that is cheap and agrees with the target often. The draft
here is any Llama-family model sharing the target's tokenizer (`SpecConfig.draft_model`, a
local Hugging Face folder) or, by default, a compressed copy of the target itself.

How it runs inside one engine step (before the scheduler, over every request that decodes):

1. catch up: each speculating request has its own `DraftSeq` (token ids whose K/V the
   draft's pool holds, and a block table in the draft's own `PagedAllocator`). Its tokens
   are compared with the request's; the common prefix is kept (the rest was a rejected
   draft: rolled back) and the missing tokens are run in ONE batched varlen forward: the
   whole prompt + output the first time, afterwards the accepted tokens + the new one.
   The logits at each request's last token give its first draft token x_1.
2. draft: k - 1 more batched forwards of one token per request (x_i in, x_{i+1} out).
   Greedy requests take the draft's argmax. Sampling requests draw from the draft's own
   distribution (after the request's temperature / top-k / top-p) with the request's own
   generator: that changes the request's random stream compared with speculation off, so
   a seeded sampling request gives different (equally distributed) tokens with and without
   a draft; it stays lossless because the verifier knows p_draft exactly.
3. the engine verifies; the next propose keeps only the K/V of accepted tokens
   (`PagedAllocator.truncate`), and state of requests that left `running` (finished,
   preempted) is freed (`sync`, plus `release` from the engine when a request finishes).

The built-in draft for the bundled SmolLM2-135M (`BUILTIN_RECIPE`) is the target's own
layers in int4, group 32, with an int8 lm_head, chosen by measurement over int8 and
truncated-layer candidates (`python -m benchmarks.draft_study`; the figures are in
docs/decisions.md#the-int4-twin-draft).

The bundled model ships as a Q4_1 GGUF (every linear layer stored as 4-bit codes with one
scale and one minimum per group of 32 inputs; the embedding as Q8_0), so the target's fp32
weights ARE 4-bit numbers: an int4 group-32 draft reproduces the decoder layers almost
exactly (only the bfloat16 storage of scales and zeros differs) while reading 8x fewer weight
bytes than fp32. The ~2% disagreement left comes from the bfloat16 activations and the
lm_head (the Q8_0 embedding re-quantized per channel; int4 there costs 7 points).

Small batches run the packed int4/int8 CPU kernels (`_weight_int4pack_mm_for_cpu`,
`_weight_int8pack_mm`), which are fast for a few rows and slow for many; more than
`SMALL_M` rows (a catch-up prefill, many requests at once) run a dequantized bfloat16
copy through oneDNN, which uses the CPU's AMX/AVX-512 bf16 units. Off the CPU (CUDA) the packed kernels are not used and the
built-in draft is that bf16 copy: still lossless, but no cheaper than a bf16 target; give a
smaller `draft_model` there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.kv import KVPool, PagedAllocator
from engine.model import weights_cache
from engine.model.llama import LlamaModel, shared_model
from engine.request import Request
from engine.runner import Chunk, ModelRunner
from engine.sampler import probabilities
from engine.spec.int8 import int8_linear, quantize_linear_weight
from engine.spec.rejection import sample_from

SMALL_M = 8  # at most this many rows: the packed integer kernel; more: dequantized bf16
GROUP = 32  # int4 group size along the input dimension (Q4_1's block size)
_HAS_INT4_CPU = hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


# ---------------------------------------------------------------------------------------------
# Quantized weights and the linear function that reads them


def default_dense_dtype() -> torch.dtype:
    """The many-row copy's dtype where no engine's plan is at hand (tests, studies): this
    machine's plan's `draft_dtype` (engine/plan.py: bf16 where the device has bf16 units, else
    fp32 holding the same bf16-rounded values: a CPU without them emulates a bf16 GEMM many
    times slower than its fp32 one; an AVX2 Zen 3: the draft's chi-square test 178 s)."""
    from engine.model.hardware import draft_dtype

    return draft_dtype()


class QuantWeight(NamedTuple):
    """One linear layer's weight, compressed; `dense` is the dequantized copy (bf16 values)."""

    bits: int  # 4 or 8
    packed: Tensor  # int4: [out, in / 2] uint8 packed codes; int8: [out, in] int8
    scales: Tensor  # int4: [in / GROUP, out, 2] bf16 (scale, zero); int8: [out] bf16
    dense: Tensor  # [out, in] bf16 values (stored in the plan's draft_dtype), for many rows


def quantize_int4(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Asymmetric int4 with one (scale, min) per group of 32 inputs, as GGUF's Q4_1.

    w: [out, in] -> (codes [out, in] int32 in 0..15, scale [out, in/32], minimum [out, in/32]);
    w ~= codes * scale + minimum, per group."""
    out_f, in_f = w.shape
    wg = w.float().reshape(out_f, in_f // GROUP, GROUP)  # [out, groups, 32]
    lo, hi = wg.amin(-1), wg.amax(-1)  # [out, groups]
    scale = hi.sub_(lo).div_(15).clamp_(min=1e-12)
    codes = (wg - lo[..., None]).div_(scale[..., None]).round_().clamp_(0, 15)
    return codes.to(torch.int32).reshape(out_f, in_f), scale, lo


def quant_weight(w: Tensor, bits: int, dense: torch.dtype | None = None) -> QuantWeight:
    """w: [out, in] float -> QuantWeight with the packed kernel's layout; its dense copy in
    `dense` (the plan's draft_dtype; None: this machine's plan's)."""
    dense_dt = dense or default_dense_dtype()
    if bits == 8:
        w8, scale = quantize_linear_weight(w)  # [out, in] int8, [out]
        dense = (w8.float() * scale[:, None]).to(torch.bfloat16).to(dense_dt)
        return QuantWeight(8, w8, scale.to(torch.bfloat16), dense)
    assert bits == 4 and w.shape[1] % GROUP == 0, (bits, w.shape)
    codes, scale, lo = quantize_int4(w)
    out_f, in_f = w.shape
    dense = codes.view(out_f, -1, GROUP).float()  # [out, groups, 32]
    dense = dense.mul_(scale[..., None]).add_(lo[..., None]).reshape(out_f, in_f)
    dense = dense.to(torch.bfloat16).to(dense_dt)
    # the kernel computes w = (code - 8) * scale + zero, so zero = min + 8 * scale
    scale_zero = torch.stack([scale, lo + 8 * scale], dim=-1)  # [out, groups, 2]
    scale_zero = scale_zero.transpose(0, 1).contiguous().to(torch.bfloat16)  # [groups, out, 2]
    packed = codes
    if _HAS_INT4_CPU and w.device.type == "cpu":
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # [out, in/2]
    return QuantWeight(4, packed, scale_zero, dense)


def quant_linear(x: Tensor, w: Tensor | QuantWeight, bias: Tensor | None = None) -> Tensor:
    """F.linear that also takes a QuantWeight. x: [..., in] -> [..., out] in x's dtype."""
    if not isinstance(w, QuantWeight):
        return F.linear(x, w, bias)
    x2d = x.reshape(-1, x.shape[-1])  # [M, in]
    rows = x2d.shape[0]
    if rows <= SMALL_M and x.device.type == "cpu" and (w.bits == 8 or _HAS_INT4_CPU):
        xb = x2d.to(torch.bfloat16).contiguous()
        if w.bits == 8:
            y = int8_linear(xb, w.packed, w.scales)  # [M, out]
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, w.packed, GROUP, w.scales)
    else:
        y = F.linear(x2d.to(w.dense.dtype), w.dense)  # [M, out]
    y = y.to(x.dtype).reshape(*x.shape[:-1], -1)
    return y if bias is None else y + bias


@dataclass(frozen=True)
class DraftRecipe:
    """How to compress the target into a built-in draft."""

    bits: int = 4  # weight bits of every decoder layer's linear layers (4 or 8)
    lm_head_bits: int = 8  # weight bits of the output projection (4 or 8)
    num_layers: int | None = None  # keep only the first N decoder layers (None: all)

    @property
    def name(self) -> str:
        layers = "" if self.num_layers is None else f", first {self.num_layers} layers"
        return f"int{self.bits} layers, int{self.lm_head_bits} lm_head{layers}"


# the measured winner for the bundled model (docs/performance.md)
BUILTIN_RECIPE = DraftRecipe(bits=4, lm_head_bits=8)


class QuantizedLlama(LlamaModel):
    """The target's own network with compressed linear weights (and maybe fewer layers).

    Shares the target's embedding, norms and rotary tables; only the linear layers differ,
    and `forward` is LlamaModel's, reading them through `quant_linear`. No layout of
    engine/model/layouts.py (row None): torch's int4 / int8 kernels, and a dense copy in
    `dense_dtype`, the plan's draft_dtype (None: this machine's plan's)."""

    @torch.inference_mode()
    def __init__(self, target: LlamaModel, recipe: DraftRecipe,
                 dense_dtype: torch.dtype | None = None):
        self.__dict__.update(target.__dict__)  # embed, norms, cos/sin, ops, sizes: shared
        self.layout, self.row, self.isa = f"int{recipe.bits}", None, None
        self.linear = quant_linear
        self.cpp_layer_weights = None  # the C++ layer loop reads the layouts' weights only
        self.recipe = recipe
        self.dense_dtype = dense_dtype = dense_dtype or default_dense_dtype()
        n = target.cfg.num_layers if recipe.num_layers is None else recipe.num_layers

        def quantize() -> tuple[list[dict], QuantWeight]:
            layers = []
            for i, layer in enumerate(target.layers[:n]):
                q = dict(layer)
                for name, w in target.plain_linear_weights(i).items():  # whatever the layout
                    q[name] = quant_weight(w, recipe.bits, dense_dtype)
                layers.append(q)
            return layers, quant_weight(target.plain_lm_head, recipe.lm_head_bits, dense_dtype)

        # quantized from the plain weights, so the same for a packed and a plain target
        key = (str(target.loaded.folder), str(target.device), target.dtype, recipe, dense_dtype)
        self.layers, self.lm_head = weights_cache.get("draft", key, quantize)

    @property
    def weight_bytes(self) -> int:
        """Bytes a small-batch decode step reads: packed codes and scales."""
        def size(w: QuantWeight) -> int:
            return w.packed.numel() * w.packed.element_size() + w.scales.numel() * 2

        n = sum(size(layer[name]) for layer in self.layers
                for name in ("qkv", "o", "gate_up", "down"))
        return n + size(self.lm_head)


def build_draft_model(engine, spec_config) -> LlamaModel:
    """The draft: a local folder (any Llama-family model with the same tokenizer) or the
    built-in compressed copy of the target."""
    if spec_config.draft_model is None:
        return QuantizedLlama(engine.model, BUILTIN_RECIPE, engine.plan.torch_draft_dtype)
    from engine.model.loader import load_model

    loaded = load_model(spec_config.draft_model, engine.dtype)
    if loaded.tokenizer.get_vocab() != engine.tokenizer.get_vocab():
        raise ValueError(f"spec.draft_model {spec_config.draft_model!r} does not share the "
                         f"target's tokenizer")
    k = spec_config.num_speculative_tokens
    # the plan's device, dtype and layer ops, the weights plain (ExecutionPlan.for_draft_model)
    return shared_model(loaded, engine.plan.for_draft_model(), engine.config.max_model_len + k + 1)


# ---------------------------------------------------------------------------------------------
# The proposer


@dataclass
class DraftSeq:
    """The draft's view of one request: what its KV pool holds for it."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)  # tokens whose K/V the draft holds
    block_table: list[int] = field(default_factory=list)  # in the draft's own allocator

    @property
    def num_computed_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Proposal:
    """One request's draft."""

    token_ids: list[int]  # x_1 .. x_k
    p_draft: Tensor | None  # [k, vocab] the distributions sampled from (sampling requests)
    p_draft_x: list[float]  # the draft's probability of each x_i (greedy: plain softmax)
    source: str = "model"  # who drafted it: "model" (draft / eagle) or "lookup" (n-gram)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class DraftProposer:
    """Runs the draft model over its own paged KV pool, batched across requests."""

    def __init__(self, engine, spec_config):
        self.engine = engine
        self.model = build_draft_model(engine, spec_config)
        mc = self.model.cfg
        num_blocks, block_size = engine.allocator.num_blocks, engine.config.block_size
        self.pool = KVPool(len(self.model.layers), num_blocks, block_size, mc.num_kv_heads,
                           mc.head_dim, self.model.dtype, engine.device)
        self.allocator = PagedAllocator(num_blocks, block_size)
        self.runner = ModelRunner(self.model, self.pool, self.allocator, engine.backend,
                                  engine.device)
        self.seqs: dict[str, DraftSeq] = {}
        self.vocab = engine.model_config.vocab_size  # the target's
        self.forward_s = 0.0  # time spent in draft forwards (for benchmarks)

    # --- lifetime ---------------------------------------------------------------------------
    def release(self, request_id: str) -> None:
        seq = self.seqs.pop(request_id, None)
        if seq is not None:
            self.allocator.free(seq)

    def sync(self, running: list[Request]) -> None:
        """Free the state of requests that left `running` (finished or preempted)."""
        live = {r.request_id for r in running}
        for rid in [rid for rid in self.seqs if rid not in live]:
            self.release(rid)

    # --- one propose ------------------------------------------------------------------------
    def _forward(self, chunks: list[Chunk]) -> Tensor:
        """One batched draft forward -> fp32 logits [num_seqs, target vocab] at each chunk's
        last token."""
        t0 = time.perf_counter()
        # on the host: rows are picked one by one, sampled ones with the request's generator
        logits = self.runner.forward(chunks).cpu()  # [num_seqs, draft vocab]
        self.forward_s += time.perf_counter() - t0
        v = logits.shape[1]
        if v > self.vocab:
            logits = logits[:, : self.vocab]
        elif v < self.vocab:  # a draft with a smaller (padded) vocabulary never proposes the rest
            logits = F.pad(logits, (0, self.vocab - v), value=float("-inf"))
        return logits  # [num_seqs, vocab]

    def propose(self, reqs: list[Request], ks: list[int]) -> list[Proposal]:
        """Up to ks[i] drafted tokens for each reqs[i] (every one decoding)."""
        out = [Proposal([], None, []) for _ in reqs]
        active: list[int] = []  # indices into reqs with a seq ready to draft
        seqs: list[DraftSeq] = []
        chunks: list[Chunk] = []
        for i, (req, k) in enumerate(zip(reqs, ks)):
            if k <= 0:
                continue
            seq = self.seqs.get(req.request_id)
            if seq is None:
                seq = self.seqs[req.request_id] = DraftSeq(req.request_id)
            tokens = req.all_token_ids
            n = len(tokens)
            # keep the K/V of the common prefix; at least the last token is recomputed
            keep = min(_common_prefix(seq.token_ids, tokens), n - 1)
            del seq.token_ids[keep:]
            self.allocator.truncate(seq, keep)
            if not self.allocator.ensure_slots(seq, n + k - 1):
                continue  # the draft's pool is full: this request goes without a draft
            active.append(i)
            seqs.append(seq)
            chunks.append(Chunk(seq, keep, tokens[keep:], num_logits=1))
        if not active:
            return out
        logits = self._forward(chunks)  # [B, V]
        for seq, i in zip(seqs, active):
            seq.token_ids = list(reqs[i].all_token_ids)
        for step in range(max(ks[i] for i in active)):
            rows = [j for j, i in enumerate(active) if ks[i] > step]
            if not rows:
                break
            if step > 0:  # feed x_step, get the distribution of x_{step+1}
                live = [seqs[j] for j in rows]
                toks = [out[active[j]].token_ids[-1] for j in rows]
                logits = self._forward([Chunk(s, s.num_computed_tokens, [t], num_logits=1)
                                        for s, t in zip(live, toks)])
                for s, t in zip(live, toks):
                    s.token_ids.append(t)
            else:
                logits = logits[rows]
            self._choose(logits, [reqs[active[j]] for j in rows], [out[active[j]] for j in rows])
            active_next = [active[j] for j in rows]
            seqs = [seqs[j] for j in rows]
            active = active_next
        for p in out:
            if p.p_draft is not None:
                p.p_draft = torch.stack(p.p_draft)  # [k, V]
        return out

    @staticmethod
    def _choose(logits: Tensor, reqs: list[Request], props: list[Proposal]) -> None:
        """Pick each row's next draft token: argmax (greedy) or a draw from the request's
        own sampling distribution with its own generator. logits: [B, V] fp32."""
        soft = None
        for row, (req, prop) in enumerate(zip(reqs, props)):
            if req.sampling.greedy:
                if soft is None:
                    soft = torch.softmax(logits, dim=-1)  # [B, V], only for the records
                tok = int(logits[row].argmax())
                prop.p_draft_x.append(float(soft[row, tok]))
            else:
                probs = probabilities(logits[row], req.sampling)  # [V]
                tok = int(sample_from(probs[None], req.generator)[0])
                prop.p_draft_x.append(float(probs[tok]))
                if prop.p_draft is None:
                    prop.p_draft = []
                prop.p_draft.append(probs)
            prop.token_ids.append(tok)

