"""A step's report -> what each waiting handler gets: the output processor (vLLM v1's).

The stepping thread (loop.py) owns a `Ticket` per request in the engine; after each step the
`OutputProcessor` turns the engine's `StepReport` into one `Delta` per ticket and sample that
the step concerned, and settles the tickets the step ended:

- each emitted token and its new text (the engine's detokenizer already left a stop string
  and the text of an ending EOS or stop token out), with the logprobs asked for as plain
  data (`TokenText.info`: OpenAI's `token` and `bytes`);
- a finished sample's `finish_reason`; a ticket whose samples have all finished leaves
  (`finishing`), its end-to-end latency and reason counted;
- a request that failed alone in the engine (`StepReport.failures`) gets its own error, the
  others go on;
- an aborted request leaves quietly (its client is gone).

It reads only the report and what `add` registered (each ticket's sample ids and prompt), and
never calls the engine: what the engine may now forget is listed in `StepOutputs.done`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from engine.config import SamplingParams
from engine.server.protocol import APIError, finish_reason
from engine.waits import Timeline

log = logging.getLogger("servelab.server")

SIMULATED_PREFIX = "sim-"


def user_kind(user: str) -> str:
    return "simulated" if user.startswith(SIMULATED_PREFIX) else "person"


@dataclass
class Delta:
    """What one step (or the admission) gives one request's handler."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # the engine's reason, once finished
    error: APIError | None = None
    accepted: bool = False  # the first delta: the request is in the engine
    prompt_token_ids: list[int] | None = None  # with `accepted`
    max_tokens: int | None = None  # with `accepted`: the resolved budget
    prompt_text: str | None = None  # with `accepted`, for echo of a prompt of token ids
    index: int = 0  # n > 1: which sample (OpenAI's choice index)
    # SamplingParams.logprobs: per new token a TokenInfo (below); prompt_logprobs: the whole
    # prompt's, once (the first prompt token's logprob is None)
    logprobs: list[dict] | None = None
    prompt_logprobs: list[dict] | None = None
    step: int | None = None  # the engine step these tokens came from
    journey: dict | None = None  # a journey ticket's own slice of this step (when it changed)


@dataclass
class Ticket:
    """One request as its handler and the loop share it."""

    request_id: str
    params: SamplingParams  # max_tokens may be replaced once the prompt length is known
    user: str
    aloop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    prompt_ids: list[int] | None = None  # the prompt tokenized by the handler
    client: object = None  # state.Client: who is asking, what limits count by
    default_max_tokens: int | None = None  # the budget when max_tokens is None (else the cap)
    prompt: str | list[int] | None = None  # completions: text or token ids
    messages: list[dict] | None = None  # chat: run through the chat template
    max_tokens: int | None = None  # None: what the model length leaves, up to the cap
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_output_tokens: int = 0
    open_samples: int = 1  # samples (n) not finished yet
    echo: bool = False  # the answer starts with the prompt's text
    journey: bool = False  # a student's request: deltas carry its own slice of each step
    arrival_step: int | None = None  # engine steps done when it entered the engine
    boarded_step: int | None = None  # the step that first gave it a seat
    board_wait_s: float = 0.0  # seconds from arrival to that step's end
    waited_for: list[str] = field(default_factory=list)  # reason codes seen at the door
    last_view: dict | None = None
    # a journey ticket's own life, stretch by stretch (engine/waits.py), built by the loop
    timeline: Timeline | None = None

    def __post_init__(self):
        if self.journey and self.timeline is None:
            self.timeline = Timeline()

    @property
    def kind(self) -> str:
        return user_kind(self.user)


class TokenText:
    """Token id -> its text and its UTF-8 bytes, for logprobs (OpenAI's `token`, `bytes`).

    A byte-level BPE token may hold part of a character: its bytes are the token's own (from
    the tokenizer's byte alphabet), its text those bytes decoded with replacement. Memoized
    per id (bounded by the vocabulary); called on the loop thread, which owns the tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[int, tuple[str, list[int]]] = {}
        try:
            from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

            self.byte_of = {c: b for b, c in bytes_to_unicode().items()}
        except ImportError:
            self.byte_of = {}

    def __call__(self, tok: int) -> tuple[str, list[int]]:
        hit = self.cache.get(tok)
        if hit is None:
            piece = self.tokenizer.convert_ids_to_tokens(tok)
            if isinstance(piece, str) and piece and all(c in self.byte_of for c in piece):
                raw = bytes(self.byte_of[c] for c in piece)
            else:
                raw = self.tokenizer.decode([tok]).encode()
            hit = self.cache[tok] = (raw.decode("utf-8", errors="replace"), list(raw))
        return hit

    def info(self, tok: int, entry) -> dict:
        """One token's logprobs as plain data: {"id", "token", "bytes", "logprob", "top":
        [{"id", "token", "bytes", "logprob"}]}; entry None (a prompt's first token): no
        logprob, no alternatives."""
        text, raw = self(tok)
        if entry is None:
            return {"id": tok, "token": text, "bytes": raw, "logprob": None, "top": None}
        own, alts = entry
        return {"id": tok, "token": text, "bytes": raw, "logprob": own,
                "top": [{"id": t, "token": self(t)[0], "bytes": self(t)[1], "logprob": lp}
                        for t, lp in alts]}


@dataclass
class StepOutputs:
    """One step's report, per ticket (OutputProcessor.process)."""

    step: int
    # (ticket id, sample index) -> its delta: the new tokens, text, logprobs, finish
    deltas: dict[tuple[str, int], Delta] = field(default_factory=dict)
    finishing: dict[str, Ticket] = field(default_factory=dict)  # every sample done: they left
    errors: list[tuple[Ticket, Delta]] = field(default_factory=list)  # failed alone: deliver now
    done: list[str] = field(default_factory=list)  # ticket ids the engine may forget, once each
    aborted: list[str] = field(default_factory=list)  # ticket ids whose abort this step lists

    def forget(self, rid: str) -> None:
        if rid not in self.done:
            self.done.append(rid)

    def pairs(self, tickets: dict[str, Ticket]) -> list[tuple[Ticket, Delta]]:
        """Each delta with its ticket (one still open, or finishing now), in order; a ticket
        that failed or was aborted gets nothing more."""
        return [(t, d) for (rid, _), d in self.deltas.items()
                if (t := tickets.get(rid) or self.finishing.get(rid)) is not None]


class OutputProcessor:
    """StepReports -> per-ticket deltas (see the module's docstring). `metrics`: the server's
    (engine/server/metrics.py) per-request figures, observed here: TTFT, inter-token latency,
    generated tokens, end-to-end latency, finish reasons."""

    def __init__(self, token_text: TokenText, metrics=None):
        self.token_text = token_text
        self.metrics = metrics
        self._owner: dict[str, tuple[str, int]] = {}  # engine request id -> (ticket, index)
        self._samples: dict[str, list[str]] = {}  # ticket id -> its engine request ids
        self._prompts: dict[str, list[int]] = {}  # ticket id -> prompt ids (prompt_logprobs)

    def add(self, ticket: Ticket, sample_ids: list[str], prompt_ids: list[int]) -> None:
        """A ticket now in the engine, as the requests `sample_ids` (its n samples)."""
        rid = ticket.request_id
        self._samples[rid] = list(sample_ids)
        for i, sid in enumerate(sample_ids):
            self._owner[sid] = (rid, i)
        if ticket.params.prompt_logprobs is not None:
            self._prompts[rid] = list(prompt_ids)

    def drop(self, rid: str) -> None:
        """Forget a ticket that left (its ids may still show in a report: `owner` parses)."""
        for sid in self._samples.pop(rid, ()):
            self._owner.pop(sid, None)
        self._prompts.pop(rid, None)

    def owner(self, sid: str) -> tuple[str, int]:
        """An engine request id -> (the ticket's request id, the sample's index)."""
        hit = self._owner.get(sid)
        if hit is not None:
            return hit
        base, sep, i = sid.rpartition("#")
        return (base, int(i)) if sep and i.isdigit() else (sid, 0)

    def process(self, report, tickets: dict[str, Ticket], now: float | None = None,
                ) -> StepOutputs:
        """The report's deltas, finishes, failures and aborts. Tickets that leave are taken
        out of `tickets` (finished ones go to `finishing`)."""
        now = time.perf_counter() if now is None else now
        out = StepOutputs(report.step)
        reasons: dict[str, str | None] = {}
        for e in report.emitted:
            reasons[e.request_id] = e.finish_reason
            rid, idx = self.owner(e.request_id)
            t = tickets.get(rid)
            if t is None:
                continue
            d = self._delta(out, rid, idx)
            d.token_ids.extend(e.token_ids)
            d.text += e.text
            if e.logprobs is not None:
                d.logprobs = (d.logprobs or []) + [self.token_text.info(tok, lp) for tok, lp in
                                                   zip(e.token_ids, e.logprobs)]
            if e.prompt_logprobs is not None:
                d.prompt_logprobs = [self.token_text.info(tok, lp) for tok, lp in
                                     zip(self._prompts.get(rid, ()), e.prompt_logprobs)]
            if e.token_ids:
                self._observe_tokens(t, len(e.token_ids), now)
        for sid in report.finished:
            self._finish(out, sid, reasons.get(sid), tickets, now)
        for sid, what in report.failures.items():
            rid, _ = self.owner(sid)
            t = tickets.pop(rid, None)
            if t is None:
                continue
            log.error("request %s failed alone in the engine: %s", rid, what)
            out.errors.append((t, Delta(error=APIError(
                500, f"this request failed in the engine ({what}); other requests were not "
                     f"affected", "server_error", code="request_failed"))))
            out.forget(rid)
        for sid in report.aborted:
            rid, _ = self.owner(sid)
            tickets.pop(rid, None)
            out.aborted.append(rid)
            out.forget(rid)  # every sample of it was aborted together
        for rid in out.done:
            self.drop(rid)
        return out

    @staticmethod
    def _delta(out: StepOutputs, rid: str, idx: int) -> Delta:
        return out.deltas.setdefault((rid, idx), Delta(index=idx, step=out.step))

    def _finish(self, out: StepOutputs, sid: str, reason: str | None,
                tickets: dict[str, Ticket], now: float) -> None:
        rid, idx = self.owner(sid)
        t = tickets.get(rid)
        if t is None:  # nobody waits for it (its ticket is gone): its record may go
            out.forget(rid)
            return
        self._delta(out, rid, idx).finish_reason = reason
        t.open_samples -= 1
        if t.open_samples > 0:
            return
        tickets.pop(rid)
        out.finishing[rid] = t
        out.forget(rid)  # keep the server's memory flat
        if self.metrics is not None:
            self.metrics.e2e.observe(now - t.arrival)
            self.metrics.on_finish(finish_reason(reason) or "unknown")

    def _observe_tokens(self, t: Ticket, n: int, now: float) -> None:
        m = self.metrics
        if t.first_token_time is None:
            t.first_token_time = now
            if m is not None:
                m.ttft.observe(now - t.arrival)
        elif m is not None:
            m.itl.observe(now - t.last_token_time)
        t.last_token_time = now
        t.num_output_tokens += n
        if m is not None:
            m.generation_tokens.inc(n)
