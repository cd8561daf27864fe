"""The students' page (classroom/server.py) over a real server: the page needs no key and
writes nothing with innerHTML; a wrong join code is refused; bad nicknames and questions get a
clear 400; a second question too soon gets 429; each student's stream carries that student's
request only; the step stream and /metrics need the teacher's key, not the join code."""

from __future__ import annotations

import json
import re
import threading

import httpx
import jsonschema
import pytest

from classroom.page import PAGE
from engine.server import ServerSettings
from engine.trace import REQUESTS_PID
from tests.conftest import running_server
from tests.engine.test_trace import SCHEMA

JOIN, ADMIN = "join-code", "teacher-key"


def test_page_writes_text_only():
    # every string from a person or the model goes in with textContent
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write", PAGE)
    assert "textContent" in PAGE


def join(client: httpx.Client, code: str = JOIN) -> str:
    """A phone joins: the server's token for it."""
    r = client.post("/class/token", headers={"Authorization": f"Bearer {code}"})
    assert r.status_code == 200, r.text
    return r.json()["phone"]


def ask(client: httpx.Client, nickname: str, question: str, code: str = JOIN,
        phone: str | None = None) -> tuple:
    """POST /class/ask and read its events (bounded by the client's timeout)."""
    headers = {"Authorization": f"Bearer {code}"}
    if phone:
        headers["X-ServeLab-Phone"] = phone
    with client.stream("POST", "/class/ask", json={"nickname": nickname, "question": question},
                       headers=headers) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, r.json()
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        return 200, events


@pytest.mark.slow
def test_students_over_a_real_server(engine):
    settings = ServerSettings(api_key=JOIN, admin_key=ADMIN)
    with running_server(engine, settings) as (url, app), httpx.Client(base_url=url,
                                                                       timeout=120) as c:
        page = c.get("/class")
        assert page.status_code == 200 and "Join code" in page.text
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "unsafe-inline" not in csp
        assert "frame-ancestors 'none'" in csp
        nonce = re.search(r"script-src 'nonce-([\w-]+)'", csp).group(1)
        assert f'<script nonce="{nonce}">' in page.text  # the page's own script, this nonce
        assert nonce not in c.get("/class").text  # a new one for each response

        status, body = ask(c, "ann", "hi", code="wrong")
        assert status == 401 and "join code" in body["error"]["message"]

        for nick, question, field, words in (
                ("", "hi", "nickname", "empty"),
                ("x" * 33, "hi", "nickname", "at most 32"),
                ("ann", "q" * 401, "question", "at most 400"),
                ("\u202e\u200b\x07", "hi", "nickname", "empty"),  # invisible only
                ("sim-7", "hi", "nickname", "simulated")):
            status, body = ask(c, nick, question)
            assert status == 400, (nick, body)
            assert body["error"]["param"] == field and words in body["error"]["message"]

        # two students at once: each stream holds its own request and nothing else
        results = {}
        questions = {"<script>alert(1)</script>": "What is 2+2?",
                     '<img src=x onerror="alert(2)">': "Name a colour."}

        phones = {nick: join(c) for nick in questions}

        def one(nick, q):
            # a bidi override and a zero-width space around the name: dropped
            results[nick] = ask(c, "\u202e" + nick + "\u200b", q, phone=phones[nick])

        threads = [threading.Thread(target=one, args=kv) for kv in questions.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        rids = {}
        for nick, (status, events) in results.items():
            assert status == 200, events
            kinds = [e["type"] for e in events]
            assert kinds[0] == "accepted" and kinds[-1] == "done", kinds
            assert set(kinds) <= {"accepted", "seat", "journey", "delta", "done"}
            assert "seat" in kinds
            seat = next(e for e in events if e["type"] == "seat")
            assert 0 <= seat["seat"] < engine.config.max_num_seqs and seat["blocks"] >= 1
            done = events[-1]
            assert done["tokens"] >= 1 and done["server_ttft_s"] > 0
            rids[nick] = events[0]["request_id"]
            # its own timeline after the answer: back to back from 0 ms, its prompt, its
            # tokens, and the steps its journey events named
            tl = done["timeline"]
            assert tl[0]["start_ms"] == 0 and [s["phase"] for s in tl][-1] == "decode"
            assert "prefill" in [s["phase"] for s in tl]
            for a, b in zip(tl, tl[1:]):
                assert b["start_ms"] == a["end_ms"] and b["from_step"] == a["to_step"] + 1
            assert 1000 * done["server_ttft_s"] <= tl[-1]["end_ms"] + 1
            steps = {e["step"] for e in events if e["type"] == "journey"}
            assert tl[0]["from_step"] == min(steps) and tl[-1]["to_step"] >= max(steps)
            assert "behind" not in json.dumps(tl) and "for_request" not in json.dumps(tl)
            # the projector's click on this student reads the same, with the teacher's key
            r = c.get(f"/v1/servelab/class/timeline/{rids[nick]}",
                      headers={"Authorization": f"Bearer {ADMIN}"})
            assert r.json() == {"request_id": rids[nick], "done": True, "timeline": tl}
            r = c.get(f"/v1/servelab/class/timeline/{rids[nick]}",
                      headers={"Authorization": f"Bearer {JOIN}"})
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert rids[next(iter(questions))] != rids[list(questions)[1]]
        r = c.get("/v1/servelab/class/timeline/class-none",
                  headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "request_not_found"

        # the class server's recent steps as a trace: the teacher's key only
        for headers in ({}, {"Authorization": f"Bearer {JOIN}"}):
            r = c.get("/v1/servelab/class/trace", headers=headers)
            assert r.status_code == 401, r.text
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            assert r.json()["error"]["code"] == "invalid_api_key"
        trace = c.get("/v1/servelab/class/trace",
                      headers={"Authorization": f"Bearer {ADMIN}"}).json()
        jsonschema.validate(trace, SCHEMA)
        tracks = {e["args"]["name"] for e in trace["traceEvents"]
                  if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == REQUESTS_PID}
        assert {f"request {rid}" for rid in rids.values()} <= tracks

        # the teacher's view of the questions, and only with the teacher's key
        assert c.get("/v1/servelab/class/questions",
                     headers={"Authorization": f"Bearer {JOIN}"}).status_code == 401
        got = c.get("/v1/servelab/class/questions",
                    headers={"Authorization": f"Bearer {ADMIN}"}).json()["questions"]
        for nick, q in questions.items():
            assert got[rids[nick]] == {"nickname": nick, "question": q}

        # a second question straight away is refused with a clear message
        status, body = ask(c, "another name", "again?", phone=phones[next(iter(questions))])
        assert status == 429 and "one question per" in body["error"]["message"]

        # the step stream and /metrics: the join code is not enough
        for path in ("/v1/servelab/steps?limit=1", "/metrics", "/v1/servelab/config"):
            r = c.get(path, headers={"Authorization": f"Bearer {JOIN}"})
            assert r.status_code == 401 and "admin key" in r.json()["error"]["message"]
        assert c.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        # every student left: no seat and no block held
        assert app.state.loop.call(lambda eng: eng.allocator.num_free_blocks
                                   == eng.allocator.num_blocks).result(30)


@pytest.mark.slow
def test_load_generator_reads_gauges_with_the_admin_key(engine):
    """`benchmarks.load` against a class server: its simulated riders need the teacher's key
    (the join code gets 403), which also reads /metrics."""
    import asyncio

    from benchmarks.load import run_load
    from benchmarks.workloads import WorkItem

    items = [WorkItem("Say hi.", 3, True, 0.0, "t")] * 2
    with running_server(engine, ServerSettings(api_key=JOIN, admin_key=ADMIN)) as (url, _):
        kw = dict(timeout_s=120, max_retries=5, progress=False)
        student = asyncio.run(run_load(f"{url}/v1", items, api_key=JOIN, **kw))
        teacher = asyncio.run(run_load(f"{url}/v1", items, api_key=ADMIN, admin_key=ADMIN,
                                       **kw))
    # the simulated riders (`sim-*` users) are the teacher's: the join code gets 403
    assert student["outcomes"] == {"http 403": 2} and not student.get("server_after")
    assert teacher["outcomes"] == {"ok": 2} and "rss_bytes" in teacher["server_after"]
