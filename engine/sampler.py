"""Turning logits into tokens: greedy, temperature, top-k, top-p; one seeded generator each.

Before sampling, a request that asks for them gets its own row changed (a copy; the batch's
other rows are untouched, so greedy requests that ask for nothing keep their tokens whatever
shares the step): presence and frequency penalties over its output so far (OpenAI's and
vLLM's definition), `logit_bias`, and `min_tokens`' mask of the end-of-sequence and stop
token ids. Log-probabilities are read from the raw logits, before any of that (vLLM's
default, `raw_logprobs`).

Whatever `temperature`, `top_k` and `top_p` say, at least the most likely token keeps its
probability: a temperature below `GREEDY_EPS` is greedy, and top-p always keeps the first
token of the sorted distribution (a `top_p` of 1e-300 rounds to 0 in fp32, which would drop
them all and divide by zero).

Every request owns a `torch.Generator` seeded from its `seed` (or the engine's seed and
its index), and only its own draws use it, so the same seed gives the same tokens whatever
else shares the batch.

`Sampler.sample(fwd, requests)` is a step's sampling: a forward's logits -> each request's new
tokens (one sample, or a draft the speculative verifier checked), with the log-probabilities
its request asked for. The engine calls it through its failure isolation
(`LLMEngine._sample_isolated`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

import torch

from engine.config import SamplingParams

if TYPE_CHECKING:
    from engine.request import Request
    from engine.runner import ForwardResult
    from engine.spec.rejection import SpecDecision

# at least the most likely token keeps its probability whatever temperature and top_p say:
# below this temperature sampling is greedy (logits / 1e-40 overflow to inf, then NaN)
GREEDY_EPS = 1e-5


def _greedy(params: SamplingParams) -> bool:
    return params.greedy or params.temperature < GREEDY_EPS


def argmax(logits: torch.Tensor) -> int:
    """Index of the largest logit (the first, on a tie). On the CPU, numpy's argmax: torch's
    takes ~130 us on a 49,152-logit row here, numpy's ~8 us, and a greedy step runs one per
    request (same first-max rule; tests/engine/test_sampling.py compares them)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.dim() == 1:
        return int(logits.numpy().argmax())
    return int(logits.argmax())


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[..., vocab] fp32 logits -> the distribution this request samples from.

    Greedy requests get a one-hot on the argmax (what speculative verification compares)."""
    if _greedy(params):
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p (keep at least one)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        drop[..., 0] = False  # the most likely token stays, however small top_p is
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits: torch.Tensor, params: SamplingParams,
           generator: torch.Generator | None) -> int:
    """One token from one row of logits ([vocab], fp32)."""
    if _greedy(params):
        return argmax(logits)
    probs = probabilities(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row of [rows, vocab] logits (the first maximum), as int64 on the
    logits' device: no wait for a GPU (async scheduling reads them there). On the CPU,
    numpy's argmax, for its speed (see `argmax`)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.numpy().argmax(axis=1).astype("int64"))
    return logits.argmax(dim=-1)


def sample_rows(logits: torch.Tensor, params: list[SamplingParams],
                generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of logits [rows, vocab], on the model's device: the greedy rows by one
    argmax call for all of them (the first maximum, as `argmax` per row; numpy's on the CPU,
    for its speed; on a GPU the argmax runs there and only the token ids cross to the host),
    the others one by one on the host, where their generators live."""
    tokens: list[int | None] = [None] * len(params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    if greedy:
        picked = logits if len(greedy) == len(params) else logits[greedy]
        for i, tok in zip(greedy, greedy_ids(picked).tolist()):
            tokens[i] = tok
    others = [i for i, p in enumerate(params) if not p.greedy]
    if others:
        host = logits[others].cpu()  # one copy for every sampling row
        for row, i in enumerate(others):
            tokens[i] = sample(host[row], params[i], generators[i])
    return tokens


def process(logits: torch.Tensor, params: SamplingParams, output_ids: list[int],
            masked_ids: list[int]) -> torch.Tensor:
    """A copy of one row [vocab] with the request's penalties, bias and masks applied.

    presence/frequency (OpenAI): logit -= frequency * count + presence * (count > 0), the
    counts over the tokens this request generated so far. `masked_ids`: the ids min_tokens
    forbids for now (end-of-sequence and stop_token_ids), set to -inf."""
    row = logits.float().clone()
    vocab = row.shape[-1]
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(output_ids, device=row.device), minlength=vocab)
        counts = counts[:vocab].to(row.dtype)
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias.keys()), device=row.device)
        row.index_add_(0, ids, torch.tensor(list(params.logit_bias.values()),
                                            dtype=row.dtype, device=row.device))
    if masked_ids:
        row[torch.tensor(masked_ids, device=row.device)] = float("-inf")
    return row


# one generated (or prompt) token's log-probabilities: its own, and the most likely
# alternatives as (token id, logprob), most likely first
TokenLogprobs = tuple[float, list[tuple[int, float]]]


def logprobs_of(rows: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprobs]:
    """Raw log-probabilities ([rows, vocab] logits, one token per row): each token's own and
    the `top` most likely of its row. fp32 log-softmax, on the rows' device; one copy back."""
    lp = torch.log_softmax(rows.float(), dim=-1)
    idx = torch.tensor(tokens, device=lp.device).unsqueeze(1)
    own = lp.gather(1, idx).squeeze(1).tolist()
    if top > 0:
        vals, ids = lp.topk(top, dim=-1)
        vals, ids = vals.tolist(), ids.tolist()
    else:
        vals = ids = [[] for _ in tokens]
    return [(o, list(zip(i, v))) for o, i, v in zip(own, ids, vals)]


class SamplerOutput(NamedTuple):
    """One forward's sampling (unpacks as `sampled, records, logprobs`)."""

    sampled: dict[str, list[int]]  # request id -> its new tokens
    records: list[SpecDecision]  # one per verified draft
    # request id -> its new token's log-probabilities, for requests with SamplingParams.logprobs
    logprobs: dict[str, list[TokenLogprobs]]


def logit_rows(logits: torch.Tensor, index: list[int]) -> torch.Tensor:
    """logits[index], [len(index), vocab]; no copy when they are the first rows in order (a
    step without drafts or prompt logprobs)."""
    return logits[:len(index)] if index == list(range(len(index))) else logits[index]


class Sampler:
    """A forward's logits -> each request's new tokens.

    `eos_ids`: what `min_tokens` masks (with the request's stop_token_ids) until it has that
    many tokens, unless it ignores EOS. `verify`: the speculative verifier
    (`SpecDecoder.verify`: a request and its k + 1 rows on the host -> tokens, record), for
    requests with a draft; None without speculation."""

    def __init__(self, eos_ids: set[int],
                 verify: Callable[[Request, torch.Tensor], tuple[list[int], SpecDecision]]
                 | None = None):
        self.eos_ids = eos_ids
        self.verify = verify

    def sample(self, fwd: ForwardResult, requests: Mapping[str, Request]) -> SamplerOutput:
        """Each of `fwd.rows`' requests' new tokens: one sample from its last row (and the
        same row for the samples to fork from it), or a verified draft. Prompt
        log-probabilities go into the request now (`Request.prompt_logprobs`); output ones
        come back for the caller to keep with the tokens it keeps."""
        for rid, (first, pos, count) in fwd.prompt_rows.items():
            req = requests[rid]
            toks = req.prompt_token_ids[pos + 1:pos + 1 + count]
            req.prompt_logprobs.extend(logprobs_of(fwd.logits[first:first + count], toks,
                                                   req.sampling.prompt_logprobs))
        out = SamplerOutput({}, [], {})
        plain: list[tuple[Request, int]] = []  # (request, its logit row)
        for rid, (first, n) in fwd.rows.items():
            req = requests[rid]
            if req.spec_token_ids:
                # the verifier reads probabilities with the request's (host) generator: its rows
                # come to the host (k + 1 rows, not the batch's)
                out.sampled[rid], record = self.verify(req, fwd.logits[first:first + n].cpu())
                out.records.append(record)
            else:
                plain.append((req, first + n - 1))  # sampled from its last row
                # samples to fork from it sample their first token from the same row
                plain.extend((child, first + n - 1) for child in req.fork_children)
        if plain:
            self._sample_plain(fwd.logits, plain, out)
        return out

    def _sample_plain(self, logits: torch.Tensor, plain: list[tuple[Request, int]],
                      out: SamplerOutput) -> None:
        raw = logit_rows(logits, [row for _, row in plain])
        rows = self.processed(raw, [req for req, _ in plain])
        tokens = sample_rows(rows, [r.sampling for r, _ in plain],
                             [r.generator for r, _ in plain])
        for (req, _), tok in zip(plain, tokens):
            out.sampled[req.request_id] = [tok]
        want = [i for i, (r, _) in enumerate(plain) if r.sampling.logprobs is not None]
        if want:  # raw log-probabilities: read before penalties, bias and masks
            top = max(plain[i][0].sampling.logprobs for i in want)
            lps = logprobs_of(raw[want], [tokens[i] for i in want], top)
            for i, (own, alts) in zip(want, lps):
                req = plain[i][0]
                out.logprobs[req.request_id] = [(own, alts[:req.sampling.logprobs])]

    def processed(self, raw: torch.Tensor, reqs: list[Request]) -> torch.Tensor:
        """raw [len(reqs), vocab] logits with each request's penalties, logit_bias and
        min_tokens mask applied (`process`); only the rows that ask for one are copied and
        changed, the others are the same values (`raw` itself when none asks)."""
        changed = [i for i, r in enumerate(reqs) if r.sampling.processes_logits]
        if not changed:
            return raw
        rows = raw.clone()
        for i in changed:
            req = reqs[i]
            rows[i] = process(raw[i], req.sampling, req.output_token_ids, self.masked(req))
        return rows

    def masked(self, req: Request) -> list[int]:
        """The token ids `min_tokens` forbids this request now: end-of-sequence (unless it
        ignores EOS) and its stop_token_ids, while it has fewer than min_tokens tokens."""
        sp = req.sampling
        if req.num_output_tokens >= sp.min_tokens:
            return []
        return [*(() if sp.ignore_eos else self.eos_ids), *(sp.stop_token_ids or ())]
