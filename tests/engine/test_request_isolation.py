"""One request's failure while sampling or detokenizing fails that request alone: the others
keep exactly their tokens, the failed one leaves with its blocks freed and its error kept."""

from __future__ import annotations

import pytest

import engine.sampler as sampler_mod
from engine import EngineConfig, LLMEngine
from engine.config import SamplingParams
from engine.detokenizer import Detokenizer

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time"]
BAD_SEED = 666


@pytest.fixture(scope="module")
def eng():
    return LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4, max_model_len=128,
                                  block_size=16, max_num_batched_tokens=128))


def _params():
    return [SamplingParams(max_tokens=8, temperature=0.0),
            SamplingParams(max_tokens=8, temperature=0.8, seed=5),
            SamplingParams(max_tokens=8, temperature=0.8, seed=9)]


def _run(eng, params, bad: SamplingParams | None):
    rids = [eng.add_request(p, sp) for p, sp in zip(PROMPTS, params)]
    bad_rid = eng.add_request("A bad request", bad) if bad is not None else None
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        assert steps < 100
    outs = [eng.output(r).token_ids for r in rids]
    failures, eng.failures = eng.failures, {}
    for r in rids + ([bad_rid] if bad_rid else []):
        eng.forget(r)
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks  # nothing leaked
    return outs, bad_rid, failures


def test_a_sampling_failure_fails_only_its_request(eng, monkeypatch):
    want, _, _ = _run(eng, _params(), None)
    real = sampler_mod.sample_rows

    def failing(rows, params, generators):
        if any(p.seed == BAD_SEED for p in params):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        return real(rows, params, generators)

    monkeypatch.setattr(sampler_mod, "sample_rows", failing)
    got, bad, failures = _run(eng, _params(), SamplingParams(max_tokens=8, temperature=0.7,
                                                            seed=BAD_SEED))
    assert got == want  # the seeded ones drew exactly what they drew alone
    assert list(failures) == [bad] and "nan" in failures[bad]


def test_a_detokenizer_failure_fails_only_its_request(eng, monkeypatch):
    want, _, _ = _run(eng, _params(), None)
    real_add = Detokenizer.add

    def add(self, token_id):
        if getattr(self, "_bad", False):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real_add(self, token_id)

    monkeypatch.setattr(Detokenizer, "add", add)
    real_init = Detokenizer.__init__

    def init(self, tokenizer, stop=None):
        real_init(self, tokenizer, stop)
        self._bad = stop == ["never-appears-xyz"]

    monkeypatch.setattr(Detokenizer, "__init__", init)
    got, bad, failures = _run(eng, _params(), SamplingParams(max_tokens=8, temperature=0.0,
                                                            stop=["never-appears-xyz"]))
    assert got == want
    assert list(failures) == [bad] and "UnicodeDecodeError" in failures[bad]


def test_tiny_temperature_and_top_p_keep_the_top_token():
    """A temperature below the epsilon is greedy; top_p of 1e-300 keeps the top token (no NaN)."""
    import torch

    from engine.sampler import probabilities, sample

    logits = torch.randn(1000, generator=torch.Generator().manual_seed(3))
    top = int(logits.argmax())
    assert sample(logits, SamplingParams(temperature=1e-40), torch.Generator()) == top
    p = probabilities(logits, SamplingParams(temperature=1.0, top_p=1e-300))
    assert not p.isnan().any() and int(p.argmax()) == top and float(p[top]) == 1.0
