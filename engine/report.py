"""StepReport: everything the app draws about one engine step, as plain data.

One report per `LLMEngine.step()`. `to_dict()` gives JSON-able data; the app's components
are pure functions of it. Nothing here is computed for show: every number comes from the
scheduler, the allocator and the model run of that step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Seat:
    index: int
    request_id: str | None
    state: str  # "running", "prefill", "idle-finished", "empty"
    num_tokens: int = 0  # prompt + output so far
    num_output_tokens: int = 0
    computed_this_step: int = 0  # tokens this seat's row computed in this step


@dataclass
class Emitted:
    request_id: str
    token_ids: list[int]
    text: str  # the new text (may be empty while a multi-byte character is incomplete)


@dataclass
class KVSummary:
    block_size: int
    num_blocks: int
    layout: str
    blocks: list[dict]  # per physical block: block, state, owners, tokens
    block_tables: dict[str, list[int]]  # request id -> physical blocks in logical order
    used_slots: int  # slots holding real tokens
    allocated_slots: int  # slots in blocks held (allocated or reserved) by requests
    internal_waste_slots: int  # allocated - used
    free_slots: int
    total_slots: int
    free_blocks: int
    largest_free_run: int  # blocks; free_blocks > largest_free_run means fragmentation
    useful_frac: float  # used / allocated (1.0 when nothing is allocated)
    external_frag: float  # 1 - largest_free_run / free_blocks (0 when no free block)
    prefix_hit_rate: float | None = None


@dataclass
class DraftToken:
    token_id: int
    text: str
    p_target: float | None
    p_draft: float | None
    accept_prob: float | None
    accepted: bool


@dataclass
class SpecRecord:
    request_id: str
    drafted: list[DraftToken]
    num_accepted: int
    next_token_id: int
    next_text: str
    next_kind: str  # "correction" or "bonus"


@dataclass
class StepReport:
    step: int
    wall_s: float
    switches: dict
    num_batched_tokens: int
    seats: list[Seat]
    waiting: list[str]
    admitted: list[str]
    finished: list[str]
    preempted: list[str]
    blocked_reason: str | None
    emitted: list[Emitted]
    kv: KVSummary
    spec: list[SpecRecord] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)  # taken out this step (client went away)

    def to_dict(self) -> dict:
        return asdict(self)
