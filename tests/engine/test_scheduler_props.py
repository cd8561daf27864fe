"""Scheduler property test (no model): random workloads under every policy and pool size.

A fake model loop advances each scheduled request exactly as the engine does; whatever the
arrivals, lengths, seats and pool, no block has two owners, seats match the running list,
preempted requests come back and finish, and after everything finishes all blocks are free;
and at every step every unfinished request either advanced or has exactly one reason why not
(engine/waits.py), every waiting one has one, and a reason names no finished request.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig, SamplingParams
from engine.kv import ContiguousAllocator, PagedAllocator
from engine.request import Request
from engine.scheduler import Scheduler
from engine.waits import WAIT_CODES


def _check(sched: Scheduler) -> None:
    owners: dict[int, str] = {}
    alloc = sched.allocator
    for r in sched.running:
        assert sched.seats[r.seat] is r, "seat and running list disagree"
        for b in r.block_table:
            if isinstance(alloc, PagedAllocator) and alloc.ref_count[b] > 1:
                continue  # a shared prefix block
            assert b not in owners, f"block {b} owned by {owners.get(b)} and {r.request_id}"
            owners[b] = r.request_id
        assert len(r.block_table) * alloc.block_size >= r.num_computed_tokens
    assert sum(s is not None for s in sched.seats) == len(sched.running)
    assert len(sched.running) <= sched.config.max_num_seqs


def _check_waits(sched: Scheduler, out) -> None:
    advanced = {s.req.request_id for s in out.scheduled if not s.idle and s.num_tokens > 0}
    unfinished = [r for r in [*sched.waiting, *sched.running] if not r.is_finished]
    for r in unfinished:
        assert r.request_id in advanced or r.request_id in out.waits, \
            f"{r.request_id} neither advanced nor has a reason"
    for r in sched.waiting:
        assert r.request_id in out.waits, f"{r.request_id} waits with no reason"
    ids = {r.request_id for r in unfinished}
    for rid, w in out.waits.items():
        assert w.code in WAIT_CODES and rid in ids, (rid, w)
        if w.code == "queued_behind":
            head = sched.waiting[0].request_id
            assert w.fields["behind"] == head and w.fields["head_code"] == out.waits[head].code
            assert [r.request_id for r in sched.waiting][w.fields["position"]] == rid
        if w.code == "prefill_chunk":
            assert rid in advanced and w.fields["remaining"] > 0
        if w.code == "preempted":
            assert rid in out.preempted


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=12),
    batching=st.sampled_from(["static", "continuous"]),
    layout=st.sampled_from(["paged", "contiguous"]),
    caching=st.booleans(),
    seats=st.integers(1, 4),
    budget=st.integers(4, 40),
    spare_blocks=st.integers(0, 10),
)
def test_random_workloads(lengths, batching, layout, caching, seats, budget, spare_blocks):
    cfg = EngineConfig(batching=batching, kv_layout=layout, max_num_seqs=seats, block_size=4,
                       max_model_len=52, max_num_batched_tokens=budget,
                       enable_prefix_caching=caching and layout == "paged")
    num_blocks = cfg.blocks_per_seq + spare_blocks
    alloc = (PagedAllocator(num_blocks, 4, cfg.enable_prefix_caching) if layout == "paged"
             else ContiguousAllocator(num_blocks, 4, cfg.max_model_len))
    sched = Scheduler(cfg, alloc, eos_ids=set())
    reqs = []
    for i, (plen, out) in enumerate(lengths):
        r = Request(f"r{i}", [1 + (j % 3) for j in range(plen)], SamplingParams(max_tokens=out))
        reqs.append(r)
        sched.add(r)
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        assert out.scheduled, "a step with work waiting must schedule something"
        _check_waits(sched, out)
        assert out.num_tokens <= budget + sum(1 for s in out.scheduled if s.idle)
        # every request that catches up samples token 7; the scheduler advances them all
        sampled = {s.req.request_id: [7] for s in out.scheduled
                   if not s.idle and s.req.num_computed_tokens + s.num_tokens == s.req.num_tokens}
        sched.update_from_output(out, sampled, now=0.0)
        _check(sched)
    else:
        raise AssertionError("did not finish in 2000 steps")
    assert all(r.is_finished for r in reqs)
    assert all(r.num_output_tokens == min(r.sampling.max_tokens, 52 - r.num_prompt_tokens)
               for r in reqs), "a preempted request lost or repeated output"
    assert not sched.running and alloc.num_free_blocks == alloc.num_blocks, "blocks leaked"


@given(st.lists(st.integers(0, 99), min_size=1, max_size=6),
       st.lists(st.integers(0, 99), max_size=6), st.lists(st.integers(0, 99), max_size=4))
def test_token_ids_between_is_a_slice_of_the_whole_sequence(prompt, output, spec):
    """The runner asks a request for the tokens it computes this step without building its
    whole sequence; every (start, end) gives what slicing prompt + output + drafts gives."""
    req = Request("r", prompt, SamplingParams(), output_token_ids=output, spec_token_ids=spec)
    whole = prompt + output + spec
    for start in range(len(whole) + 1):
        for end in range(start, len(whole) + 1):
            assert req.token_ids_between(start, end) == whole[start:end], (start, end)
