"""The chapter's formulas as small calculators (pure functions; app/pages/calculators.py draws
them, tests/app/test_calculators.py checks them by hand-worked cases).

- `kv_bytes`: K and V for every layer and KV head: 2 x layers x kv_heads x head_dim x bytes
  per element, per token; times the tokens of a conversation.
- `bus_sum`: answer lengths -> seat-steps a static batch computes vs the useful ones (each
  batch runs as long as its longest answer) and the steps continuous batching needs when
  every seat is refilled at once (a lower bound: whole tokens, no prefill).
- `tokens_per_pass`: a and k -> (1 - a^(k+1)) / (1 - a) (app/components/spec_strip.py).
- `roofline`: this machine's measured read bandwidth and the engine's measured step times ->
  for each step, the weight bytes it had to read ÷ its time, against the bandwidth: a step
  near the line is memory-bound (reading weights is the whole cost), one far below it is
  bound by something else (compute, or the host's overhead).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from app.components.spec_strip import expected_tokens_per_pass as tokens_per_pass

__all__ = ["SHAPES", "ModelShape", "bus_sum", "kv_bytes", "parse_lengths", "roofline_rows",
           "tokens_per_pass"]


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int


SHAPES = (
    ModelShape("SmolLM2-135M (this app)", 30, 3, 64),
    ModelShape("Llama-2-7B (the chapter's scale)", 32, 32, 128),
    ModelShape("Llama-3-8B (grouped-query attention)", 32, 8, 128),
)


def kv_bytes(shape: ModelShape, bytes_per_elem: int, tokens: int = 1) -> int:
    """Bytes of K and V for `tokens` tokens: 2 x layers x kv_heads x head_dim x bytes."""
    for name, v in (("layers", shape.layers), ("kv_heads", shape.kv_heads),
                    ("head_dim", shape.head_dim), ("bytes_per_elem", bytes_per_elem)):
        if v < 1:
            raise ValueError(f"{name} must be at least 1, got {v}")
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * bytes_per_elem * tokens


def parse_lengths(text: str, limit: int = 200) -> list[int]:
    """"8, 12 40" -> [8, 12, 40]; ValueError naming the bad item."""
    items = [x for x in text.replace(",", " ").split() if x]
    if not items:
        raise ValueError("give at least one answer length, e.g. 8, 12, 40")
    if len(items) > limit:
        raise ValueError(f"at most {limit} answer lengths, got {len(items)}")
    out = []
    for x in items:
        if not x.isdigit() or int(x) < 1:
            raise ValueError(f"answer length {x!r} is not a whole number >= 1")
        out.append(int(x))
    return out


def bus_sum(lengths: list[int], seats: int) -> dict:
    """Static batching (batches of `seats` in arrival order, each as long as its longest)
    against continuous batching (a freed seat takes the next request at once)."""
    if seats < 1:
        raise ValueError(f"seats must be at least 1, got {seats}")
    useful = sum(lengths)
    batches = [lengths[i:i + seats] for i in range(0, len(lengths), seats)]
    static_steps = sum(max(b) for b in batches)
    static_seat_steps = sum(len(b) * max(b) for b in batches)
    ends = [0] * min(seats, len(lengths))  # when each seat frees up
    heapq.heapify(ends)
    for n in lengths:
        heapq.heappush(ends, heapq.heappop(ends) + n)
    continuous_steps = max(ends)
    return {"useful": useful, "static_steps": static_steps,
            "static_seat_steps": static_seat_steps,
            "static_useful_frac": useful / static_seat_steps,
            "continuous_steps": continuous_steps}


def roofline_rows(history: list[dict], weight_bytes: int) -> list[dict]:
    """Per step with work: tokens computed, time, and the weight read rate that time implies."""
    rows = []
    for rep in history:
        if rep["wall_s"] > 0 and rep.get("num_batched_tokens"):
            rows.append({"step": rep["step"], "tokens": rep["num_batched_tokens"],
                         "ms": 1000 * rep["wall_s"],
                         "gb_s": weight_bytes / rep["wall_s"] / 1e9})
    return rows
