"""Prompt-lookup (n-gram) proposer: the draft that costs no model at all.

Text often repeats itself: code echoes its variable names, a summary quotes its
source, a chat answer copies from the prompt. Prompt lookup (Saxena 2023,
"Prompt Lookup Decoding"; vLLM's `ngram` method) guesses the next tokens by
finding the most recent earlier place where the last n tokens already appeared
and proposing the k tokens that followed there. Longer suffixes are tried first
(they are more specific); no match means no draft, and the step is a plain decode.

Each call is O(n * len) with numpy, n <= prompt_lookup_max, so it is cheap enough to
run for every request at every step.
"""

from __future__ import annotations

import numpy as np

from engine.config import SpecConfig


def propose_ngram(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the last n tokens.

    token_ids: prompt + output so far. n goes from max_n down to min_n; the first n with
    a match wins. The suffix itself (the last n positions) is not a match. The proposal
    may be shorter than k (the match sits near the end) or empty (no n matched).
    """
    if k <= 0 or min_n < 1 or max_n < min_n:
        return []
    tokens = np.asarray(token_ids, dtype=np.int64)  # [L]
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]  # [n]
        num_starts = length - n  # candidate starts 0 .. L-n-1; start L-n is the suffix itself
        # match[i] is True when tokens[i : i + n] == suffix
        match = np.ones(num_starts, dtype=bool)  # [L - n]
        for j in range(n):
            match &= tokens[j : j + num_starts] == suffix[j]
        starts = np.flatnonzero(match)
        if len(starts):
            follow = starts[-1] + n  # the most recent occurrence; what came after it
            return tokens[follow : follow + k].tolist()
    return []


class NgramProposer:
    """Prompt lookup for a batch of requests, with the sizes from a SpecConfig."""

    def __init__(self, spec_config: SpecConfig):
        self.k = spec_config.num_speculative_tokens  # default draft length
        self.min_n = spec_config.prompt_lookup_min  # shortest suffix tried
        self.max_n = spec_config.prompt_lookup_max  # longest suffix tried (first)

    def propose(self, token_ids_list: list[list[int]], k: int | None = None) -> list[list[int]]:
        """One draft (possibly empty, at most k tokens) per request."""
        k = self.k if k is None else k
        return [propose_ngram(ids, k, self.min_n, self.max_n) for ids in token_ids_list]
