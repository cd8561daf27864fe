"""StepReport: everything the app draws about one engine step, as plain data.

One report per `LLMEngine.step()`. `to_dict()` gives JSON-able data; the app's components
are pure functions of it. Nothing here is computed for show: every number comes from the
scheduler, the allocator and the model run of that step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from engine.spec.rejection import SpecDecision  # one record per verified draft


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
    # SamplingParams.logprobs: per token (its raw logprob, [[alternative id, logprob], ...])
    logprobs: list | None = None
    # SamplingParams.prompt_logprobs: the whole prompt's, once, with the first tokens
    prompt_logprobs: list | None = None
    finish_reason: str | None = None  # set in the step that finishes it (Request.finish_reason)


@dataclass
class KVSummary:
    block_size: int
    num_blocks: int
    layout: str
    blocks: list[dict]  # every block not free, in block order: block, state, owners, tokens
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
    # copy-on-write this step: [source, destination] blocks, copied before a request wrote
    # into a block another request still held (n > 1 samples after their fork)
    copies: list[list[int]] = field(default_factory=list)


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
    spec: list[SpecDecision] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)  # by abort_request since the last step
    # speculating: the k this step drafted with; under adaptive k also whether it was a
    # measuring detour and each k's estimate (k, tokens_per_request, step_ms, tokens_per_s)
    spec_plan: dict | None = None
    # the gauges, after the step: requests in a seat and not done (a static bus's finished
    # riders are not running), and the share of the pool's blocks not free
    num_running: int = 0
    kv_usage: float = 0.0
    # requests that failed alone since the last step (their sampling or detokenizing raised):
    # id -> what failed. They are listed under `aborted` too (they left as an abort does)
    failures: dict[str, str] = field(default_factory=dict)
    # why each request that did not advance waited, or computed only a chunk: request id ->
    # {"code": ..., its fields} (engine/waits.py); every waiting request has one
    waits: dict[str, dict] = field(default_factory=dict)
    # prefix caching: for each request admitted this step, its lookup explained: blocks hit
    # of its full prompt blocks, and why the first miss missed (engine/kv/paged.py)
    prefix: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def kv_summary(allocator, running: list, copies=()) -> KVSummary:
    """The KV map and its totals, from the allocator and the running requests' block tables
    (cost: the blocks in use, not the pool)."""
    bs = allocator.block_size
    blocks = allocator.block_map(running)  # dicts (BlockView), as the report holds them
    used = sum(d["tokens"] for d in blocks)
    held = bs * (len(blocks) - sum(1 for d in blocks if d["state"] == "cached"))
    free_blocks = allocator.num_free_blocks
    largest = allocator.largest_free_run()
    return KVSummary(
        block_size=bs, num_blocks=allocator.num_blocks, layout=allocator.layout,
        blocks=blocks,
        block_tables={r.request_id: list(r.block_table) for r in running},
        used_slots=used, allocated_slots=held, internal_waste_slots=held - used,
        free_slots=free_blocks * bs, total_slots=allocator.num_blocks * bs,
        free_blocks=free_blocks, largest_free_run=largest,
        useful_frac=used / held if held else 1.0,
        external_frag=1 - largest / free_blocks if free_blocks else 0.0,
        prefix_hit_rate=getattr(allocator, "prefix_hit_rate", None),
        copies=[[a, b] for a, b in copies],
    )


def seats_of(scheduler, computed: dict[str, int]) -> list[Seat]:
    seats = []
    for i, r in enumerate(scheduler.seats):
        if r is None:
            seats.append(Seat(i, None, "empty"))
            continue
        state = ("idle-finished" if r.idle_finished else
                 "prefill" if r.in_prefill else "running")
        seats.append(Seat(i, r.request_id, state, r.num_tokens, r.num_output_tokens,
                          computed.get(r.request_id, 0)))
    return seats


def build_report(step: int, wall_s: float, config, scheduler, sched, emitted: list[Emitted],
                 finished: list[str], aborted: list[str], spec: list[SpecDecision],
                 spec_plan: dict | None = None, copies=(),
                 failures: dict[str, str] | None = None) -> StepReport:
    """Describe one step: `sched` is what the scheduler chose, the rest what came of it."""
    computed = {s.req.request_id: s.num_tokens for s in sched.scheduled}
    admitted = set(sched.admitted)
    alloc = scheduler.allocator
    return StepReport(
        step=step, wall_s=wall_s, switches=config.switches(),
        num_batched_tokens=sched.num_tokens, seats=seats_of(scheduler, computed),
        waiting=[r.request_id for r in scheduler.waiting],
        admitted=sched.admitted, finished=finished, preempted=sched.preempted,
        blocked_reason=sched.blocked_reason, emitted=emitted,
        kv=kv_summary(scheduler.allocator, scheduler.running, copies), spec=spec,
        aborted=aborted,
        spec_plan=spec_plan,
        num_running=sum(1 for r in scheduler.running if not r.idle_finished),
        kv_usage=1 - alloc.num_free_blocks / alloc.num_blocks,
        failures=dict(failures or {}),
        waits={rid: w.to_dict() for rid, w in sched.waits.items()},
        prefix={r.request_id: r.prefix_lookup for r in scheduler.running
                if r.request_id in admitted and r.prefix_lookup is not None},
    )
