"""One request: its token ids, where it is in its life, its block table and its timings.

The vLLM v1 framing: there is no prefill phase and no decode phase. A request has
`num_tokens` (prompt + output so far) and `num_computed_tokens` (how many of those have
their K/V in the pool). Each step the scheduler lets it catch up by some tokens: a whole
prompt, a chunk of it, one decode token, or 1 + k when a draft is verified.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from engine.config import SamplingParams
from engine.detokenizer import Detokenizer


class RequestStatus(str, enum.Enum):
    WAITING = "waiting"  # in the queue (new, or preempted and waiting to recompute)
    RUNNING = "running"  # has a seat
    FINISHED = "finished"


@dataclass(eq=False)  # identity: `in` and `remove` on the scheduler's lists compare no fields
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_time: float = field(default_factory=time.perf_counter)
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)  # logical block i -> physical block
    spec_token_ids: list[int] = field(default_factory=list)  # drafted, awaiting verification
    finish_reason: str | None = None  # "length", "stop", "eos", "max_model_len", "abort"
    first_token_time: float | None = None
    finish_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache
    # the prefix cache's lookup at admission, explained (engine/kv/paged.py `_match_prefix`)
    prefix_lookup: dict | None = field(default=None, repr=False)
    idle_finished: bool = False  # static batching: done, but still holding its seat
    text: str = ""  # the output text a client may see so far (engine/detokenizer.py)
    detokenizer: Detokenizer | None = field(default=None, repr=False)
    seat: int | None = None
    generator: torch.Generator | None = field(default=None, repr=False)
    # sampling.logprobs set: per output token (its logprob, [(alternative, logprob), ...])
    output_logprobs: list | None = field(default=None, repr=False)
    # sampling.prompt_logprobs set: the same per prompt token; None for the first (nothing
    # predicts it)
    prompt_logprobs: list | None = field(default=None, repr=False)
    # parallel sampling (n > 1): the other samples, waiting to be forked from this one when
    # its prompt is computed; they then share its blocks (engine/kv/paged.py `fork`)
    fork_children: list[Request] = field(default_factory=list, repr=False)
    group_id: str | None = None  # n > 1: the id the client knows; index: which sample
    index: int = 0
    # async scheduling: tokens sampled by a step still in flight, not yet appended (0 or 1).
    # The scheduler counts them (num_tokens + num_pending) and the runner reads their ids from
    # that step's sampled tensor; update_from_output appends them
    num_pending: int = 0

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output + drafted tokens, without building the
        whole sequence: a decode step asks each running request for 1 (or 1 + k) tokens, and
        copying every request's whole history for that grows with its length."""
        p, o = self.prompt_token_ids, self.output_token_ids
        if end <= len(p):
            return p[start:end]
        head = p[start:] if start < len(p) else []
        tail = self.spec_token_ids[max(0, start - len(p) - len(o)):]
        return (head + o[max(0, start - len(p)):] + tail)[:end - start]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """Still catching up on tokens it already has (prompt, or recompute after preemption)."""
        return self.num_computed_tokens < self.num_tokens - 1
