"""A client's prompt and SamplingParams -> checked token ids and one Request per sample.

What `LLMEngine.add_request` checks before anything is queued (vLLM v1's `Processor`): a
prompt is non-empty text (tokenized as it is, no chat template) or token ids inside the
vocabulary; it leaves room for at least one token under `max_model_len`; `logit_bias` and
`stop_token_ids` name tokens of the vocabulary; `n` samples fit the seats. Every failure is a
`ValueError` whose message names the field. Then each sample becomes a `Request` with its
own detokenizer and seeded generator (`requests`).

With n > 1 the samples are requests `<id>#<i>`; with paged KV only sample 0 computes the
prompt, and the others are forked from it once it has (its `fork_children`): they hold its
blocks by reference (PagedAttention's parallel sampling). Contiguous KV cannot share a
reserved run, so there each sample reserves its own and computes the prompt itself (the
same tokens, more work).
"""

from __future__ import annotations

import dataclasses

import torch

from engine.config import EngineConfig, SamplingParams
from engine.detokenizer import Detokenizer
from engine.request import Request


class InputProcessor:
    def __init__(self, config: EngineConfig, tokenizer, vocab_size: int):
        self.config, self.tokenizer, self.vocab_size = config, tokenizer, vocab_size

    def chat(self, messages: list[dict]) -> list[int]:
        """The model's chat template applied, ending where the answer starts (vLLM's
        LLM.chat)."""
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty")
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError("prompt must be non-empty text or a non-empty list of token ids")
        vocab = self.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        return list(prompt)

    def process(self, prompt: str | list[int], params: SamplingParams | None,
                ) -> tuple[list[int], SamplingParams]:
        """The prompt's token ids and the params (the defaults when None), both checked."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ValueError("params must be a SamplingParams")
        ids = self.tokenize(prompt)
        max_len = self.config.max_model_len
        if len(ids) >= max_len:
            raise ValueError(f"prompt is {len(ids)} tokens; max_model_len={max_len} "
                             f"leaves room for at most {max_len - 1}")
        vocab = self.vocab_size
        for name, toks in (("logit_bias", params.logit_bias or {}),
                           ("stop_token_ids", params.stop_token_ids or [])):
            bad = [t for t in toks if t >= vocab]
            if bad:
                raise ValueError(f"{name} has token ids outside the vocabulary [0, {vocab}): "
                                 f"{bad[:5]}")
        if params.n > self.config.max_num_seqs:
            raise ValueError(f"n={params.n} samples need as many seats; this engine has "
                             f"max_num_seqs={self.config.max_num_seqs}")
        return ids, params

    def requests(self, rid: str, ids: list[int], params: SamplingParams,
                 arrival_time: float | None, first_index: int) -> list[Request]:
        """The request's samples: itself (n=1), or `<rid>#<i>`, each with its own params (a
        given seed + i) and with paged KV forked from sample 0. `first_index`: the engine's
        requests so far (a default seed is the engine's seed and this index)."""
        if params.n == 1:
            return [self.request(rid, ids, params, arrival_time, self._seed(first_index))]
        samples = [self.request(f"{rid}#{i}", ids, sp, arrival_time,
                                self._seed(first_index + i), rid, i)
                   for i, sp in enumerate(self.sample_params(params))]
        if self.config.kv_layout == "paged":
            samples[0].fork_children = samples[1:]
            for r in samples[1:]:
                r.prompt_logprobs = None  # copied from sample 0 at the fork
        return samples

    def _seed(self, index: int) -> int:
        return self.config.seed * 100003 + index

    @staticmethod
    def sample_params(params: SamplingParams) -> list[SamplingParams]:
        """n > 1: each sample's own params (n=1; a given seed + i, so each draws its own)."""
        return [dataclasses.replace(params, n=1, seed=params.seed + i
                                    if params.seed is not None else None)
                for i in range(params.n)]

    def request(self, rid: str, ids: list[int], params: SamplingParams,
                arrival_time: float | None, default_seed: int, group: str | None = None,
                index: int = 0) -> Request:
        """One sample's Request: its detokenizer (with its stop strings), its generator
        (seeded by params.seed, else `default_seed`), its logprob lists when asked for."""
        seed = params.seed if params.seed is not None else default_seed
        req = Request(rid, ids, params, generator=torch.Generator().manual_seed(seed),
                      detokenizer=Detokenizer(self.tokenizer, params.stop),
                      group_id=group, index=index)
        if params.logprobs is not None:
            req.output_logprobs = []
        if params.prompt_logprobs is not None:
            req.prompt_logprobs = [None]  # the first prompt token has no prediction
        if arrival_time is not None:
            req.arrival_time = arrival_time
        return req
