"""SpecDecoder: draft before the step, verify after the forward, and record every decision.

Speculative decoding (Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via
Speculative Decoding", arXiv:2211.17192; chapter 6.4, the third fix) in the engine's step:

1. `propose(running)`, called by `LLMEngine.step()` before scheduling: every request that is
   decoding gets up to k drafted tokens in `req.spec_token_ids`, from prompt lookup (Saxena
   2023, "Prompt Lookup Decoding"; `ngram.py`), a draft model (`draft.py`) or the EAGLE
   head on the target's own features (`eagle.py`; the engine hands it the features of every
   token the target computed, `observe`, after each forward), or with `prompt_lookup_first`
   prompt lookup where the text has a match and the model elsewhere. The scheduler
   then computes `[last token, *draft]` for it in the same batched forward as everyone
   else's prefill chunks and decodes.
2. `verify(req, logits)`: the target's logits after `[last, x_1..x_k]` ([k + 1, vocab]):
   * greedy requests accept while the draft equals the target's argmax; the token after the
     accepted prefix is the target's argmax there (the correction, or the bonus when all k
     matched). The output is token for token what greedy decoding without a draft gives.
   * sampling requests use the rejection rule (`rejection.rejection_sample`): accept x_i with
     probability min(1, p_target / p_draft), on the first rejection draw from
     normalize(max(0, p_target - p_draft)), else a bonus from p_target[k]. p_target is what
     the request's sampler would sample from (temperature, top-k, top-p applied); p_draft is
     the draft model's distribution after the same transform, or a one-hot for n-gram
     drafts. Every draw uses the request's own generator, so a seed fixes the output.
   The engine keeps the K/V of the accepted tokens only (the rollback), and the records go
   into the StepReport.

Draft length: k is the configured `num_speculative_tokens`, or with `adaptive_k` the k that
`SpecLength` (adaptive.py, after SmartSpec) expects to give the most tokens per second this
step, from the step times and acceptance it has measured (`on_step`); either way k is capped
so that `num_tokens + k < max_model_len` and so that a request never drafts more than it
may still emit (`max_tokens - num_output_tokens - 1`: the verification always adds one token
of its own).

The records: for sampling requests p_target / p_draft are the probabilities the decision
used. For greedy requests the decision is argmax matching (accept_prob 1 or 0); p_target
and p_draft show each model's plain softmax (temperature 1) confidence in the token, and
p_draft is 1.0 for an n-gram draft. Each checked drafted token and the token after the
accepted prefix also carry the target's TOP_ALTERNATIVES most likely tokens from that same
row (`top`, `next_top`; for the next token also its own probability there, `next_p`).
"""

from __future__ import annotations

import time

import torch

from engine.request import Request
from engine.sampler import probabilities
from engine.spec.adaptive import SpecLength
from engine.spec.draft import DraftProposer, Proposal
from engine.spec.eagle import EagleProposer
from engine.spec.ngram import NgramProposer
from engine.spec.rejection import (
    Alternative,
    SpecDecision,
    greedy_decision,
    rejection_sample,
    top_of,
)

# the target's most likely tokens recorded per checked position: enough to see what a draft
# had to match, few enough that a report stays small
TOP_ALTERNATIVES = 3


class SpecDecoder:
    def __init__(self, engine, spec_config):
        self.engine = engine
        self.config = spec_config
        self.k = spec_config.num_speculative_tokens
        # token id -> its text decoded alone, for the records: each verify names up to
        # (k + 1) * (TOP_ALTERNATIVES + 1) tokens, mostly the same few; bounded by the vocabulary
        self._texts: dict[int, str] = {}
        # prompt lookup: the method itself, or in front of the model (prompt_lookup_first)
        self.ngram = (NgramProposer(spec_config) if spec_config.method == "ngram"
                      or spec_config.prompt_lookup_first else None)
        # the proposer with a model ("draft" or "eagle"); None for prompt lookup
        self.draft = None
        if spec_config.method == "draft":
            self.draft = DraftProposer(engine, spec_config)
        elif spec_config.method == "eagle":
            self.draft = EagleProposer(engine, spec_config)
        self.proposals: dict[str, Proposal] = {}  # this step's drafts, until verified
        # adaptive k: the step's k from measured costs and acceptance (None: always k)
        self.length = SpecLength(self.k) if spec_config.adaptive_k else None
        self.step_k = self.k  # the k this step drafted with (before each request's caps)
        self._asked: dict[str, int] = {}  # request -> the k it was asked for, until verified
        self._decoding: set[str] = set()  # requests decoding at this step's propose
        self._draft_s = 0.0  # this step's drafting time
        self._num_drafting = 0  # ... how many requests drafted
        self._drafted_positions = 0  # ... and its longest draft

    @property
    def wants_features(self) -> bool:
        """Does the proposer read the target's hidden states (the EAGLE head)?"""
        return isinstance(self.draft, EagleProposer)

    def observe(self, fwd) -> None:
        """After the target's forward: hand each request's computed tokens' features to the
        EAGLE head (fwd: a runner ForwardResult with hidden states)."""
        for req, start, row, n in fwd.spans:
            tokens = req.token_ids_between(start, start + n)
            self.draft.observe(req, start, tokens, fwd.hidden[row:row + n])

    def max_draft_len(self, req: Request) -> int:
        """k, capped by the model length and the tokens the request may still emit."""
        room_len = self.engine.config.max_model_len - 1 - req.num_tokens
        room_out = req.sampling.max_tokens - req.num_output_tokens - 1
        return max(0, min(self.k, room_len, room_out))

    @staticmethod
    def is_decoding(req: Request) -> bool:
        # logprobs, penalties, bias, min_tokens and n > 1 step one token at a time: the
        # verifier reads neither processed logits nor logprobs
        return (not req.in_prefill and not req.idle_finished and not req.is_finished
                and req.num_computed_tokens == req.num_tokens - 1 and req.sampling.speculable)

    # --- before the step --------------------------------------------------------------------
    def propose(self, running: list[Request]) -> None:
        """Fill `spec_token_ids` of every decoding request (others get none)."""
        t0 = time.perf_counter()
        self.proposals.clear()
        self._asked.clear()
        decoding = [r for r in running if self.is_decoding(r)]
        self._decoding = {r.request_id for r in decoding}
        if self.length is not None:
            idle = sum(1 for r in running if r.idle_finished)
            self.step_k = self.length.choose(len(decoding), idle)
        if decoding:
            self.engine.metrics.on_spec_k(self.step_k)
        reqs, ks = [], []
        for req in running:
            req.spec_token_ids = []
        for req in decoding:
            k = min(self.step_k, self.max_draft_len(req))
            if k > 0:
                reqs.append(req)
                ks.append(k)
        props = [Proposal([], None, []) for _ in reqs]
        model_rows = list(range(len(reqs)))  # the requests the draft model drafts for
        if self.ngram is not None:
            for i, (req, k) in enumerate(zip(reqs, ks)):
                d = self.ngram.propose([req.all_token_ids], k)[0]
                props[i] = Proposal(d, None, [1.0] * len(d), "lookup")  # p_draft None: one-hot
            model_rows = [i for i, p in enumerate(props) if not p.token_ids]
        if self.draft is not None:
            self.draft.sync(running)
            if model_rows:
                more = self.draft.propose([reqs[i] for i in model_rows],
                                          [ks[i] for i in model_rows])
                for i, p in zip(model_rows, more):
                    props[i] = p
        for req, k, prop in zip(reqs, ks, props):
            if prop.token_ids:
                req.spec_token_ids = list(prop.token_ids)
                self.proposals[req.request_id] = prop
                self._asked[req.request_id] = k
            elif self.length is not None:
                self.length.observe_request(k, 0, 0)  # asked, found nothing to draft
        self._num_drafting = len(self._asked)
        self._drafted_positions = max((len(p.token_ids) for p in props), default=0)
        self._draft_s = time.perf_counter() - t0

    def on_step(self, sched, seconds: float) -> None:
        """After the step (`seconds` from drafting's end to the report): adaptive k learns the
        cost of a decode step of this many tokens, and of drafting for this many requests."""
        if self.length is None or not sched.scheduled:
            return
        if any(s.req.request_id not in self._decoding and not s.idle for s in sched.scheduled):
            return  # a prefill chunk rode along: not a decode step's cost
        self.length.observe_step(sched.num_tokens, seconds, self._num_drafting,
                                 self._drafted_positions, self._draft_s)

    def plan(self) -> dict:
        """This step's k and, under adaptive k, what each k was expected to give."""
        if self.length is None:
            return {"k": self.step_k, "adaptive": False}
        return {"k": self.step_k, "adaptive": True, "explored": self.length.explored,
                "estimates": [vars(e) for e in self.length.last]}

    def release(self, req: Request) -> None:
        """The request finished: free its draft state now."""
        self.proposals.pop(req.request_id, None)
        self._asked.pop(req.request_id, None)
        if self.draft is not None:
            self.draft.release(req.request_id)

    # --- after the forward ------------------------------------------------------------------
    def verify(self, req: Request, logits: torch.Tensor) -> tuple[list[int], SpecDecision]:
        """logits: [1 + k, vocab] fp32 after [last, *draft] -> (tokens to append, record)."""
        draft = list(req.spec_token_ids)  # the scheduler may have cut the draft short
        k = len(draft)
        assert logits.shape[0] == k + 1, (logits.shape, k)
        prop = self.proposals.pop(req.request_id, None)
        p_draft_x = prop.p_draft_x[:k] if prop is not None else [None] * k
        sp = req.sampling
        if sp.greedy:
            p_target = torch.softmax(logits, dim=-1)  # [k + 1, V], for the record only
            decision = greedy_decision(draft, logits.argmax(dim=-1), p_target=p_target)
        else:
            p_target = probabilities(logits, sp)  # [k + 1, V]
            p_draft = None  # n-gram: a one-hot on each drafted token
            if prop is not None and prop.p_draft is not None:
                p_draft = prop.p_draft[:k]  # [k, V]
            decision = rejection_sample(draft, p_target, p_draft, req.generator)
        self._record_alternatives(decision, p_target)
        self.engine.metrics.on_verify(k, decision.num_accepted)
        asked = self._asked.pop(req.request_id, None)
        if self.length is not None and asked is not None:
            self.length.observe_request(asked, k, decision.num_accepted)
        text = self._text
        for d, p_x in zip(decision.drafted, p_draft_x):
            d.text = text(d.token_id)
            if d.p_draft is None:
                d.p_draft = p_x  # greedy: the draft model's own confidence, for the record
        for alt in [a for d in decision.drafted for a in d.top] + decision.next_top:
            alt.text = text(alt.token_id)
        decision.request_id = req.request_id
        decision.source = prop.source if prop is not None else ""
        decision.next_text = text(decision.next_token_id)
        return decision.emitted_tokens, decision

    def _text(self, token_id: int) -> str:
        hit = self._texts.get(token_id)
        if hit is None:
            hit = self._texts[token_id] = self.engine.tokenizer.decode([token_id])
        return hit

    @staticmethod
    def _record_alternatives(decision: SpecDecision, p_target: torch.Tensor) -> None:
        """From the rows the record's p_target came from ([k + 1, V]): the top tokens of each
        checked position (rows 0..num_accepted) and the next token's row (num_accepted)."""
        n = decision.num_accepted
        top = top_of(p_target[:n + 1], TOP_ALTERNATIVES)
        for d, alts in zip(decision.drafted, top):  # the drafted tokens that were checked
            d.top = [Alternative(i, p) for i, p in alts]
        decision.next_top = [Alternative(i, p) for i, p in top[n]]
        decision.next_p = float(p_target[n, decision.next_token_id])

