"""Prompt-lookup proposer: what it proposes is always what followed the suffix before."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import SpecConfig
from engine.spec.ngram import NgramProposer, propose_ngram


def brute_force(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The definition, written the slow obvious way."""
    length = len(token_ids)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = token_ids[length - n :]
        for start in range(length - n - 1, -1, -1):  # most recent first, the suffix excluded
            if token_ids[start : start + n] == suffix:
                return token_ids[start + n : start + n + k]
    return []


def test_copies_what_followed_the_most_recent_match():
    #         0  1  2  3  4  5  6  7  8  9
    tokens = [5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7]
    # suffix [6, 7] occurs at 1 and 5; the most recent (5) was followed by 9, 2, 6, 7
    assert propose_ngram(tokens, k=3, min_n=1, max_n=2) == [9, 2, 6]
    assert propose_ngram(tokens, k=10, min_n=1, max_n=2) == [9, 2, 6, 7]


def test_longer_suffix_wins_over_a_more_recent_shorter_one():
    #         0  1  2  3  4  5  6  7
    tokens = [1, 2, 3, 4, 9, 3, 5, 1, 2, 3]
    # [1, 2, 3] matches at 0 (followed by 4); the bare [3] matches more recently at 5 (-> 5)
    assert propose_ngram(tokens, k=2, min_n=1, max_n=3) == [4, 9]
    assert propose_ngram(tokens, k=2, min_n=1, max_n=1) == [5, 1]


def test_no_repeat_no_draft():
    assert propose_ngram([1, 2, 3, 4, 5], k=4, min_n=1, max_n=4) == []
    assert propose_ngram([], k=4, min_n=1, max_n=4) == []
    assert propose_ngram([7], k=4, min_n=1, max_n=4) == []
    # [3, 4] repeats but min_n = 3 asks for more
    assert propose_ngram([3, 4, 0, 3, 4], k=4, min_n=3, max_n=4) == []


def test_match_may_run_into_the_suffix_itself():
    # a run of one token: the match at len-2 is followed only by the last token
    assert propose_ngram([4, 4, 4, 4], k=3, min_n=1, max_n=1) == [4]
    assert propose_ngram([1, 2, 1, 2, 1, 2], k=4, min_n=2, max_n=2) == [1, 2]


def test_proposer_uses_the_config_sizes():
    proposer = NgramProposer(SpecConfig(num_speculative_tokens=2, prompt_lookup_min=2))
    batch = [[1, 2, 3, 1, 2], [1, 2, 3, 0, 3], []]
    assert proposer.propose(batch) == [[3, 1], [], []]
    assert proposer.propose(batch, k=1) == [[3], [], []]


def test_long_context_is_fast():
    tokens = list(range(4000)) * 2  # 8000 tokens, the suffix repeats once
    start = time.perf_counter()
    for _ in range(100):
        draft = propose_ngram(tokens, k=4, min_n=1, max_n=4)
    per_call = (time.perf_counter() - start) / 100
    assert draft == [0, 1, 2, 3]  # the suffix 3996..3999 was followed by the second copy
    assert per_call < 5e-3, f"{per_call * 1e3:.2f} ms per call on 8000 tokens"


tokens_st = st.lists(st.integers(0, 3), max_size=40)  # a tiny alphabet, so repeats happen


@settings(max_examples=300, deadline=None)
@given(tokens=tokens_st, k=st.integers(1, 6), min_n=st.integers(1, 3), extra=st.integers(0, 3))
def test_proposals_are_continuations_of_an_earlier_suffix(tokens, k, min_n, extra):
    max_n = min_n + extra
    draft = propose_ngram(tokens, k, min_n, max_n)
    assert draft == brute_force(tokens, k, min_n, max_n)
    assert len(draft) <= k
    length = len(tokens)
    if draft:
        # some n in [min_n, max_n] and an earlier start where the suffix occurred, followed by draft
        assert any(
            tokens[start : start + n] == tokens[length - n :]
            and tokens[start + n : start + n + len(draft)] == draft
            for n in range(min_n, max_n + 1)
            for start in range(0, length - n)
        )
    else:
        # empty only when the shortest suffix never occurred before
        n = min_n
        assert length <= n or all(
            tokens[start : start + n] != tokens[length - n :] for start in range(length - n)
        )
