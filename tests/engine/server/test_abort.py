"""Aborts in the engine (vLLM's `abort_request`), as the server uses them: the request leaves
its seat or the queue and its blocks are free at once; the next step's report lists it under
`aborted`. Running and queued requests, on both batching policies and both KV layouts."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from tests.conftest import assert_blocks_consistent

pytestmark = pytest.mark.slow

PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize("batching,layout", [("continuous", "paged"), ("static", "contiguous")])
def test_abort_frees_seat_and_blocks(batching, layout):
    eng = LLMEngine(EngineConfig(dtype="float32", batching=batching, kv_layout=layout,
                                 max_num_seqs=2, max_model_len=128, block_size=16))
    a = eng.add_request("The capital of France is", PARAMS)
    b = eng.add_request("Once upon a time", PARAMS)
    c = eng.add_request("def add(a, b):", PARAMS)  # waits: two seats
    for _ in range(3):
        eng.step()
    assert eng.requests[a].block_table, "a should be running and hold blocks"
    held = len(eng.requests[a].block_table)
    free_before = eng.allocator.num_free_blocks
    eng.abort_request(a)
    eng.abort_request(c)
    eng.abort_request(a)  # a second abort of the same request changes nothing
    with pytest.raises(ValueError, match="nope"):
        eng.abort_request("nope")
    assert eng.allocator.num_free_blocks == free_before + held
    assert_blocks_consistent(eng.allocator, eng.scheduler.running)
    report = eng.step()
    assert sorted(report.aborted) == sorted([a, c])
    assert a not in report.kv.block_tables and a not in report.waiting
    assert c not in report.waiting
    assert all(s.request_id not in (a, c) for s in report.seats)
    assert eng.requests[a].finish_reason == "abort" and eng.requests[a].block_table == []
    while eng.has_unfinished():
        eng.step()
    assert eng.output(b).finish_reason == "length" and len(eng.output(b).token_ids) == 12
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks


def test_abort_of_the_last_request():
    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=2, max_model_len=128))
    a = eng.add_request("Hello", PARAMS)
    eng.step()
    eng.abort_request(a)
    assert not eng.has_unfinished()
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
    report = eng.step()  # the server steps once more, so viewers see the abort
    assert report.aborted == [a] and report.emitted == []
