"""Leak 1 and leak 2 on the real engine: tour bus vs subway, banquet hall vs pages."""

from __future__ import annotations

import itertools

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from tests.conftest import PROMPTS

pytestmark = pytest.mark.slow


def _engine(**kw):
    base = dict(dtype="float32", max_num_seqs=2, max_model_len=64, block_size=8)
    return LLMEngine(EngineConfig(**{**base, **kw}))


def _submit(eng, lengths):
    return [eng.add_request(PROMPTS[i % len(PROMPTS)],
                            SamplingParams(max_tokens=n, ignore_eos=True))
            for i, n in enumerate(lengths)]


def test_static_boards_only_when_every_seat_is_empty_and_computes_finished_rows():
    eng = _engine(batching="static")
    a, b, c = _submit(eng, [2, 6, 3])
    seen_idle = False
    while eng.has_unfinished():
        rep = eng.step()
        states = {s.request_id: s.state for s in rep.seats}
        if states.get(a) == "idle-finished" and b in states:
            seen_idle = True
            assert c in rep.waiting, "the queue waits outside while a finished rider sits"
            assert c not in rep.admitted
            idle_seat = next(s for s in rep.seats if s.request_id == a)
            assert idle_seat.computed_this_step == 1, "a finished rider's row is still computed"
        if c in rep.admitted:
            assert eng.requests[a].is_finished and eng.requests[b].is_finished
    assert seen_idle
    assert eng.metrics_snapshot()["idle_seat_frac"] > 0


def test_continuous_boards_the_same_step_a_seat_frees():
    eng = _engine(batching="continuous")
    a, b, c = _submit(eng, [2, 6, 3])
    while eng.has_unfinished():
        rep = eng.step()
        if a in rep.finished:
            assert c in rep.waiting  # a leaves at the end of this step ...
            nxt = eng.step()
            assert c in nxt.admitted, "... and c boards in the very next step"
            assert not eng.requests[b].is_finished, "while b is still riding"
            break
    assert eng.metrics_snapshot()["idle_seat_frac"] == 0


def test_contiguous_reserves_prompt_plus_max_tokens_and_paged_grows():
    hall = _engine(kv_layout="contiguous", max_num_seqs=1)
    paged = _engine(kv_layout="paged", max_num_seqs=1)
    for eng in (hall, paged):
        _submit(eng, [4])
    rh, rp = hall.step(), paged.step()
    (table_h,) = rh.kv.block_tables.values()
    (table_p,) = rp.kv.block_tables.values()
    prompt_len = len(hall.requests["r0"].prompt_token_ids)
    assert len(table_h) == -(-(prompt_len + 4) // 8), "the hall: prompt + max_tokens reserved"
    assert table_h == list(range(table_h[0], table_h[0] + len(table_h))), "one contiguous run"
    assert len(table_p) == -(-rp.seats[0].num_tokens // 8), "pages: only what is written"
    states_h = {b["state"] for b in rh.kv.blocks}
    assert "reserved" in states_h
    assert rh.kv.useful_frac < rp.kv.useful_frac


def test_contiguous_request_waits_on_external_fragmentation_live():
    """Runs of different sizes come and go; then the free total would hold the next request,
    but no free run does, and it waits at the door (the report says why)."""
    eng = _engine(kv_layout="contiguous", max_num_seqs=4, num_kv_blocks=9)
    long_prompt = list(range(100, 112))  # 12 tokens
    plan = [("a", long_prompt, 2),  # 14 tokens: 2 blocks (0-1), leaves after 2 steps
            ("p", [100], 6),  # 7 tokens: 1 block (2), leaves after 6
            ("b", long_prompt, 12),  # 24 tokens: 3 blocks (3-5), leaves after 12
            ("e", long_prompt, 2),  # 2 blocks (6-7), leaves after 2
            ("d", long_prompt, 20)]  # 32 tokens: needs 4 blocks in a row
    for rid, prompt, n in plan:
        eng.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True), request_id=rid)
    fragmented, kv_before = [], eng.kv_summary()  # the pool as this step's scheduler saw it
    while eng.has_unfinished():
        rep = eng.step()
        reason = rep.blocked_reason or ""
        if reason.startswith("external fragmentation"):
            assert "d" in rep.waiting
            assert kv_before.free_blocks >= 4 > kv_before.largest_free_run, kv_before
            fragmented.append(rep.step)
        kv_before = rep.kv
    assert len(fragmented) >= 3, "d waited on fragmentation for several steps"
    assert eng.requests["d"].num_output_tokens == 20
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks, "leaked KV blocks"


def test_report_totals_agree_with_the_allocator():
    eng = _engine(max_num_seqs=3, kv_layout="paged", num_kv_blocks=12)
    _submit(eng, [5, 9, 3, 7])
    while eng.has_unfinished():
        rep = eng.step()
        kv = rep.kv
        assert kv.free_slots + kv.allocated_slots == kv.total_slots
        assert kv.free_blocks == eng.allocator.num_free_blocks
        assert kv.used_slots + kv.internal_waste_slots == kv.allocated_slots
        held = {b for t in kv.block_tables.values() for b in t}
        assert sum(1 for b in kv.blocks if b["state"] != "free") == len(held)
        assert len(rep.seats) == 3


@pytest.fixture(scope="module")
def reference_outputs():
    eng = _engine(max_num_seqs=4)
    return [o.token_ids for o in eng.generate(PROMPTS[:4], SamplingParams(max_tokens=10,
                                                                          ignore_eos=True))]


@pytest.mark.parametrize("batching, layout",
                         list(itertools.product(["static", "continuous"], ["contiguous", "paged"])))
def test_greedy_output_identical_across_switches(batching, layout, reference_outputs):
    eng = _engine(batching=batching, kv_layout=layout, max_num_seqs=3)
    outs = eng.generate(PROMPTS[:4], SamplingParams(max_tokens=10, ignore_eos=True))
    assert [o.token_ids for o in outs] == reference_outputs
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks, "leaked KV blocks"


def test_prefix_caching_shares_blocks_and_keeps_outputs():
    system = ("<|im_start|>system\nYou are a careful assistant for a cooking school. Answer in "
              "one short sentence, name one ingredient, and never use lists.<|im_end|>\n")
    qs = [system + f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
          for q in ("What is a roux?", "Why rest dough?", "How hot is a simmer?")]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    plain = _engine(max_num_seqs=1, max_model_len=128).generate(qs, params)
    eng = _engine(max_num_seqs=1, max_model_len=128, enable_prefix_caching=True)
    cached = eng.generate(qs, params)
    assert [o.token_ids for o in cached] == [o.token_ids for o in plain]
    assert cached[0].num_cached_tokens == 0
    assert all(o.num_cached_tokens >= 32 for o in cached[1:]), "the system prompt was shared"
    assert eng.allocator.prefix_hit_rate > 0.5
    assert all(c == 0 for c in eng.allocator.ref_count), "ref counts return to zero"


def test_shared_blocks_are_marked_in_the_kv_map():
    system = "<|im_start|>system\n" + "Always answer briefly and politely. " * 6 + "<|im_end|>\n"
    eng = _engine(max_num_seqs=2, max_model_len=128, enable_prefix_caching=True)
    eng.generate([system + "Hi"], SamplingParams(max_tokens=2, ignore_eos=True))
    _submit_prompts = [system + "Hello there", system + "Good morning"]
    for p in _submit_prompts:
        eng.add_request(p, SamplingParams(max_tokens=4, ignore_eos=True))
    rep = eng.step()
    assert any(b["state"] == "shared" and len(b["owners"]) == 2 for b in rep.kv.blocks)
