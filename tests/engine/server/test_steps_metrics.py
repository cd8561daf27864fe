"""The step stream (who owns which seat and block), `/metrics` read back by prometheus_client's
own parser, and a client that drops mid-stream: its request is aborted and its blocks are
free within two steps."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import in_loop, running_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"


def read_steps(url: str, limit: int, out: list, ready: threading.Event, timeout: float = 60):
    """A viewer: collect up to `limit` step events (bounded in count and time)."""
    with httpx.Client(timeout=timeout) as c, c.stream(
            "GET", f"{url}/v1/servelab/steps", params={"limit": limit}) as r:
        assert r.status_code == 200
        ready.set()
        deadline = time.monotonic() + timeout
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
            if time.monotonic() > deadline:
                break


def metric_values(text: str) -> dict:
    vals = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            vals[s.name] = vals.get(s.name, 0.0) + s.value
    return vals


def test_step_stream_and_metrics(engine):
    with running_server(engine) as (url, app), httpx.Client(base_url=url, timeout=60) as c:
        events, ready = [], threading.Event()
        viewer = threading.Thread(target=read_steps, args=(url, 4, events, ready), daemon=True)
        viewer.start()
        assert ready.wait(30)
        done = {}

        def ask(user, prompt):
            done[user] = c.post("/v1/completions", json={
                "model": MODEL, "prompt": prompt, "max_tokens": 6, "ignore_eos": True,
                "user": user}).json()

        askers = [threading.Thread(target=ask, args=a) for a in
                  (("sim-3", "The sky is"), ("alice", "My favourite food is"))]
        for t in askers:
            t.start()
        for t in askers:
            t.join(60)
        viewer.join(60)
        assert not viewer.is_alive() and len(events) == 4
        ev = events[-1]
        for key in ("step", "seats", "waiting", "kv", "emitted", "aborted", "metrics", "owners"):
            assert key in ev
        owners = {}
        for e in events:
            owners.update(e["owners"])
        ids = {done["sim-3"]["id"]: "simulated", done["alice"]["id"]: "person"}
        for rid, kind in ids.items():
            if rid in owners:
                assert owners[rid]["kind"] == kind
        assert any(rid in owners for rid in ids), (owners, ids)
        # every request an event names has its owner, and every block owner is a named one
        for e in events:
            for rid in e["kv"]["block_tables"]:
                assert rid in e["owners"]
            for s in e["seats"]:
                assert s["request_id"] is None or s["request_id"] in e["owners"]

        r = c.get("/metrics")
        assert r.status_code == 200
        vals = metric_values(r.text)
        got = sum(d["usage"]["completion_tokens"] for d in done.values())
        prompt = sum(d["usage"]["prompt_tokens"] for d in done.values())
        assert vals["vllm:generation_tokens_total"] == got == 12
        assert vals["vllm:prompt_tokens_total"] == prompt
        assert vals["vllm:request_success_total"] == 2
        assert vals["vllm:e2e_request_latency_seconds_count"] == 2
        assert vals["vllm:time_to_first_token_seconds_count"] == 2
        assert vals["vllm:inter_token_latency_seconds_count"] >= 2
        assert vals["vllm:num_requests_running"] == 0 == vals["vllm:num_requests_waiting"]
        assert vals["vllm:kv_cache_usage_perc"] == 0
        for name in ("vllm:num_preemptions_total", "vllm:spec_decode_num_drafts_total",
                     "vllm:spec_decode_num_draft_tokens_total",
                     "vllm:spec_decode_num_accepted_tokens_total"):
            assert vals[name] == 0
        assert vals["process_resident_memory_bytes"] > 0


def test_disconnect_frees_blocks_within_two_steps(engine):
    with running_server(engine) as (url, app), httpx.Client(base_url=url, timeout=60) as c:
        body = {"model": MODEL, "prompt": "Write a long story about a dragon.",
                "max_tokens": 200, "ignore_eos": True, "stream": True, "user": "leaver"}
        with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            first = json.loads(next(lines)[6:])
            rid = first["id"]
            held = in_loop(app, lambda e: len(e.requests[rid].block_table))
            assert held > 0
        # the client is gone: wait (bounded) until the server has taken the request out
        deadline = time.monotonic() + 20
        while in_loop(app, lambda e: rid in e.requests):
            assert time.monotonic() < deadline, "the dropped request is still in the engine"
            time.sleep(0.05)
        (entry,) = [a for a in app.state.loop.abort_log if a["request_id"] == rid]
        assert entry["freed_step"] is not None
        assert entry["freed_step"] - entry["received_step"] <= 2, entry
        free, total = in_loop(app, lambda e: (e.allocator.num_free_blocks,
                                              e.allocator.num_blocks))
        assert free == total
        vals = metric_values(c.get("/metrics").text)
        assert vals["servelab:requests_aborted_total"] == 1
        assert vals["vllm:generation_tokens_total"] < 200


def test_every_waiting_request_in_the_stream_has_its_reason_and_metrics_count_them(engine):
    """Twelve requests at once on eight seats: each step event gives every waiting request
    its own code (the first in line why it cannot board, the others whom they wait behind),
    and /metrics, written from the same reports, counts the waiting by vLLM's reasons and by
    code, each adding up to the waiting count."""
    from engine.server.metrics import ServerMetrics
    from engine.waits import WAIT_CODES

    with running_server(engine) as (url, app), httpx.Client(base_url=url, timeout=60) as c:
        events, ready = [], threading.Event()
        viewer = threading.Thread(target=read_steps, args=(url, 3, events, ready), daemon=True)
        viewer.start()
        assert ready.wait(30)
        seen: list[dict] = []
        real_on_step = app.state.metrics.on_step

        def on_step(report):  # the registry after each step, read as a scraper would
            real_on_step(report)
            seen.append(metric_values(generate_text(app.state.metrics)))

        app.state.metrics.on_step = on_step
        try:
            askers = [threading.Thread(target=lambda i=i: c.post("/v1/completions", json={
                "model": MODEL, "prompt": f"Count to {i}:", "max_tokens": 3,
                "ignore_eos": True})) for i in range(12)]
            for t in askers:
                t.start()
            for t in askers:
                t.join(60)
            viewer.join(60)
        finally:
            app.state.metrics.on_step = real_on_step
    waited = [e for e in events if e["waiting"]]
    assert waited, "nobody waited: the test needs more requests than seats"
    for e in waited:
        head, *rest = e["waiting"]
        assert e["waits"][head]["code"] in WAIT_CODES
        for i, rid in enumerate(rest, start=1):
            assert e["waits"][rid] == {"code": "queued_behind", "position": i, "behind": head,
                                       "head_code": e["waits"][head]["code"]}
    assert any(e["waits"][e["waiting"][0]]["code"] == "seats_full" for e in waited)
    busy = [v for v in seen if v["vllm:num_requests_waiting"] > 0]
    assert busy
    for v in seen:
        assert v["vllm:num_requests_waiting_by_reason"] == v["vllm:num_requests_waiting"]
        assert v["servelab:num_requests_waiting_by_code"] == v["vllm:num_requests_waiting"]
    assert isinstance(app.state.metrics, ServerMetrics)


def generate_text(metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()
