"""The naive server (chapter 6.4's "ten lines of transformers") on a tiny run.

Checks: each request gets exactly its own max_tokens, finished riders keep their seats
(idle_seat_frac), left padding does not change greedy tokens in fp32, ignore_eos carries on
past EOS without forbidding it, and the arrival policy boards whoever is at the door.
"""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.baseline import NaiveServer, reference_greedy
from benchmarks.workloads import WorkItem, Workload, with_arrivals

pytestmark = pytest.mark.slow

HI = "<|im_start|>user\nSay hello to my friend Tom, please.<|im_end|>\n<|im_start|>assistant\n"
# SmolLM2 answers "The answer is 4.<|im_end|>": EOS is the 7th token
SUM = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """On a shared 2-core machine, 2 OpenMP threads contending with other jobs run several
    times slower than 1; restore the setting for the rest of the session."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def server():
    return NaiveServer(batch_size=2, device="cpu")


@pytest.fixture(scope="module")
def tiny(server):
    work = Workload("tiny", "", "", [
        WorkItem(HI, 3, name="hi"),
        WorkItem(SUM, 8, name="sum"),  # runs past its EOS
        WorkItem(SUM, 8, ignore_eos=False, name="sum-stop"),  # stops at EOS: 7 tokens
    ])
    return server.run(work)


def test_token_counts_and_idle_seats(tiny):
    got = {r.name: len(r.token_ids) for r in tiny.requests}
    assert got == {"hi": 3, "sum": 8, "sum-stop": 7}
    # batch 1 = [hi, sum]: 8 steps x 2 rows, 5 of hi's row-steps wasted; batch 2 = [sum-stop]
    # alone, and generate stops when its only row writes EOS: 7 steps
    assert tiny.row_steps == 2 * 8 + 7
    assert tiny.steps == 8 + 7
    assert tiny.idle_seat_frac == pytest.approx(5 / 23)
    assert [r.batch_index for r in tiny.requests] == [0, 0, 1]
    s = tiny.summary()
    for key in ("output_tokens", "wall_s", "output_tok_per_s", "ttft_p50_s", "ttft_p99_s",
                "tpot_p50_s", "idle_seat_frac", "max_concurrency"):
        assert isinstance(s[key], (int, float)) and s[key] >= 0, key
    assert s["system"] == "naive" and s["output_tokens"] == 18 and s["max_concurrency"] == 2
    assert s["wall_s"] > 0 and s["ttft_p99_s"] >= s["ttft_p50_s"] > 0
    assert 0 < s["prompt_pad_frac"] < 1  # hi and sum have different prompt lengths
    json.dumps(tiny.to_dict())


def test_timeline_is_ordered(tiny):
    for r in tiny.requests:
        assert r.arrival_s <= r.start_s < r.first_token_s <= r.last_token_s <= r.done_s
        assert r.done_s <= tiny.wall_s + 1e-9
    hi, s, stop = tiny.requests
    assert hi.last_token_s < s.last_token_s == pytest.approx(s.done_s, abs=0.5)
    assert stop.start_s == pytest.approx(s.done_s)  # the next bus leaves when this one is back


def test_padded_batch_equals_one_at_a_time_reference(tiny):
    hi, s, stop = tiny.requests
    assert hi.token_ids == reference_greedy(HI, 3)[0]
    ref = reference_greedy([SUM], 8)[0]
    assert s.token_ids == ref
    assert ref[6] == 2, "EOS should be emitted (not masked) and generation carry on"
    assert stop.token_ids == reference_greedy(SUM, 8, ignore_eos=False)[0] == ref[:7]
    assert stop.text.endswith("<|im_end|>")


def test_reference_accepts_token_ids(server):
    ids = server.tokenizer(HI).input_ids
    assert reference_greedy(ids, 3) == reference_greedy([HI], 3)


def test_boards_whoever_has_arrived(server):
    q = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    work = Workload("arrivals", "", "", [WorkItem(q, 2, name="a"), WorkItem(q, 1, name="b"),
                                         WorkItem(q, 1, arrival_s=500.0, name="c")])
    res = server.run(work)
    a, b, c = res.requests
    assert a.batch_index == b.batch_index == 0 and c.batch_index == 1
    assert c.start_s == 500.0 and 0 < c.ttft_s < 60  # idle gap skipped, not slept
    assert res.wall_s > 500.0
    seen = []
    res = server.run(with_arrivals(work, "poisson", rate=1000.0),
                     progress=lambda f, m: seen.append(f))
    assert seen[-1] == 1.0 and len(res.requests) == 3


def test_bad_batch_size():
    with pytest.raises(ValueError, match="batch_size"):
        NaiveServer(batch_size=0)
