"""The "beyond" page's four pictures as pure computations (app/pages/beyond.py draws them,
tests/app/test_beyond_calc.py checks them against the engine's own code and hand-worked cases).

1. The acceptance rule: a target p and a draft q over the same tokens; the draft token is
   kept with probability min(1, p/q), so the chance a draft token survives is Σ min(p, q) (the
   overlap of the two bar charts), and a rejection is replaced by a token drawn from the
   residual normalize((p − q)⁺). `acceptance_by_sampling` runs the engine's rejection sampler
   (engine/spec/rejection.py) many times so a test can hold the formula to it.
2. A GPU-scale roofline for one decode step of a dense model: bytes = weights + the KV the
   batch reads, FLOPs = 2·params per token + attention; time = max(bytes / bandwidth,
   FLOPs / peak). Verifying k drafted tokens is one step over k + 1 tokens per request, which
   costs about one decode step while the step is memory-bound and (k + 1) of them once it is
   compute-bound: that is why speculation's gain falls with batch. The GPU numbers and the
   model's shape come from lessons/figures.json (each with its datasheet or paper).
3. One request's timeline from a real engine run's step reports: arrival, each step's new
   tokens (a burst of several when a draft was accepted), TTFT, ITL and TPOT.
4. One request's blocks through their life, driven through the engine's own PagedAllocator:
   allocated on demand, shared by prefix, shared by a second sample (n = 2) and copied on
   write, preempted (freed) and recomputed.

Nothing here draws or imports streamlit's page machinery beyond app.calculators' formula.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from app.calculators import tokens_per_pass
from lessons.figures import load_figures

ROOT = Path(__file__).resolve().parents[1]
NEXT_TOKEN_FILE = ROOT / "assets" / "beyond" / "next_token.json"
NEXT_TOKEN_PROMPT = "The capital of France is"
NEXT_TOKEN_TOP = 12

__all__ = ["acceptance_by_sampling", "as_distribution", "block_life", "crossover_batch",
           "DenseModel", "draft_from", "GPU", "gpus", "llama2_7b", "load_next_token",
           "max_batch", "overlap", "pick_request", "request_timeline", "residual", "ridge_batch",
           "roofline_rows", "spec_speedup", "step_cost", "tokens_per_pass"]


# ------------------------------------------------------------------ 1. the acceptance rule


def as_distribution(p: torch.Tensor, name: str) -> torch.Tensor:
    p = torch.as_tensor(p, dtype=torch.float64)
    if p.dim() != 1 or p.numel() == 0 or bool((p < 0).any()) or float(p.sum()) <= 0:
        raise ValueError(f"{name} must be a non-empty vector of non-negative numbers")
    return p / p.sum()


def draft_from(p, temperature: float = 1.0, mix: float = 0.0) -> torch.Tensor:
    """A draft made from the target: p^(1/temperature) renormalised (temperature > 1 flattens
    it, < 1 sharpens it), then moved a share `mix` back toward p itself (mix 1: q = p)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1], got {mix}")
    p = as_distribution(p, "p")
    tempered = p.pow(1.0 / temperature)
    tempered = tempered / tempered.sum()
    return (1.0 - mix) * tempered + mix * p


def overlap(p, q) -> float:
    """Σ min(p, q): the probability that a token drawn from q is kept by the rule."""
    p, q = as_distribution(p, "p"), as_distribution(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p and q must cover the same tokens ({p.numel()} vs {q.numel()})")
    return float(torch.minimum(p, q).sum())


def residual(p, q) -> torch.Tensor:
    """normalize((p − q)⁺), by the engine's own function (p where q covers p everywhere)."""
    from engine.spec.rejection import residual_distribution

    return residual_distribution(as_distribution(p, "p"), as_distribution(q, "q"))


def acceptance_by_sampling(p, q, draws: int = 20000, seed: int = 0) -> dict:
    """Draw `draws` draft tokens from q and verify each with the engine's rejection sampler
    (k = 1). Returns the accepted share and the emitted first tokens' frequencies (which must
    be p: the rule is lossless)."""
    from engine.spec.rejection import rejection_sample_batch, sample_from

    p, q = as_distribution(p, "p"), as_distribution(q, "q")
    gen = torch.Generator().manual_seed(seed)
    draft = sample_from(q.expand(draws, -1), gen).unsqueeze(1)  # [draws, 1]
    p_target = p.expand(draws, 2, -1)  # row 0 verifies the draft; row 1 is the bonus
    num_accepted, next_token, _, _ = rejection_sample_batch(
        draft, p_target, q.expand(draws, 1, -1), gen)
    first = torch.where(num_accepted > 0, draft[:, 0], next_token)
    freq = torch.bincount(first, minlength=p.numel()).double() / draws
    return {"accepted": float(num_accepted.double().mean()), "first_token_freq": freq}


def load_next_token(path: Path = NEXT_TOKEN_FILE) -> dict | None:
    """The recorded next-token distribution (see `record_next_token`), or None if absent."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not data.get("probs") or len(data["probs"]) != len(data.get("tokens", ())):
        raise ValueError(f"{path}: needs 'tokens' and 'probs' of the same length")
    return data


def record_next_token(model: str = "smollm2-135m", prompt: str = NEXT_TOKEN_PROMPT,
                      top: int = NEXT_TOKEN_TOP, path: Path = NEXT_TOKEN_FILE) -> dict:
    """Run the bundled model once and keep its top-`top` next-token probabilities after
    `prompt` (the engine's raw logprobs, temperature 1), with the machine and the date."""
    import datetime

    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.recording import machine_facts, machine_line

    eng = LLMEngine(EngineConfig(model=model, max_num_seqs=1, max_model_len=128))
    rid = eng.add_request(eng.tokenize(prompt),
                          SamplingParams(max_tokens=1, temperature=1.0, logprobs=top, seed=0))
    while eng.has_unfinished():
        eng.step()
    _, alternatives = eng.output(rid).logprobs[0]
    ids = [tid for tid, _ in alternatives[:top]]
    data = {
        "model": model, "prompt": prompt,
        "tokens": [eng.tokenizer.decode([tid]) for tid in ids],
        "probs": [math.exp(lp) for _, lp in alternatives[:top]],
        "command": "python -m app.beyond_calc",
        "machine": machine_line(machine_facts()),
        "date": datetime.date.today().isoformat(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return data


# ------------------------------------------------------------------ 2. a GPU-scale roofline


@dataclass(frozen=True)
class GPU:
    name: str
    bandwidth: float  # bytes per second (HBM)
    peak: float  # dense bf16 FLOP/s
    memory: float  # bytes of HBM: weights and KV must fit in it
    bandwidth_figure: str  # the lessons/figures.json names they come from
    peak_figure: str


@dataclass(frozen=True)
class DenseModel:
    name: str
    params: float
    layers: int
    d_model: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int = 2  # bf16 weights
    bytes_per_kv: int = 2  # bf16 KV cache

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_kv

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param


def _fig(name: str) -> float:
    value = load_figures()["figures"][name]["value"]
    return float(value[0] if isinstance(value, list) else value)


def gpus() -> dict[str, GPU]:
    """H100 SXM and H200 SXM, from their datasheets as written in lessons/figures.json."""
    return {
        "H100": GPU("H100 SXM", _fig("h100_bandwidth") * 1e12, _fig("h100_bf16_tflops") * 1e12,
                    _fig("h100_memory") * 1e9, "h100_bandwidth", "h100_bf16_tflops"),
        "H200": GPU("H200 SXM", _fig("h200_bandwidth") * 1e12, _fig("h200_bf16_tflops") * 1e12,
                    _fig("h200_memory") * 1e9, "h200_bandwidth", "h200_bf16_tflops"),
    }


def llama2_7b() -> DenseModel:
    """Llama-2-7B's shape (32 layers, d_model 4096, 32 KV heads of 128; Touvron et al. 2023)."""
    return DenseModel("Llama-2-7B", _fig("llama2_7b_params") * 1e9, 32, 4096, 32, 128)


def step_cost(gpu: GPU, model: DenseModel, batch: int, context: int,
              tokens_per_seq: int = 1) -> dict:
    """One forward step of `batch` requests, each with `context` tokens of KV already cached
    and `tokens_per_seq` new tokens (1: decode; k + 1: verifying k drafted tokens).

    Two kinds of kernel, each on its own roofline, their times added (as real engines run
    them one after the other, not as one fused op whose KV reads would hide the matmuls'
    arithmetic):
      * the weight matmuls (GEMMs): every weight read once; 2·params FLOPs per new token (a
        multiply and an add per weight). They turn compute-bound once enough rows share the
        weights (`crossover_batch`).
      * attention: each request's cached KV read once (all its new tokens attend to the same
        KV), the new tokens' KV written; per layer QKᵀ and AV over the context, 2·context·
        d_model FLOPs each per new token. With full multi-head KV that is about one FLOP per
        byte read: bandwidth-bound at any batch.
    `bound` is the matmuls' (what decides whether verifying k more positions costs real
    work), `attention_bound` attention's."""
    if batch < 1 or context < 0 or tokens_per_seq < 1:
        raise ValueError(f"batch >= 1, context >= 0, tokens_per_seq >= 1; got {batch}, "
                         f"{context}, {tokens_per_seq}")
    new = batch * tokens_per_seq
    gemm_bytes, gemm_flops = model.weight_bytes, 2 * model.params * new
    attn_bytes = model.kv_bytes_per_token * (batch * context + new)
    attn_flops = 4 * model.layers * model.d_model * context * new
    t_gemm = max(gemm_bytes / gpu.bandwidth, gemm_flops / gpu.peak)
    t_attn = max(attn_bytes / gpu.bandwidth, attn_flops / gpu.peak)
    nbytes, flops = gemm_bytes + attn_bytes, gemm_flops + attn_flops
    resident = model.weight_bytes + model.kv_bytes_per_token * batch * (context + tokens_per_seq)
    return {"bytes": nbytes, "flops": flops, "t_mem": nbytes / gpu.bandwidth,
            "t_compute": flops / gpu.peak, "t_gemm": t_gemm, "t_attention": t_attn,
            "time": t_gemm + t_attn, "fits": resident <= gpu.memory,
            "bound": "compute" if gemm_flops / gpu.peak > gemm_bytes / gpu.bandwidth
            else "memory",
            "attention_bound": "compute" if attn_flops / gpu.peak > attn_bytes / gpu.bandwidth
            else "memory"}


def crossover_batch(gpu: GPU, model: DenseModel, context: int = 0,
                    tokens_per_seq: int = 1) -> float:
    """The batch at which the weight matmuls turn compute-bound: their FLOPs' time catches up
    with reading the weights once (step_cost's `bound` flips). The context does not move it:
    attention is its own kernel, and its KV reads stay bandwidth-bound (`context` is kept for
    the callers that pass it)."""
    del context
    return model.weight_bytes * gpu.peak / (gpu.bandwidth * 2 * model.params * tokens_per_seq)


def max_batch(gpu: GPU, model: DenseModel, context: int, tokens_per_seq: int = 1) -> int:
    """The largest batch whose weights and KV (context + new tokens each) fit in the GPU."""
    per_req = model.kv_bytes_per_token * (context + tokens_per_seq)
    return max(0, int((gpu.memory - model.weight_bytes) // per_req))


def ridge_batch(gpu: GPU, model: DenseModel) -> float:
    """The context-free crossover: peak / bandwidth × bytes per weight ÷ 2 FLOPs per weight."""
    return gpu.peak / gpu.bandwidth * model.bytes_per_param / 2


def spec_speedup(gpu: GPU, model: DenseModel, batch: int, context: int, k: int, alpha: float,
                 draft_cost: float = 0.0) -> float:
    """Tokens per second with speculation ÷ without, at one batch: each verify step yields
    (1 − α^(k+1)) / (1 − α) tokens per request and costs a step over k + 1 tokens, plus k
    draft steps each `draft_cost` times a plain decode step."""
    decode = step_cost(gpu, model, batch, context)["time"]
    verify = step_cost(gpu, model, batch, context, k + 1)["time"]
    return tokens_per_pass(alpha, k) * decode / (verify + k * draft_cost * decode)


def roofline_rows(gpu: GPU, model: DenseModel, context: int, k: int, alpha: float,
                  draft_cost: float = 0.0, batches=None) -> list[dict]:
    """Per batch: decode and verify step times (ms), which bound, and speculation's speedup."""
    batches = batches or [2 ** i for i in range(11)]
    rows = []
    for b in batches:
        dec, ver = step_cost(gpu, model, b, context), step_cost(gpu, model, b, context, k + 1)
        rows.append({"batch": b, "decode_ms": 1e3 * dec["time"], "verify_ms": 1e3 * ver["time"],
                     "decode_bound": dec["bound"], "verify_bound": ver["bound"],
                     "fits": ver["fits"],
                     "speedup": spec_speedup(gpu, model, b, context, k, alpha, draft_cost)})
    return rows


# ------------------------------------------------------------------ 3. one request's timeline


def request_timeline(reports: list[dict], request_id: str) -> dict:
    """From a run's step reports: when `request_id` arrived (the start of the first step that
    lists it), each step that gave it tokens (end time, count), TTFT, the ITL gaps and TPOT.
    Times are seconds from the start of the run's first step (sums of the steps' wall_s)."""
    clock, arrive, arrivals = 0.0, None, []
    for rep in reports:
        start, clock = clock, clock + rep["wall_s"]
        seen = request_id in rep.get("waiting", ()) or request_id in rep.get("admitted", ()) \
            or any(s.get("request_id") == request_id for s in rep.get("seats", ()))
        if arrive is None and seen:
            arrive = start
        for em in rep.get("emitted", ()):
            if em["request_id"] == request_id and em["token_ids"]:
                if arrive is None:
                    arrive = start
                arrivals.append({"t": clock, "tokens": len(em["token_ids"]), "step": rep["step"],
                                 "text": em.get("text", "")})
    if not arrivals:
        raise ValueError(f"request {request_id!r} got no tokens in these reports")
    times = [a["t"] for a in arrivals]
    n = sum(a["tokens"] for a in arrivals)
    return {"arrive": arrive, "arrivals": arrivals, "ttft": times[0] - arrive,
            "itl": [b - a for a, b in zip(times, times[1:])],
            "tpot": (times[-1] - times[0]) / (n - 1) if n > 1 else 0.0,
            "tokens": n, "steps": len(arrivals)}


def pick_request(runs: list[list[dict]]) -> str:
    """A request every run served: the one whose largest burst (tokens in one step) is
    largest in any run, ties to the most tokens, so speculation's bursts show."""
    def served(reports):
        out: dict[str, list[int]] = {}
        for rep in reports:
            for em in rep.get("emitted", ()):
                out.setdefault(em["request_id"], []).append(len(em["token_ids"]))
        return out

    per_run = [served(r) for r in runs]
    common = set.intersection(*(set(s) for s in per_run)) if per_run else set()
    if not common:
        raise ValueError("no request appears in every run")
    return max(sorted(common), key=lambda rid: (max(max(s[rid]) for s in per_run),
                                                 sum(per_run[0][rid])))


# ------------------------------------------------------------------ 4. one request's blocks


def block_life(block_size: int = 4) -> list[dict]:
    """Drive the engine's PagedAllocator (prefix caching on) through one request's life and
    return a snapshot after each event: the followed request's block table, each block's
    reference count, and what just happened to it.

    Events: an earlier request with the same system prompt finishes (its full blocks stay
    cached); ours arrives and reuses them (shared by prefix) and gets a fresh block for the
    rest; a second sample (n = 2) forks and holds every block by reference; our next token
    writes into the shared partial block, which is copied first (copy on write); decoding
    fills that block and a new one is allocated on demand; memory runs short and ours is
    preempted (every block released); it comes back and is recomputed, reusing what the cache
    still holds."""
    from engine.config import SamplingParams
    from engine.kv.paged import PagedAllocator
    from engine.request import Request

    bs = block_size
    alloc = PagedAllocator(num_blocks=16, block_size=bs, enable_prefix_caching=True)
    system = list(range(100, 100 + 2 * bs))  # two full blocks of a shared system prompt
    snaps: list[dict] = []

    def computed(req: Request, n: int) -> None:
        if not alloc.ensure_slots(req, n):
            raise RuntimeError("the pool ran out in the block-life script")
        req.num_computed_tokens = n
        alloc.on_computed(req)

    def snap(event: str, req: Request, marks: dict[int, str]) -> None:
        snaps.append({"event": event, "tokens": req.num_tokens,
                      "blocks": [{"logical": i, "physical": b, "refs": alloc.ref_count[b],
                                  "mark": marks.get(i, "held")}
                                 for i, b in enumerate(req.block_table)]})

    earlier = Request("earlier", system + [7, 8], SamplingParams(max_tokens=1))
    alloc.admit(earlier)
    computed(earlier, earlier.num_tokens)
    alloc.free(earlier)

    ours = Request("ours", system + [1, 2, 3], SamplingParams(max_tokens=8, n=2))
    alloc.admit(ours)
    hits = len(ours.block_table)
    computed(ours, ours.num_tokens)
    snap("admit", ours, {**{i: "prefix" for i in range(hits)},
                         **{i: "new" for i in range(hits, len(ours.block_table))}})

    sibling = Request("sibling", list(ours.prompt_token_ids), SamplingParams(max_tokens=8))
    alloc.fork(ours, sibling)
    sibling.num_computed_tokens = ours.num_computed_tokens
    snap("fork", ours, {i: "shared" for i in range(len(ours.block_table))})

    before = list(ours.block_table)
    ours.output_token_ids.append(42)
    computed(ours, ours.num_tokens)
    snap("cow", ours, {i: "copied" for i, b in enumerate(ours.block_table) if b != before[i]})

    while len(ours.block_table) == len(before):  # decode until a new block is needed
        ours.output_token_ids.append(43)
        computed(ours, ours.num_tokens)
    snap("grow", ours, {len(ours.block_table) - 1: "new"})

    freed = list(ours.block_table)
    alloc.free(ours)
    ours.num_computed_tokens = 0
    ours.num_preemptions += 1
    snaps.append({"event": "preempt", "tokens": ours.num_tokens,
                  "blocks": [{"logical": i, "physical": b, "refs": alloc.ref_count[b],
                              "mark": "freed"} for i, b in enumerate(freed)]})

    alloc.admit(ours)
    hits = len(ours.block_table)
    computed(ours, ours.num_tokens)
    snap("recompute", ours, {**{i: "prefix" for i in range(hits)},
                             **{i: "recomputed" for i in range(hits, len(ours.block_table))}})
    return snaps


if __name__ == "__main__":  # re-record the acceptance figure's real distribution
    print(json.dumps(record_next_token(), ensure_ascii=False, indent=1))
