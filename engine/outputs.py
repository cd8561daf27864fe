"""What the engine hands back about its requests: each step's `Emitted`, each request's
`RequestOutput` (vLLM's `RequestOutput`).

`emit` runs once a step, after `Scheduler.update_from_output` advanced the requests: per
request its new tokens with the text they completed (`Detokenizer.take`: a stop string, and
the text of the EOS or stop token that ended it, left out), the output log-probabilities of
the tokens it kept, and its prompt's log-probabilities with its first tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.metrics import tpot, ttft
from engine.report import Emitted
from engine.request import Request

# the finish reasons whose last token ends the request and is not part of its text
TOKEN_STOPS = ("eos", "stop_token")


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    ttft_s: float | None
    tpot_s: float | None
    num_preemptions: int
    num_cached_tokens: int
    # SamplingParams.logprobs / prompt_logprobs: per token (logprob, [(token id, logprob)])
    logprobs: list | None = None
    prompt_logprobs: list | None = None
    # n > 1: every sample's output, in index order (the fields above are sample 0's)
    samples: list[RequestOutput] | None = None

    @classmethod
    def of(cls, r: Request) -> RequestOutput:
        """One request's output so far (copies: the request goes on)."""
        return cls(r.request_id, r.prompt_token_ids, list(r.output_token_ids), r.text,
                   r.finish_reason, ttft(r), tpot(r), r.num_preemptions, r.num_cached_tokens,
                   list(r.output_logprobs) if r.output_logprobs is not None else None,
                   list(r.prompt_logprobs) if r.prompt_logprobs is not None else None)

    @classmethod
    def of_group(cls, rid: str, samples: list[Request]) -> RequestOutput:
        """n > 1: sample 0's fields under the client's id, and every sample's output."""
        outs = [cls.of(r) for r in samples]
        return dataclasses.replace(outs[0], request_id=rid, samples=outs)


def emit(advanced: list[tuple[Request, list[int]]], logprobs: dict[str, list],
         ) -> tuple[list[Emitted], list[Request]]:
    """The step's advanced requests (request, tokens kept) -> their Emitted, in batch order,
    and those that finished (their text now final). `logprobs`: the step's output
    log-probabilities by request id (cut here to the tokens kept)."""
    emitted, finished = [], []
    for req, tokens in advanced:
        lps = prompt_lps = None
        if req.output_logprobs is not None:
            lps = logprobs.get(req.request_id, [])[:len(tokens)]
            req.output_logprobs.extend(lps)
        if req.prompt_logprobs is not None and req.num_output_tokens == len(tokens):
            prompt_lps = list(req.prompt_logprobs)  # with its first tokens: prefill done
        if req.is_finished:
            # the token that ended it (EOS, a stop token id) is not part of its text
            req.detokenizer.finish(drop_last=req.finish_reason in TOKEN_STOPS)
            finished.append(req)
        emitted.append(Emitted(req.request_id, tokens, req.detokenizer.take(req.is_finished),
                               lps, prompt_lps, req.finish_reason))
        req.text = req.detokenizer.visible(req.is_finished)
    return emitted, finished
