"""The load test of the suite: 200 simulated users (the code behind `python -m benchmarks.load`)
stream short answers from one server at once. Every request completes
with exactly the tokens asked for, no block is leaked, and the server's counters equal what
the clients received."""

from __future__ import annotations

import asyncio
import random

import pytest

from benchmarks.load import make_users, run_load
from benchmarks.workloads import get_workload
from engine import EngineConfig, LLMEngine
from engine.server import ServerSettings
from tests.conftest import SMALL, assert_blocks_consistent, in_loop, running_server
from tests.engine.server.test_steps_metrics import metric_values

pytestmark = pytest.mark.slow

USERS = 200


@pytest.fixture(scope="module")
def wide_engine():
    """More seats than the folder's engine (the weights are shared): 200 users ride 32 at once."""
    return LLMEngine(EngineConfig(**{**SMALL, "max_num_seqs": 32}))


def test_200_users(wide_engine):
    engine = wide_engine
    wl = get_workload("longtail", n=USERS)
    rng = random.Random(0)
    items = [type(it)(it.prompt, rng.randint(4, 8), True, 0.0, it.name)
             for it in make_users(wl, USERS, "all-at-once", None)]
    asked = sum(it.max_tokens for it in items)
    # a queue smaller than the crowd: some users are refused with 429 and come back
    settings = ServerSettings(max_queue=150)
    with running_server(engine, settings) as (url, app):
        s = asyncio.run(run_load(f"{url}/v1", items, timeout_s=240, max_retries=200,
                                 progress=False))
        assert s["outcomes"] == {"ok": USERS}, s["errors"]
        assert s["exact_tokens"] == USERS  # streamed ids == usage == max_tokens, every user
        assert s["output_tokens"] == asked
        assert s["retries_429"] > 0 and s["users_refused_at_least_once"] > 0
        vals = metric_values(__import__("httpx").get(f"{url}/metrics", timeout=30).text)
        assert vals["vllm:generation_tokens_total"] == asked
        assert vals["vllm:request_success_total"] == USERS
        assert vals["servelab:requests_rejected_total"] == s["retries_429"]
        assert vals["vllm:kv_cache_usage_perc"] == 0
        assert s["server_after"]["kv_cache_usage"] == 0

        def leaks(e):
            assert_blocks_consistent(e.allocator, e.scheduler.running)
            return (e.allocator.num_free_blocks, e.allocator.num_blocks, len(e.requests),
                    e.has_unfinished())

        free, total, live, busy = in_loop(app, leaks)
        assert free == total and live == 0 and not busy
