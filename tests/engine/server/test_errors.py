"""Every bad request gets OpenAI's error body `{"error": {"message", "type", "param",
"code"}}` with the right status, never a traceback or a hung connection: 400 (bad field,
over-long prompt, unknown model, max_tokens over the cap), 401 (key missing or wrong),
413 (body too large), 429 (server full, or this client's limit)."""

from __future__ import annotations

import contextlib
import json
import time

import httpx
import pytest

from engine.server import ServerSettings
from tests.conftest import SMALL, in_loop, running_server

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
OK = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}


def assert_error(r: httpx.Response, status: int, param: str | None = "any") -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert "Traceback" not in r.text
    if param != "any":
        assert err["param"] == param, err
    return err


@pytest.fixture(scope="module")
def http(server):
    url, _ = server
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("patch,param", [
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 0}, "top_p"),
    ({"n": 9}, "n"),  # more samples than the server's seats
    ({"max_tokens": "8"}, "max_tokens"),  # no lax coercion of strings or booleans
    ({"temperature": True}, "temperature"),
    ({"stream": "yes"}, "stream"),
    ({"echo": 1}, "echo"),
    ({"logprobs": 21}, "logprobs"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"best_of": 2}, "best_of"),
    ({"suffix": "x"}, "suffix"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"no_such_field": 1}, "no_such_field"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": None}, "prompt"),
    ({"stop": [""]}, "stop"),
])
def test_bad_field_is_400_naming_it(http, patch, param):
    assert_error(http.post("/v1/completions", json={**OK, **patch}), 400, param)


def test_missing_field_and_bad_json(http):
    assert_error(http.post("/v1/completions", json={"prompt": "hi"}), 400, "model")
    assert_error(http.post("/v1/chat/completions", json={"model": MODEL, "messages": []}),
                 400, "messages")
    assert_error(http.post("/v1/completions", content=b"{not json",
                           headers={"content-type": "application/json"}), 400)


def test_unknown_model_is_404(http):
    err = assert_error(http.post("/v1/completions", json={**OK, "model": "gpt-9"}), 404, "model")
    assert err["code"] == "model_not_found" and "gpt-9" in err["message"]


def test_over_long_prompt_is_400(http):
    long = "word " * (SMALL["max_model_len"] * 2)
    err = assert_error(http.post("/v1/completions", json={**OK, "prompt": long}), 400, "prompt")
    assert err["code"] == "context_length_exceeded"
    # fits alone, but not with its answer
    mid = "word " * (SMALL["max_model_len"] - 20)
    err = assert_error(http.post("/v1/completions", json={**OK, "prompt": mid,
                                                         "max_tokens": 100}), 400, "max_tokens")
    for stream in (False, True):  # a streamed request is refused before any event is sent
        r = http.post("/v1/chat/completions", json={
            "model": MODEL, "stream": stream,
            "messages": [{"role": "user", "content": long}]})
        assert_error(r, 400, "prompt")


def test_max_tokens_over_cap_is_400(http):
    cap = SMALL["max_model_len"]
    err = assert_error(http.post("/v1/completions", json={**OK, "max_tokens": cap + 1}), 400,
                       "max_tokens")
    assert str(cap) in err["message"]


def test_unknown_route_and_method(http):
    assert_error(http.get("/v1/nothing"), 404)
    assert_error(http.get("/v1/completions"), 405)


def test_api_key(engine):
    settings = ServerSettings(api_key="join-42")
    with running_server(engine, settings) as (url, _), httpx.Client(base_url=url,
                                                                     timeout=60) as c:
        assert_error(c.post("/v1/completions", json=OK), 401)
        assert_error(c.post("/v1/completions", json=OK,
                            headers={"Authorization": "Bearer join-41"}), 401)
        assert_error(c.get("/metrics"), 401)
        assert_error(c.get("/v1/servelab/steps"), 401)
        assert c.get("/health").status_code == 200  # a load balancer's probe needs no key
        r = c.post("/v1/completions", json=OK, headers={"Authorization": "Bearer join-42"})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_body_too_large_is_413(engine):
    with running_server(engine, ServerSettings(max_body_bytes=2000)) as (url, _), \
            httpx.Client(base_url=url, timeout=60) as c:
        big = {**OK, "prompt": "x" * 5000}
        assert_error(c.post("/v1/completions", json=big), 413)
        # no Content-Length (chunked upload): counted as it arrives

        def chunks():
            data = json.dumps(big).encode()
            for i in range(0, len(data), 1000):
                yield data[i:i + 1000]

        assert_error(c.post("/v1/completions", content=chunks(),
                            headers={"content-type": "application/json"}), 413)
        assert c.post("/v1/completions", json=OK).status_code == 200


@contextlib.contextmanager
def streaming(c: httpx.Client, user: str, address: str | None = None):
    """An open streamed request holding its place in the server until the block ends."""
    body = {**OK, "max_tokens": 200, "ignore_eos": True, "stream": True, "user": user}
    headers = {"X-Forwarded-For": address} if address else {}
    with c.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # the request is in the engine and streaming
        yield r


def test_queue_full_and_per_client_limit_are_429(engine):
    # the per-client cap counts by address (here given by a trusted proxy's X-Forwarded-For),
    # never by the `user` name a client picks
    settings = ServerSettings(max_queue=2, max_requests_per_user=1,
                              forwarded_allow_ips=["127.0.0.1"])
    with running_server(engine, settings) as (url, app), httpx.Client(base_url=url,
                                                                      timeout=60) as c:
        with streaming(c, "alice", "10.0.0.1"):
            for user in ("alice", "bob"):  # another name from the same address: no new place
                err = assert_error(c.post("/v1/completions", json={**OK, "user": user},
                                          headers={"X-Forwarded-For": "10.0.0.1"}), 429)
                assert err["type"] == "rate_limit_error" and "10.0.0.1" in err["message"]
            with streaming(c, "bob", "10.0.0.2"):
                r = c.post("/v1/completions", json={**OK, "user": "carol"},
                           headers={"X-Forwarded-For": "10.0.0.3"})
                err = assert_error(r, 429)
                assert err["code"] == "queue_full" and r.headers["retry-after"] == "1"
        # both streams closed: the server notices, aborts them and frees their places
        deadline = time.monotonic() + 20
        while (r := c.post("/v1/completions", json=OK,
                           headers={"X-Forwarded-For": "10.0.0.1"})).status_code == 429:
            assert time.monotonic() < deadline, "the closed streams kept their places"
            time.sleep(0.1)
        assert r.status_code == 200, r.text
        free, total = in_loop(app, lambda e: (e.allocator.num_free_blocks,
                                              e.allocator.num_blocks))
        assert free == total


def test_no_per_client_cap_by_default_and_forwarded_for_needs_trust(engine):
    """Default settings (loopback, no key): one client's requests queue, none is refused; an
    X-Forwarded-For from a peer not configured as a proxy is not believed."""
    settings = ServerSettings(max_requests_per_user=1)  # no trusted proxy
    with running_server(engine, settings) as (url, app), httpx.Client(base_url=url,
                                                                      timeout=60) as c:
        with streaming(c, "alice", "10.0.0.1"):
            # the header is ignored: the peer 127.0.0.1 already has its one request
            err = assert_error(c.post("/v1/completions", json=OK,
                                      headers={"X-Forwarded-For": "10.0.0.9"}), 429)
            assert "127.0.0.1" in err["message"]
    assert ServerSettings().max_requests_per_user is None


def test_engine_error_fails_the_request_not_the_loop(engine, monkeypatch):
    real_step, calls = engine.step, []

    def failing_step():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("simulated kernel failure")
        return real_step()

    monkeypatch.setattr(engine, "step", failing_step)
    with running_server(engine) as (url, app), httpx.Client(base_url=url, timeout=60) as c:
        err = assert_error(c.post("/v1/completions", json=OK), 500)
        assert "simulated kernel failure" in err["message"] and err["type"] == "server_error"
        r = c.post("/v1/completions", json=OK)  # the loop lives on
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        free, total, live = in_loop(app, lambda e: (e.allocator.num_free_blocks,
                                                    e.allocator.num_blocks, len(e.requests)))
        assert free == total and live == 0
