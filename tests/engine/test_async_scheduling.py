"""Async scheduling (EngineConfig.async_scheduling): step n + 1 is scheduled and launched before
step n's tokens are read back, its decode inputs copied from step n's sampled ids on the device.

On a CPU the forward runs in the caller, so nothing runs at the same time here; what these
tests pin is the bookkeeping that makes the overlap safe on a GPU: the same tokens, text and
finish reasons as without it (greedy and seeded sampling, stops of every kind, preemption,
aborts, the graph path), no KV block leaked, and steps that really were launched while the one
before was still in flight (`overlapped_steps`).
"""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, SamplingParams, SpecConfig
from engine.engine import LLMEngine
from tests.conftest import assert_blocks_consistent

PROMPTS = ["The capital of France is", "Write a short poem about the sea:", "1, 2, 3, 4,",
           "Once upon a time, there lived", "def fibonacci(n):", "List three primary colors:"]


def _params() -> list[SamplingParams]:
    """Every way a request ends: length, a stop string, EOS, max_model_len; greedy and
    seeded sampling side by side."""
    return [SamplingParams(max_tokens=20, temperature=0.0),
            SamplingParams(max_tokens=33, temperature=0.8, seed=7),
            SamplingParams(max_tokens=30, temperature=0.0, stop=[","]),
            SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=False),
            SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True),  # max_model_len
            SamplingParams(max_tokens=1, temperature=0.0)]


def _engine(async_scheduling: bool, **kw) -> LLMEngine:
    base = dict(max_num_seqs=4, max_model_len=80, block_size=8,
                async_scheduling=async_scheduling)
    base.update(kw)
    return LLMEngine(EngineConfig(**base))


def _run(eng: LLMEngine, params=None, late: int = 2) -> list[tuple]:
    """Half the requests now, the rest after `late` steps (they board while others decode)."""
    params = params or _params()
    half = len(PROMPTS) // 2
    rids = [eng.add_request(p, sp) for p, sp in zip(PROMPTS[:half], params[:half])]
    for _ in range(late):
        eng.step()
    rids += [eng.add_request(p, sp) for p, sp in zip(PROMPTS[half:], params[half:])]
    while eng.has_unfinished():
        eng.step()
    outs = [eng.output(r) for r in rids]
    assert_blocks_consistent(eng.allocator, [])
    for r in rids:
        eng.forget(r)
    return [(o.token_ids, o.text, o.finish_reason, o.logprobs,
             [(x.token_ids, x.finish_reason) for x in o.samples or ()]) for o in outs]


@pytest.mark.parametrize("kw", [{}, {"kv_layout": "contiguous"}, {"cuda_graphs": True},
                                {"enable_prefix_caching": True}],
                         ids=["paged", "contiguous", "graphs", "prefix-cache"])
def test_same_tokens_as_without_overlap(kw):
    off = _run(_engine(False, **kw))
    eng = _engine(True, **kw)
    on = _run(eng)
    assert on == off
    assert {o[2] for o in off} >= {"length", "stop", "max_model_len"}
    assert eng.overlapped_steps > 10  # the steps really overlapped
    assert eng._inflight is None and not eng.has_unfinished()


def test_preemption_with_a_token_in_flight():
    """A pool too small for everyone: requests are preempted while their last token is still
    pending; they keep it, recompute and end with the tokens of a run that never preempted."""
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)] * 6
    calm = _run(_engine(False, max_num_seqs=6), params)
    eng = _engine(True, max_num_seqs=6, num_kv_blocks=24)
    victims = []  # each preempted request's pending tokens at that moment
    preempt = eng.scheduler._preempt

    def spy(req):
        victims.append(req.num_pending)
        preempt(req)

    eng.scheduler._preempt = spy
    assert _run(eng, params) == calm
    assert victims and any(victims)  # preempted, some of them with a token in flight
    assert eng.overlapped_steps > 10


def test_abort_while_a_step_is_in_flight():
    """An abort lands between a step's launch and its landing: the request's pending token is
    dropped, its blocks freed, the others' tokens are those of a run without it."""
    params = [SamplingParams(max_tokens=24, ignore_eos=True)] * 3
    ref = LLMEngine(EngineConfig(max_num_seqs=4, max_model_len=80, block_size=8))
    want = [ref.output(ref.add_request(p, sp)) for p, sp in zip(PROMPTS[:2], params)]
    while ref.has_unfinished():
        ref.step()
    want = [ref.output(o.request_id).token_ids for o in want]

    eng = _engine(True)
    rids = [eng.add_request(p, sp) for p, sp in zip(PROMPTS[:3], params)]
    for _ in range(5):
        eng.step()
    assert eng._inflight is not None and eng.requests[rids[2]].num_pending == 1
    eng.abort_request(rids[2])
    while eng.has_unfinished():
        eng.step()
    assert [eng.output(r).token_ids for r in rids[:2]] == want
    assert eng.output(rids[2]).finish_reason == "abort"
    assert_blocks_consistent(eng.allocator, [])


def test_requests_that_need_their_tokens_on_the_host_run_without_overlap():
    """Penalties, logprobs and n > 1 read the last token before the next sampling: while one
    is in the engine the steps do not overlap, and everything still matches."""
    params = _params()
    params[0] = SamplingParams(max_tokens=20, frequency_penalty=1.5)
    params[1] = SamplingParams(max_tokens=10, temperature=0.8, seed=3, n=2)
    params[2] = SamplingParams(max_tokens=12, logprobs=2)
    off = _engine(False)
    want = _run(off, params)
    eng = _engine(True)
    launch, launched_with = eng._launch, []

    def spy(prev):  # a step is launched ahead only while every request is plain
        if prev is not None:
            launched_with.append({r.request_id for r in eng.scheduler.running
                                  if not r.sampling.speculable})
        return launch(prev)

    eng._launch = spy
    got = _run(eng, params)
    assert got == want
    assert launched_with and not any(launched_with)
    assert eng.overlapped_steps > 0  # once those two left, the rest overlapped


def test_config_refuses_what_it_cannot_overlap():
    with pytest.raises(ValueError, match="async_scheduling does not run with speculation"):
        EngineConfig(async_scheduling=True, spec=SpecConfig(method="ngram"))
    with pytest.raises(ValueError, match="async_scheduling needs batching='continuous'"):
        EngineConfig(async_scheduling=True, batching="static")
    with pytest.raises(ValueError, match="async_scheduling must be True or False"):
        EngineConfig(async_scheduling="yes")


def test_server_streams_the_same_answers():
    """engine.serve on an engine with async scheduling: concurrent streaming clients get, token
    for token, what the engine gives offline without it; an abort (a client that leaves)
    frees its blocks."""
    import concurrent.futures
    import json

    import httpx

    from tests.conftest import in_loop, running_server

    kw = dict(max_num_seqs=4, max_model_len=128, block_size=8)
    ref = LLMEngine(EngineConfig(**kw))
    asks = [(p, 12 + 5 * i) for i, p in enumerate(PROMPTS[:5])]
    want = [o.token_ids for o in ref.generate(
        [p for p, _ in asks], [SamplingParams(max_tokens=m, ignore_eos=True) for _, m in asks])]

    eng = LLMEngine(EngineConfig(async_scheduling=True, **kw))
    with running_server(eng) as (url, app), httpx.Client(base_url=url, timeout=60) as c:
        def ask(item):
            prompt, m = item
            ids = []
            with c.stream("POST", "/v1/completions", json={
                    "model": "smollm2-135m", "prompt": prompt, "max_tokens": m,
                    "temperature": 0, "ignore_eos": True, "stream": True,
                    "return_token_ids": True}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line == "data: [DONE]":
                        break
                    if line.startswith("data: "):
                        for ch in json.loads(line[6:])["choices"]:
                            ids += ch.get("token_ids") or []
            return ids

        with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
            got = list(pool.map(ask, asks))
        assert got == want
        assert in_loop(app, lambda e: e.overlapped_steps) > 10
        assert in_loop(app, lambda e: e.allocator.num_free_blocks == e.allocator.num_blocks)
