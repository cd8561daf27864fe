"""The model runner: a scheduled batch -> flat tensors -> one forward -> the logits needed.

For every scheduled request it lays out the tokens it computes this step back to back:
`input_ids` and `positions` ([num_tokens]), `slot_mapping` (where each token's K/V goes),
and per request its context length and block table. A request that will sample after this
step needs logits at its last position; one verifying a draft of k tokens needs k + 1.

The engine's target model and the draft model (engine/spec/draft.py) each have a runner over
their own model, KV pool and allocator: `run` takes the scheduler's batch, `forward` the
`Chunk`s both build.

With `keep_hidden` (the EAGLE draft head, engine/spec/eagle.py, reads the target's features)
the result also carries the final hidden state of every computed token and where each
request's tokens sit in it.

A step's integers (token ids, positions, logit rows, slot mapping, context lengths, block
tables) are laid out in one host buffer and cross to the device in one copy (`build_step`;
pinned on CUDA). With `graphs` (engine/graphs.py, the `cuda_graphs` switch) a decode-only step
replays a captured graph instead of launching the forward's kernels one by one.

With async scheduling a request's last token may still be pending (`Request.num_pending`):
sampled by the step in flight, its id not on the host yet. `run(batch, pending)` lays out a
placeholder there and the forward copies the id from that step's sampled tensor on the device
(`Pending`), so the host never waits for it.

Startup, as nano-vllm's `ModelRunner`: `num_kv_blocks` sizes the engine's KV pool and
`kv_cache` builds it with its allocator; `ModelRunner.started` builds the engine's runner and,
on a GPU, compiles every Triton kernel variant a step can launch (`warm_up`) and captures the
decode graphs (`capture`), so neither a compile nor a capture stalls a step while serving.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.config import EngineConfig
from engine.graphs import DecodeGraphs
from engine.kv import ContiguousAllocator, KVPool, PagedAllocator
from engine.kv.allocator import BlockAllocator
from engine.model.attention import Staging, build_step
from engine.scheduler import ScheduledRequest

# on CUDA the default pool holds this many times what the seats need at full length: room for
# the prefix cache, never the whole card (every block costs the step nothing, but memory
# another process may want)
CUDA_KV_HEADROOM = 2


def num_kv_blocks(cfg: EngineConfig, model_config, kv_dtype: torch.dtype,
                  device: torch.device) -> int:
    """The pool's blocks: num_kv_blocks when given; else what max_num_seqs requests of
    max_model_len need (on CUDA times CUDA_KV_HEADROOM, capped by gpu_memory_utilization of
    the free memory). ValueError when one request of max_model_len would not fit."""
    if cfg.num_kv_blocks is not None or device.type != "cuda":
        num_blocks = cfg.resolved_num_kv_blocks
    else:
        free, _ = torch.cuda.mem_get_info(device)
        m = model_config
        per_block = KVPool.bytes_per_block(m.num_layers, cfg.block_size, m.num_kv_heads,
                                           m.head_dim, kv_dtype)
        cap = int(free * cfg.gpu_memory_utilization) // per_block
        num_blocks = min(cfg.resolved_num_kv_blocks * CUDA_KV_HEADROOM, cap)
    if num_blocks < cfg.blocks_per_seq:
        raise ValueError(
            f"num_kv_blocks={num_blocks} is too small: one request of max_model_len="
            f"{cfg.max_model_len} needs {cfg.blocks_per_seq} blocks of block_size="
            f"{cfg.block_size}")
    return num_blocks


def kv_cache(cfg: EngineConfig, model_config, kv_dtype: torch.dtype, device: torch.device,
             spare_block: bool = False) -> tuple[KVPool, BlockAllocator]:
    """The engine's KV pool (`num_kv_blocks` of them) and the allocator that hands them out
    (paged or contiguous, `kv_layout`). `spare_block`: the pool has one more block, which no
    request owns (CUDA graphs' padding rows write there)."""
    m = model_config
    num_blocks = num_kv_blocks(cfg, m, kv_dtype, device)
    pool = KVPool(m.num_layers, num_blocks + spare_block, cfg.block_size, m.num_kv_heads,
                  m.head_dim, kv_dtype, device)
    if cfg.kv_layout == "paged":
        return pool, PagedAllocator(num_blocks, cfg.block_size, cfg.enable_prefix_caching)
    return pool, ContiguousAllocator(num_blocks, cfg.block_size, cfg.max_model_len)


@dataclass
class ForwardResult:
    logits: torch.Tensor  # [num_logit_rows, vocab] fp32, on the model's device
    rows: dict[str, tuple[int, int]]  # request id -> (first logit row, number of rows)
    # requests that want prompt log-probabilities, in prefill: request id -> (first logit
    # row, first position, number of rows); row j's logits predict prompt token pos + j + 1
    prompt_rows: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # keep_hidden only: [num_tokens, hidden] final hidden states of every computed token, and
    # per request (request, first position, first row in hidden, number of tokens)
    hidden: torch.Tensor | None = None
    spans: list[tuple[object, int, int, int]] | None = None


@dataclass
class Chunk:
    """One sequence's part of a flat batch: `token_ids` at positions start, start + 1, ...,
    attending to everything before them in the sequence's blocks."""

    seq: object  # a Request or the draft's DraftSeq: its block_table locates the K/V
    start: int  # position of token_ids[0]
    token_ids: list[int]
    num_logits: int = 0  # logits wanted at the last this many tokens
    store: bool = True  # False: an idle static rider recomputes a position and writes nothing


@dataclass
class Pending:
    """The step in flight's sampled token ids ([rows] on the model's device) and each sampling
    request's row in them."""

    tokens: torch.Tensor
    rows: dict[str, int]


class ModelRunner:
    def __init__(self, model, pool, allocator: BlockAllocator, backend, device, graphs=None):
        self.model, self.pool, self.allocator = model, pool, allocator
        self.backend, self.device = backend, device
        self.graphs = graphs  # engine/graphs.py DecodeGraphs: decode-only steps, or None
        # the step's one pinned host buffer on CUDA; on a CPU build_step makes its own bytes
        self.staging = Staging(device) if torch.device(device).type == "cuda" else None
        self.keep_hidden = False  # keep the last forward's hidden states (self.hidden)
        self.hidden: torch.Tensor | None = None
        self.copied: list[tuple[int, int]] = []  # the last run's copy-on-write blocks
        # called once a forward's inputs are laid out, just before the model runs: a server
        # hands out the previous step's tokens here (engine/server/loop.py), so that its
        # HTTP thread works while the forward holds no GIL, not while this step prepares
        self.on_forward = None
        self.kernel_warmup_s = 0.0  # startup time spent compiling kernels (`warm_up`)
        self.graph_capture_s = 0.0  # startup time spent capturing CUDA graphs (`capture`)

    @classmethod
    def started(cls, cfg: EngineConfig, model_config, model, pool: KVPool,
                allocator: BlockAllocator, backend, device: torch.device, k: int = 0,
                triton: bool = False, graphs: bool = False) -> ModelRunner:
        """The engine's runner, ready to serve: with `graphs`, its decode graphs (the padded
        sizes up to max_num_seqs; padding writes to the pool's spare block, the one after the
        allocator's); on a GPU its Triton kernels compiled (`triton`: the backend's name is
        "triton") and its graphs captured. `k`: the drafted tokens a verification adds."""
        decode_graphs = None
        if graphs:
            decode_graphs = DecodeGraphs(model, pool, backend, device, cfg.block_size,
                                         cfg.max_num_seqs,
                                         max_blocks=-(-(cfg.max_model_len + k) // cfg.block_size),
                                         dummy_block=allocator.num_blocks)
        runner = cls(model, pool, allocator, backend, device, decode_graphs)
        if triton:
            runner.warm_up(cfg, model_config, k)
        runner.capture()
        return runner

    def warm_up(self, cfg: EngineConfig, model_config, k: int = 0) -> None:
        """On a GPU, compile every Triton kernel variant a step can launch now, not while
        serving (kernels/warmup.py, imported as servelab_kernels): a compile stalls the step
        it lands in."""
        if torch.device(self.device).type != "cuda":
            return
        from servelab_kernels.warmup import warm_up

        m = model_config
        t0 = time.perf_counter()
        warm_up(m.num_heads, m.num_kv_heads, m.head_dim, cfg.block_size, self.model.dtype,
                cfg.max_num_seqs, cfg.max_model_len + k + 1, cfg.max_num_batched_tokens,
                self.device)
        self.kernel_warmup_s = time.perf_counter() - t0

    def capture(self) -> None:
        """On a GPU, capture every padded size's decode graph now, not during the first
        requests (elsewhere the stand-in captures a size when a step first needs it)."""
        if self.graphs is None or torch.device(self.device).type != "cuda":
            return
        t0 = time.perf_counter()
        self.graphs.capture_all()
        self.graph_capture_s = time.perf_counter() - t0

    def run(self, batch: list[ScheduledRequest], pending: Pending | None = None) -> ForwardResult:
        """The scheduler's batch: each request's next num_tokens tokens (drafts included);
        `pending`: where the ids of tokens sampled but not yet appended are (async scheduling)."""
        copies = self.allocator.take_copies()
        self.copied = copies  # the step's report draws them (KVSummary.copies)
        if copies:  # copy-on-write of shared blocks this step writes into, before it does
            self.pool.copy_blocks(copies)
        chunks: list[Chunk] = []
        rows: dict[str, tuple[int, int]] = {}
        prompt_rows: dict[str, tuple[int, int, int]] = {}
        spans: list[tuple[object, int, int, int]] = []
        gather: list[tuple[int, int]] = []  # (flat token index, row in pending.tokens)
        num_rows = num_tokens = 0
        for s in batch:
            req = s.req
            if s.idle:
                # a finished static rider: recompute its last computed position, write nothing
                pos = req.num_computed_tokens - 1
                chunks.append(Chunk(req, pos, req.token_ids_between(pos, pos + 1), store=False))
                num_tokens += 1
                continue
            start, end = req.num_computed_tokens, req.num_computed_tokens + s.num_tokens
            total = req.num_tokens + req.num_pending
            # caught up: logits for the last real token and each drafted one
            n_rows = end - (total - 1) if end >= total else 0
            p_rows = 0
            if req.prompt_logprobs is not None:
                # the prompt positions whose logits are still unread (not again after a
                # preemption): they run up to the sampling row, so all are the chunk's last
                lo = max(start, len(req.prompt_logprobs) - 1)
                p_rows = max(0, min(end, req.num_prompt_tokens - 1) - lo)
                if p_rows:
                    prompt_rows[req.request_id] = (num_rows, lo, p_rows)
                    num_rows += p_rows
            if n_rows:
                rows[req.request_id] = (num_rows, n_rows)
                num_rows += n_rows
            if req.num_pending and end > req.num_tokens:  # the pending token: its id is
                # read on the device (never with drafts: async scheduling runs without them)
                assert end == req.num_tokens + 1 and pending is not None, "one pending token"
                ids = req.token_ids_between(start, req.num_tokens)
                gather.append((num_tokens + len(ids), pending.rows[req.request_id]))
                ids.append(0)
            else:
                ids = req.token_ids_between(start, end)
            chunks.append(Chunk(req, start, ids, p_rows + n_rows))
            spans.append((req, start, num_tokens, end - start))
            num_tokens += end - start
        fill = None
        if gather:
            dev = pending.tokens.device
            fill = (torch.tensor([i for i, _ in gather], device=dev),
                    pending.tokens[torch.tensor([r for _, r in gather], device=dev)])
        logits = self.forward(chunks, fill)
        if self.keep_hidden:
            return ForwardResult(logits, rows, prompt_rows, self.hidden, spans)
        return ForwardResult(logits, rows, prompt_rows)

    def _forward_starts(self) -> None:
        if self.on_forward is not None:
            self.on_forward()

    def forward(self, chunks: list[Chunk], fill=None) -> torch.Tensor:
        """One forward over the chunks -> fp32 logits [sum of num_logits, vocab] on the model's
        device, in chunk order (empty [0, 0] if none are wanted). `fill`: (flat token
        indices, their ids on the device), written over the placeholders there."""
        input_ids, positions, slots, logit_index = [], [], [], []
        query_lens, seq_lens, tables = [], [], []
        for c in chunks:
            n, end = len(c.token_ids), c.start + len(c.token_ids)
            first_row = len(input_ids)
            input_ids.extend(c.token_ids)
            positions.extend(range(c.start, end))
            if c.store:
                slots.extend(self.allocator.slot(c.seq, p) for p in range(c.start, end))
            else:
                slots.extend([-1] * n)
            query_lens.append(n)
            seq_lens.append(end)
            tables.append(c.seq.block_table)
            logit_index.extend(range(first_row + n - c.num_logits, first_row + n))
        if self.graphs is not None and self.graphs.fits(query_lens, tables):
            self._forward_starts()
            hidden, idx = self.graphs.forward(input_ids, positions, slots, tables, logit_index,
                                              fill)
            if self.keep_hidden:  # the graph's output buffer is overwritten by the next replay
                hidden = hidden.clone()
        else:
            # token ids, positions and logit rows travel in the metadata's one copy
            meta, (ids, pos, idx) = build_step(
                query_lens, seq_lens, tables, slots, self.allocator.block_size, self.device,
                (input_ids, positions, logit_index), self.staging)
            if fill is not None:
                ids[fill[0]] = fill[1].to(ids.dtype)
            self._forward_starts()
            hidden = self.model.forward(ids, pos, meta, self.pool.layers, self.backend)
        self.hidden = hidden if self.keep_hidden else None
        if not logit_index:
            return torch.empty(0, 0, device=self.device)
        # the logits stay on the device: greedy rows come back as token ids only (sampler.py).
        # When every row is wanted (a decode-only step: logit_index is then 0..n-1, as it
        # rises) there is nothing to gather; a graph's padded output has more rows than that
        rows = hidden if hidden.shape[0] == len(logit_index) else hidden[idx]
        return self.model.logits(rows)
