"""When the stepping thread hands a step's tokens to the HTTP thread (engine/server/loop.py): as
the next step's forward starts, or at once when no forward follows. Either way no answer
waits for the engine to go idle, and every token arrives."""

from __future__ import annotations

import json
import threading
import time

import httpx

from tests.conftest import in_loop, running_server


def test_a_short_answer_ends_while_a_long_one_still_runs(engine):
    """The short answer's last tokens are handed over at the long one's next forward: its
    stream ends (with every token) while the engine still steps the long answer. Handed over
    only when the engine went idle, it would end after the long one."""
    with running_server(engine) as (url, app), httpx.Client(base_url=url, timeout=60) as c:
        long_done = {}

        def long_answer():
            r = c.post("/v1/completions", json={
                "model": "smollm2-135m", "prompt": "Count from one to two hundred:",
                "max_tokens": 200, "temperature": 0, "ignore_eos": True})
            long_done["usage"] = r.json()["usage"]

        t = threading.Thread(target=long_answer)
        t.start()
        deadline = time.monotonic() + 30
        while not in_loop(app, lambda e: e.has_unfinished()):  # bounded: the long one admitted
            assert time.monotonic() < deadline, "the long answer never reached the engine"
            time.sleep(0.01)
        tokens, done = 0, False
        with c.stream("POST", "/v1/completions", json={
                "model": "smollm2-135m", "prompt": "Hi", "max_tokens": 3, "temperature": 0,
                "ignore_eos": True, "stream": True, "return_token_ids": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                    break
                if line.startswith("data: "):
                    for ch in json.loads(line[6:])["choices"]:
                        tokens += len(ch.get("token_ids") or ())
        still_running = in_loop(app, lambda e: e.has_unfinished())
        t.join(60)
        assert done and tokens == 3
        assert still_running, "the short answer ended only after the long one"
        assert long_done["usage"]["completion_tokens"] == 200
