"""The scheduler: who rides this step and how many tokens each computes.

Two policies (chapter 6.4, leak 1):
  * continuous ("subway", Orca, OSDI 2022): iteration-level. Each step, running requests go
    first, then waiting ones board into free seats while the token budget lasts. A request
    that finishes leaves at once and its seat is filled the same step.
  * static ("tour bus"): a batch boards only when every seat is empty. A rider who finishes
    keeps its seat, and its row is still computed each step (as padded rows are in
    transformers' generate()), until the whole batch is done.

Every request catches `num_computed_tokens` up with its tokens (vLLM v1): a prompt, a chunk
of it when it exceeds the budget, one decode token, or 1 + k to verify a draft. When the
pool runs out of blocks, the most recently admitted request is preempted by recompute: its
blocks are freed and it goes back to the front of the queue, keeping its output so far.

Parallel sampling (n > 1, paged KV): sample 0 boards with seats reserved for the others;
when its prompt is computed, the others sample their first token from the same logits and
are forked from it (seated, holding its blocks by reference: `allocator.fork`).

A step has two calls here: `schedule()` before the forward decides who computes what, and
`update_from_output()` after it is the one place a request advances: its computed tokens,
its new tokens up to the first stop, its KV kept or rolled back, its finish.

With async scheduling (EngineConfig.async_scheduling) step n + 1 is scheduled before step
n's tokens are appended, so the advance is split: `launched()` as the forward starts counts
its tokens as computed and the token each sampling request will get as pending
(`Request.num_pending`), and `update_from_output(..., launched=True)` later appends that
token. A pending token that will end its request by length is not computed again; a request
preempted while its token is pending keeps it (and boards again once it is appended).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.kv.allocator import BlockAllocator
from engine.request import Request, RequestStatus
from engine.waits import Wait


@dataclass
class ScheduledRequest:
    req: Request
    num_tokens: int  # tokens computed this step (prefill chunk, 1, or 1 + drafted)
    idle: bool = False  # static batching: a finished rider's row, computed and thrown away


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    blocked_reason: str | None = None  # why the head of the queue could not board
    # why each request that did not advance (or computed only a chunk) waited: engine/waits.py
    waits: dict[str, Wait] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler:
    # every waiting request's code each step (engine/waits.py); off only for the benchmark
    # that measures what they cost (python -m benchmarks.waits_bench)
    explain_waits = True

    def __init__(self, config: EngineConfig, allocator: BlockAllocator, eos_ids: set[int]):
        self.config = config
        self.allocator = allocator
        self.eos_ids = eos_ids
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order; static idle riders included
        self.seats: list[Request | None] = [None] * config.max_num_seqs
        self.free_seats = list(range(config.max_num_seqs))  # a heap: the lowest seat first
        # requests whose own tokens could not be appended this step (the engine aborts them)
        self.failed: list[tuple[Request, Exception]] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def abort(self, req: Request) -> None:
        """The client is gone: the request leaves now, from the queue or its seat, and its
        blocks are freed (also under static batching: nobody waits for an absent rider)."""
        if req.is_finished:
            return
        if req.status == RequestStatus.WAITING:
            if req in self.waiting:  # (a sample not forked yet is in no queue)
                self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            self._stand(req)
            self.allocator.free(req)
        req.spec_token_ids = []
        req.status = RequestStatus.FINISHED
        req.finish_reason = req.finish_reason or "abort"

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or any(not r.idle_finished for r in self.running)

    # --- seats ------------------------------------------------------------------------------
    def _sit(self, req: Request) -> None:
        seat = heapq.heappop(self.free_seats)
        self.seats[seat] = req
        req.seat = seat

    def _stand(self, req: Request) -> None:
        if req.seat is not None:
            self.seats[req.seat] = None
            heapq.heappush(self.free_seats, req.seat)
        req.seat = None

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._stand(req)
        self.allocator.free(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    def _finish(self, req: Request, now: float) -> None:
        req.status = RequestStatus.FINISHED
        req.finish_time = now
        if self.config.batching == "static":
            req.idle_finished = True  # keeps its seat and blocks until the whole bus is done
            self._end_static_batch_if_done()
            return
        self.running.remove(req)
        self._stand(req)
        self.allocator.free(req)

    def _end_static_batch_if_done(self) -> None:
        if self.running and all(r.idle_finished for r in self.running):
            for r in self.running:
                self._stand(r)
                self.allocator.free(r)
            self.running = []

    # --- one step ---------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        cfg, out = self.config, SchedulerOutput()
        self._end_static_batch_if_done()  # also when preemption took the last live rider
        budget = cfg.max_num_batched_tokens

        for req in list(self.running):
            if req.status == RequestStatus.WAITING:  # preempted earlier in this loop
                continue
            if req.idle_finished:
                out.scheduled.append(ScheduledRequest(req, 1, idle=True))
                continue
            if req.num_pending and self._pending_ends(req):
                continue  # its pending token is its last: nothing more to compute
            left = (req.num_tokens + req.num_pending + len(req.spec_token_ids)
                    - req.num_computed_tokens)
            n = min(left, budget)
            if n <= 0:
                if left > 0:  # the requests before it spent the budget
                    out.waits[req.request_id] = Wait("token_budget",
                                                     {"budget": cfg.max_num_batched_tokens})
                continue
            if n < 1 + len(req.spec_token_ids) and not req.in_prefill:
                req.spec_token_ids = req.spec_token_ids[: max(0, n - 1)]  # budget cuts the draft
            while not self.allocator.ensure_slots(req, req.num_computed_tokens + n):
                victim = next((r for r in reversed(self.running) if not r.idle_finished), None)
                if victim is None:
                    raise RuntimeError(
                        "KV pool exhausted with nothing to preempt; raise num_kv_blocks")
                out.waits[victim.request_id] = Wait("preempted", {
                    "rule": "recompute", "redo_tokens": victim.num_computed_tokens,
                    "for_request": req.request_id})
                self._preempt(victim)
                out.preempted.append(victim.request_id)
                out.scheduled = [s for s in out.scheduled if s.req is not victim]
                if victim is req:
                    break
            if req.status != RequestStatus.RUNNING:
                continue
            out.scheduled.append(ScheduledRequest(req, n))
            if req.in_prefill and n < left:
                out.waits[req.request_id] = Wait("prefill_chunk",
                                                 {"computed": n, "remaining": left - n})
            budget -= n

        may_board = cfg.batching == "continuous" or not self.running
        # the tour bus fills every seat at once; prompts beyond this step's budget are
        # prefilled in the next steps
        bus_boarding = cfg.batching == "static" and may_board
        # seats kept for samples still to be forked from a running request
        reserved = sum(len(r.fork_children) for r in self.running)
        while (self.waiting and may_board and len(self.running) < cfg.max_num_seqs
               and (budget > 0 or bus_boarding)):
            req = self.waiting[0]
            if req.num_pending:  # preempted this step with its token still in flight
                break
            if len(self.running) + reserved + 1 + len(req.fork_children) > cfg.max_num_seqs:
                out.blocked_reason = "all seats taken"
                break
            if not self.allocator.admit(req):
                out.blocked_reason = getattr(self.allocator, "last_refusal", None)
                out.waits.setdefault(req.request_id, self.allocator.last_wait)
                break
            n = max(0, min(req.num_tokens - req.num_computed_tokens, budget))
            if not self.allocator.ensure_slots(req, req.num_computed_tokens + n):
                needed = (-(-(req.num_computed_tokens + n) // self.allocator.block_size)
                          - len(req.block_table))
                self.allocator.free(req)
                req.num_computed_tokens = 0
                out.blocked_reason = (f"KV full: {self.allocator.num_free_blocks} blocks free, "
                                      f"{req.request_id} needs more for its first chunk")
                out.waits.setdefault(req.request_id, Wait("kv_short", {
                    "needed": needed, "free": self.allocator.num_free_blocks}))
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self._sit(req)
            reserved += len(req.fork_children)
            out.admitted.append(req.request_id)
            if n > 0:
                out.scheduled.append(ScheduledRequest(req, n))
                if n < req.num_tokens - req.num_computed_tokens:
                    out.waits[req.request_id] = Wait("prefill_chunk", {
                        "computed": n, "remaining": req.num_tokens - req.num_computed_tokens - n})
                budget -= n
            else:  # seated on the tour bus; its prompt waits for a later step's budget
                out.waits[req.request_id] = Wait("token_budget",
                                                 {"budget": cfg.max_num_batched_tokens})
        if self.waiting and not out.blocked_reason:
            if len(self.running) >= cfg.max_num_seqs:
                out.blocked_reason = "all seats taken"
            elif not may_board:
                out.blocked_reason = "static batching: the bus boards only when every seat is empty"
            elif budget <= 0:
                out.blocked_reason = "token budget of this step used up"
        self._waiting_reasons(out, may_board, reserved)
        return out

    def _waiting_reasons(self, out: SchedulerOutput, may_board: bool, reserved: int) -> None:
        """Each request still in the queue gets its one code: the head the reason it could not
        board (unless it has one already: preempted, or refused by the KV pool), every other
        one the head it waits behind."""
        if not self.waiting or not self.explain_waits:
            return
        cfg, head = self.config, self.waiting[0]
        if head.request_id not in out.waits:
            taken = len(self.running) + reserved
            if not may_board:
                wait = Wait("bus_running", {"riders_left": sum(
                    1 for r in self.running if not r.idle_finished)})
            elif taken + 1 + len(head.fork_children) > cfg.max_num_seqs:
                wait = Wait("seats_full", {"seats": cfg.max_num_seqs, "taken": taken})
            else:
                wait = Wait("token_budget", {"budget": cfg.max_num_batched_tokens})
            out.waits[head.request_id] = wait
        head_code = out.waits[head.request_id].code
        for i, req in enumerate(self.waiting):
            if i and req.request_id not in out.waits:
                out.waits[req.request_id] = Wait("queued_behind", {
                    "position": i, "behind": head.request_id, "head_code": head_code})

    def _pending_ends(self, req: Request) -> bool:
        """Its pending token ends it by length (max_tokens or max_model_len)."""
        return (req.num_output_tokens + req.num_pending >= req.sampling.max_tokens
                or req.num_tokens + req.num_pending >= self.config.max_model_len)

    # --- after the forward ------------------------------------------------------------------
    def launched(self, out: SchedulerOutput, sampling: set[str] | dict) -> None:
        """Async scheduling: the step's forward has started. Its tokens count as computed now
        (the next schedule() must not compute them again) and each request in `sampling`
        holds one pending token until update_from_output(..., launched=True)."""
        for s in out.scheduled:
            req = s.req
            if s.idle or req.status != RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += s.num_tokens
            if req.request_id in sampling:
                req.num_pending += 1

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, list[int]],
                           now: float, launched: bool = False) -> list[tuple[Request, list[int]]]:
        """Advance every request the step computed. `sampled`: request id -> its new tokens
        (one sampled token, or the tokens a verification accepted plus the correction or
        bonus); a request absent from it computed a prefill chunk and has no token yet.
        `launched`: launched() already counted the computed tokens; only the pending ones
        are appended (see the module's docstring).
        Returns (request, tokens kept) for each request that got tokens, in batch order."""
        if launched:
            return self._update_launched(out, sampled, now)
        advanced = []
        for s in out.scheduled:
            req = s.req
            if s.idle or req.status != RequestStatus.RUNNING:  # idle rider, or aborted
                continue
            req.num_computed_tokens += s.num_tokens
            tokens = sampled.get(req.request_id)
            if tokens is None:
                self.allocator.on_computed(req)
                continue
            if req.spec_token_ids:
                # keep the KV of the last real token and the accepted drafts only
                req.num_computed_tokens = req.num_tokens + len(tokens) - 1
                req.spec_token_ids = []
                self.allocator.truncate(req, req.num_computed_tokens)
            self.allocator.on_computed(req)
            children, req.fork_children = req.fork_children, []
            for child in children:  # before req's own token: they share its prompt only
                self._fork(req, child)
            if not self._take(req, tokens, now, advanced):
                continue
            for child in children:
                if self._take(child, sampled[child.request_id], now, advanced) and \
                        child.finish_reason is not None:
                    self._finish(child, now)
            if req.finish_reason is not None:
                self._finish(req, now)
        return advanced

    def _update_launched(self, out: SchedulerOutput, sampled: dict[str, list[int]],
                         now: float) -> list[tuple[Request, list[int]]]:
        """update_from_output for a step launched() counted: append each pending token. The
        next step may be running already; a request that finished or was aborted since drops
        its token, one preempted since keeps it (its recompute then includes it)."""
        advanced = []
        for s in out.scheduled:
            req = s.req
            if s.idle or req.is_finished:
                continue
            tokens = sampled.get(req.request_id)
            if tokens is not None:
                req.num_pending -= 1
                if not self._take(req, tokens, now, advanced):
                    continue
            if req.status == RequestStatus.WAITING:  # preempted after this step started
                if req.finish_reason is not None:
                    self.waiting.remove(req)
                    req.status, req.finish_time = RequestStatus.FINISHED, now
                continue
            # the prefix cache hashes full blocks of known tokens: only now is the pending
            # one known (num_computed_tokens <= num_tokens holds again)
            self.allocator.on_computed(req)
            if req.finish_reason is not None:
                self._finish(req, now)
        return advanced

    def _fork(self, parent: Request, child: Request) -> None:
        """A sample of parent's prompt takes its reserved seat, holding parent's blocks."""
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens
        if parent.prompt_logprobs is not None:
            child.prompt_logprobs = list(parent.prompt_logprobs)
        self.allocator.fork(parent, child)
        child.status = RequestStatus.RUNNING
        self.running.append(child)
        self._sit(child)

    def _take(self, req: Request, tokens: list[int], now: float, advanced: list) -> bool:
        """_append, then (req, tokens kept) onto `advanced`; False if its detokenizer failed
        (this request alone ends: the engine fails it from `failed`)."""
        try:
            kept = self._append(req, tokens, now)
        except Exception as exc:
            self.failed.append((req, exc))
            return False
        advanced.append((req, kept))
        return True

    def _append(self, req: Request, tokens: list[int], now: float) -> list[int]:
        """Append tokens one at a time, stopping at the first stop condition."""
        kept = []
        sp = req.sampling
        for tok in tokens:
            req.output_token_ids.append(tok)
            req.token_times.append(now)
            kept.append(tok)
            if req.first_token_time is None:
                req.first_token_time = now
            stop_string = req.detokenizer.add(tok) if req.detokenizer else False
            if tok in self.eos_ids and not sp.ignore_eos:
                req.finish_reason = "eos"
            elif sp.stop_token_ids and tok in sp.stop_token_ids:
                req.finish_reason = "stop_token"  # OpenAI's "stop"; its text is not shown
            elif req.num_output_tokens >= sp.max_tokens:
                req.finish_reason = "length"
            elif req.num_tokens >= self.config.max_model_len:
                req.finish_reason = "max_model_len"
            elif stop_string:
                req.finish_reason = "stop"
            if req.finish_reason is not None:
                break
        if req.finish_reason is not None and req.num_computed_tokens > req.num_tokens - 1:
            # a token after the stop was verified too: drop its KV
            req.num_computed_tokens = req.num_tokens - 1
            self.allocator.truncate(req, req.num_computed_tokens)
        return kept
