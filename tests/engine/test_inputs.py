"""InputProcessor (engine/inputs.py) alone, with a stand-in tokenizer: what add_request
refuses, and the Request each sample becomes."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.inputs import InputProcessor


class _Tokenizer:
    def encode(self, text, add_special_tokens=False):
        return [len(w) for w in text.split()]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join("x" * i for i in ids)


@pytest.fixture
def inputs():
    return InputProcessor(EngineConfig(max_model_len=8, max_num_seqs=4), _Tokenizer(), 10)


def test_prompts_are_tokenized_or_checked(inputs):
    assert inputs.tokenize("ab cde") == [2, 3]
    assert inputs.tokenize((1, 2)) == [1, 2]
    for bad, words in (("  ", "empty"), ([], "non-empty"), ([1, 10], r"\[0, 10\)"),
                       ([1, 1.5], "integers")):
        with pytest.raises(ValueError, match=words):
            inputs.tokenize(bad)


def test_process_refuses_what_cannot_run(inputs):
    ids, sp = inputs.process([1, 2, 3], None)
    assert ids == [1, 2, 3] and sp == SamplingParams()
    cases = [(([1] * 8, None), "max_model_len=8"),
             (([1], SamplingParams(logit_bias={10: 1.0})), "logit_bias"),
             (([1], SamplingParams(stop_token_ids=[3, 12])), r"stop_token_ids.*\[12\]"),
             (([1], SamplingParams(n=5)), "n=5"),
             (([1], {"max_tokens": 3}), "SamplingParams")]
    for args, words in cases:
        with pytest.raises(ValueError, match=words):
            inputs.process(*args)
    assert inputs.process([1] * 7, SamplingParams(n=4))[0] == [1] * 7  # the edges fit


def test_each_sample_gets_its_own_seed_and_lists():
    sps = InputProcessor.sample_params(SamplingParams(n=3, seed=7, logprobs=1))
    assert [(p.n, p.seed) for p in sps] == [(1, 7), (1, 8), (1, 9)]
    assert [p.seed for p in InputProcessor.sample_params(SamplingParams(n=2))] == [None, None]
    inputs = InputProcessor(EngineConfig(), _Tokenizer(), 10)
    a = inputs.request("g#1", [1, 2], sps[1], 5.0, default_seed=1, group="g", index=1)
    b = inputs.request("r", [1, 2], SamplingParams(prompt_logprobs=0), None, default_seed=1)
    c = inputs.request("s", [1, 2], SamplingParams(), None, default_seed=1)
    assert (a.group_id, a.index, a.arrival_time, a.generator.initial_seed()) == ("g", 1, 5.0, 8)
    assert a.output_logprobs == [] and a.prompt_logprobs is None
    assert b.prompt_logprobs == [None] and b.output_logprobs is None
    assert b.generator.initial_seed() == c.generator.initial_seed() == 1  # the default seed
    assert a.detokenizer is not b.detokenizer
