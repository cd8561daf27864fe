"""One request cannot fail, stall or outstay the others; a class cannot be flooded by names;
slow clients are closed; shutdown ends even with a step-stream viewer open.

Each test runs its own real server (127.0.0.1, a free port) and bounds every client loop."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from engine.config import SamplingParams
from engine.server import ServerSettings
from tests.conftest import in_loop, running_server

MODEL = "smollm2-135m"
PROMPTS = [f"Question {i}: what is {i} plus {i}? Answer:" for i in range(10)]
N_TOKENS = 12


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (every label set)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _stream(c: httpx.AsyncClient, prompt: str, started: asyncio.Event | None = None):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}
    ids = []
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            assert "error" not in obj, obj
            ids.extend(obj["choices"][0].get("token_ids") or [])
            if started is not None:
                started.set()
    return ids


def test_bad_requests_fail_alone_and_never_stall_the_stepping_thread(engine):
    want = [o.token_ids for o in engine.generate(
        PROMPTS, SamplingParams(max_tokens=N_TOKENS, temperature=0.0, ignore_eos=True))]
    for r in list(engine.requests):
        engine.forget(r)
    bad = {
        "tiny temperature": {"prompt": "x", "max_tokens": 4, "temperature": 1e-40},
        "tiny top_p": {"prompt": "x", "max_tokens": 4, "temperature": 1.0, "top_p": 1e-300},
        "huge stop": {"prompt": "x", "max_tokens": 4, "stop": "ab" * 125_000},
        "huge prompt": {"prompt": "word " * 180_000, "max_tokens": 4},
    }
    with running_server(engine) as (url, app):
        loop = app.state.loop

        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=120) as c:
                started = [asyncio.Event() for _ in PROMPTS]
                streams = [asyncio.create_task(_stream(c, p, s))
                           for p, s in zip(PROMPTS, started)]
                await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started[:4])), 120)
                loop.max_step_gap = 0.0  # from here on, with the bad requests in flight
                bad_answers = await asyncio.gather(*(
                    c.post("/v1/completions", json={"model": MODEL, **b})
                    for b in bad.values()))
                got = await asyncio.wait_for(asyncio.gather(*streams), 180)
                return bad_answers, got

        bad_answers, got = asyncio.run(main())
        gap = loop.max_step_gap
        metrics = httpx.get(url + "/metrics", timeout=30).text
        free, total = in_loop(app, lambda e: (e.allocator.num_free_blocks,
                                              e.allocator.num_blocks))
    assert got == want  # the ten finished with exactly their greedy tokens
    for name, r in zip(bad, bad_answers):
        # each bad one gets its own answer: refused, its own error, or (guarded) served
        assert r.status_code in (200, 400, 500), (name, r.status_code, r.text[:300])
        if r.status_code != 200:
            err = r.json()["error"]
            assert err["message"], name
            if r.status_code == 500:
                assert err["code"] == "request_failed", (name, err)
    codes = dict(zip(bad, (r.status_code for r in bad_answers)))
    assert codes["huge stop"] == 400 and "256" in bad_answers[2].json()["error"]["message"]
    assert codes["huge prompt"] == 400
    assert bad_answers[3].json()["error"]["code"] == "context_length_exceeded"
    errors = sum(1 for c in codes.values() if c == 500)
    assert metric(metrics, "servelab:request_errors_total") == errors
    assert free == total
    print(f"max gap between steps with the bad requests in flight: {gap * 1000:.1f} ms")
    assert gap < 0.100, f"the stepping thread paused {gap * 1000:.0f} ms"


def test_a_non_streamed_request_whose_client_leaves_is_aborted(engine):
    with running_server(engine) as (url, app):
        before = metric(httpx.get(url + "/metrics", timeout=30).text,
                        "servelab:requests_aborted_total")
        body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 200,
                "ignore_eos": True}
        with pytest.raises(httpx.ReadTimeout):  # the client leaves after one second
            httpx.post(url + "/v1/completions", json=body, timeout=httpx.Timeout(30, read=1.0))
        left = time.monotonic()
        deadline = left + 20
        while True:
            m = httpx.get(url + "/metrics", timeout=30).text
            if metric(m, "servelab:requests_aborted_total") > before:
                break
            assert time.monotonic() < deadline, "the request ran on after its client left"
            time.sleep(0.1)
        aborted_after = time.monotonic() - left
        free, total = in_loop(app, lambda e: (e.allocator.num_free_blocks,
                                              e.allocator.num_blocks))
        tokens = metric(m, "vllm:generation_tokens_total")
    assert free == total
    assert tokens < 200  # it did not run to its end
    print(f"aborted {aborted_after:.2f} s after the client left")


JOIN, ADMIN = "join-code", "teacher-key"


def test_class_limits_count_phones_and_addresses_not_names(engine):
    settings = ServerSettings(api_key=JOIN, admin_key=ADMIN, max_requests_per_user=2,
                              student_max_tokens=8)
    with running_server(engine, settings) as (url, app):
        auth = {"Authorization": f"Bearer {JOIN}"}

        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=120) as c:
                phone = (await c.post("/class/token", headers=auth)).json()["phone"]

                async def ask(i):
                    async with c.stream("POST", "/class/ask", headers={
                            **auth, "X-ServeLab-Phone": phone},
                            json={"nickname": f"nick{i}", "question": "Say hi."}) as r:
                        await r.aread()
                        return r.status_code

                asks = await asyncio.gather(*(ask(i) for i in range(64)))

                async def api(i):  # 64 `user` names through the API, one address
                    r = await c.post("/v1/completions", headers=auth, json={
                        "model": MODEL, "prompt": "Hi", "max_tokens": 4, "user": f"u{i}"})
                    return r.status_code

                apis = await asyncio.gather(*(api(i) for i in range(64)))
                teacher_only = [await c.post("/v1/completions", headers=auth, json={
                    "model": MODEL, "prompt": "Hi", "max_tokens": 4, **extra})
                    for extra in ({"user": "sim-1"}, {"max_tokens": 16},
                                  {"ignore_eos": True})]
                teacher = await c.post("/v1/completions",
                                       headers={"Authorization": f"Bearer {ADMIN}"},
                                       json={"model": MODEL, "prompt": "Hi", "max_tokens": 4,
                                             "user": "sim-1", "ignore_eos": True})
                return asks, apis, teacher_only, teacher

        asks, apis, teacher_only, teacher = asyncio.run(main())
    # one phone: one question at a time, whatever its 64 nicknames
    assert asks.count(200) == 1 and asks.count(429) == 63, asks
    # one address through the API: at most its cap at once, whatever the `user` names
    assert 1 <= apis.count(200) and apis.count(200) + apis.count(429) == 64
    assert apis.count(429) >= 64 - 2 * 4, apis  # never 64 places for 64 names
    assert [r.status_code for r in teacher_only] == [403, 403, 403]
    assert [r.json()["error"]["param"] for r in teacher_only] == ["user", "max_tokens",
                                                                  "ignore_eos"]
    assert teacher.status_code == 200, teacher.text


def test_host_names_outside_the_allow_list_get_421(engine):
    settings = ServerSettings(allowed_hosts=["class.example"])
    with running_server(engine, settings) as (url, app):
        port = url.rsplit(":", 1)[1]
        for host, status in ((f"127.0.0.1:{port}", 200), (f"localhost:{port}", 200),
                             (f"class.example:{port}", 200), (f"evil.example:{port}", 421),
                             (f"[::1]:{port}", 200)):
            r = httpx.get(url + "/health", headers={"Host": host}, timeout=30)
            assert r.status_code == status, (host, r.text)


def test_slow_headers_are_closed(engine):
    with running_server(engine, header_timeout_s=1.0) as (url, app):
        port = int(url.rsplit(":", 1)[1])
        socks = []
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
        t0 = time.monotonic()
        closed = 0
        for s in socks:
            # a header line now and then, never the blank line that ends them
            while time.monotonic() - t0 < 8:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                    s.settimeout(0.3)
                    if s.recv(1024) == b"":
                        closed += 1
                        break
                except TimeoutError:
                    continue
                except OSError:  # reset by the server: closed too
                    closed += 1
                    break
            s.close()
        waited = time.monotonic() - t0
        assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert closed == 5 and waited < 5, (closed, waited)


def test_shutdown_with_a_step_viewer_open_ends_within_a_bound(engine):
    from engine.server import create_app
    from engine.server.http import make_server
    from tests.conftest import free_port

    app = create_app(engine)
    port = free_port()
    server = make_server(app, "127.0.0.1", port, shutdown_timeout_s=2.0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    viewer_ended = threading.Event()

    def view():
        try:
            with httpx.stream("GET", url + "/v1/servelab/steps", timeout=60) as r:
                for _ in r.iter_lines():
                    pass
        except httpx.HTTPError:
            pass
        viewer_ended.set()

    def long_answer():
        try:
            httpx.post(url + "/v1/completions", timeout=60, json={
                "model": MODEL, "prompt": "Tell me a story.", "max_tokens": 240,
                "ignore_eos": True})
        except httpx.HTTPError:
            pass

    threading.Thread(target=view, daemon=True).start()
    threading.Thread(target=long_answer, daemon=True).start()
    time.sleep(1.5)  # the viewer is subscribed, the answer is in the engine
    t0 = time.monotonic()
    server.should_exit = True
    thread.join(20)
    took = time.monotonic() - t0
    assert not thread.is_alive(), "shutdown never completed"
    assert viewer_ended.wait(5)
    assert took < 2.0 + 5.0, took  # the drain bound plus the stop of the loop
    # the answer cut by the shutdown left nothing behind in the engine (the next server on it
    # would otherwise step a request nobody owns)
    assert not engine.requests and not engine.groups
    assert engine.allocator.num_free_blocks == engine.allocator.num_blocks
    print(f"shutdown took {took:.2f} s with a viewer and an answer open")


def test_openai_client_at_concurrency_64_is_served_64_of_64(engine):
    """Default settings (loopback, no key): 64 concurrent requests from the official `openai`
    client all queue and are served; the counters equal what the client received."""
    import openai

    with running_server(engine) as (url, app):
        async def main():
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                        timeout=300)
            try:
                return await asyncio.gather(*(client.completions.create(
                    model=MODEL, prompt=f"Count to {i}:", max_tokens=4, temperature=0)
                    for i in range(64)), return_exceptions=True)
            finally:
                await client.close()

        got = asyncio.run(main())
        m = httpx.get(url + "/metrics", timeout=30).text
    ok = [r for r in got if not isinstance(r, Exception)]
    assert len(ok) == 64, [repr(r) for r in got if isinstance(r, Exception)][:3]
    assert metric(m, "vllm:request_success_total") == 64
    assert metric(m, "vllm:generation_tokens_total") == sum(r.usage.completion_tokens
                                                            for r in ok)
    assert metric(m, "vllm:prompt_tokens_total") == sum(r.usage.prompt_tokens for r in ok)
    assert metric(m, "servelab:requests_rejected_total") == 0
