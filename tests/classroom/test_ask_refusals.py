"""The students' ask/answer routes refuse in the phone's language (classroom/server.py
`REFUSALS`): a zh phone (`?lang=zh`, else Accept-Language, as the votes pick it) gets a Chinese
message with the same numbers, an en phone the English text clients have always read, both with
the same status, code and OpenAI error shape. No engine: the class router over a stand-in for
the server's state, in-process, with the server's error handlers."""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

import classroom
from classroom.server import FIELDS_ZH, REFUSALS, ClassLimits, _Students, request_lang, router
from engine.server.errors import add_error_handlers
from engine.server.metrics import ServerMetrics
from engine.server.protocol import APIError
from tests.conftest import ENGLISH_RUN

ZH = {"params": {"lang": "zh"}}
ZH_HEADER = {"headers": {"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.8"}}
EN = {"headers": {"Accept-Language": "en-US,en;q=0.9"}}
ALLOWED_LATIN = {"token", "s", "sim"}  # units, the word token, the kept nickname prefix


def chinese(msg: str) -> str:
    assert re.search(r"[\u4e00-\u9fff]", msg), msg
    latin = set(re.findall(r"[A-Za-z]+", msg))
    assert latin <= ALLOWED_LATIN, (msg, latin - ALLOWED_LATIN)
    return msg


def refusal(r, status: int, extra: tuple = ()) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code", *extra}
    return body["error"]


class FakeState:
    """What the class router reaches of `ServerState` before a question is admitted."""

    def __init__(self, admit_error: APIError | None = None):
        self.loop = SimpleNamespace(max_tokens_cap=96, generation=0, sinks=[])
        self.settings = SimpleNamespace(max_queue=7, max_requests_per_user=1,
                                        max_requests_per_address=4)
        self.votes = None
        self.admit_error = admit_error

    def client_of(self, request):
        return SimpleNamespace(key="phone:test", address="127.0.0.1")

    async def admit(self, ticket):
        raise self.admit_error


def app_over(state) -> TestClient:
    app = FastAPI()
    add_error_handlers(app, ServerMetrics("ask-refusals"))
    app.include_router(router(state))
    return TestClient(app)


@pytest.fixture
def client():
    with app_over(FakeState()) as c:
        yield c


@pytest.mark.parametrize("body, param, en_words, numbers", [
    ({"nickname": "", "question": "hi"}, "nickname", "nickname is empty: type one", []),
    ({"nickname": "\u202e\u200b\x07", "question": "hi"}, "nickname", "nickname is empty", []),
    ({"nickname": "ann", "question": "  "}, "question", "question is empty: type one", []),
    ({"nickname": "x" * 33, "question": "hi"}, "nickname",
     "nickname is 33 characters; at most 32", ["33", "32"]),
    ({"nickname": "ann", "question": "q" * 401}, "question",
     "question is 401 characters; at most 400", ["401", "400"]),
    ({"nickname": "ann", "question": "hi\x07there"}, "question",
     "question holds a control character", []),
    ({"nickname": "sim-7", "question": "hi"}, "nickname", "kept for simulated users", []),
    ({"nickname": "ann", "question": "hi", "phone": "short"}, "phone",
     "phone must be 16 to 128 characters", ["16", "128"]),
])
def test_ask_refuses_a_bad_request_in_the_phones_language(client, body, param, en_words,
                                                          numbers):
    en = refusal(client.post("/class/ask", json=body, **EN), 400)
    assert en_words in en["message"] and en["param"] == param
    for how in (ZH, ZH_HEADER):
        zh = refusal(client.post("/class/ask", json=body, **how), 400)
        chinese(zh["message"])
        assert {k: zh[k] for k in ("type", "param", "code")} == \
            {k: en[k] for k in ("type", "param", "code")}
        for n in numbers:
            assert n in zh["message"], (n, zh["message"])
    # no language asked for: English, as before
    assert refusal(client.post("/class/ask", json=body), 400)["message"] == en["message"]


def test_the_pause_after_an_answer_and_one_question_in_flight_in_the_phones_language():
    students = _Students(ClassLimits(min_interval_s=3.0))
    app = FastAPI()
    add_error_handlers(app, ServerMetrics("ask-rate"))

    @app.post("/check")
    async def check(request: Request):
        students.check("phone:a", request_lang(request))
        return {}

    with TestClient(app) as c:
        students.in_flight.add("phone:a")
        en = refusal(c.post("/check", **EN), 429, ("wait",))
        assert en["message"] == "your previous question is still being answered; wait for it"
        zh = refusal(c.post("/check", **ZH), 429, ("wait",))
        chinese(zh["message"])
        assert zh["code"] == en["code"] == "one_question_at_a_time"
        assert zh["type"] == en["type"] == "rate_limit_error"
        # the phone's own limit, as a wait reason of its own (not one of the engine's)
        assert zh["wait"] == en["wait"] == {"code": "own_in_flight"}

        students.in_flight.clear()
        students.last_ask["phone:a"] = time.monotonic()
        r = c.post("/check", **EN)
        en = refusal(r, 429, ("wait",))
        assert en["message"].startswith("one question per 3 s after an answer: try again in ")
        assert "retry-after" in r.headers
        r = c.post("/check", **ZH_HEADER)
        zh = refusal(r, 429, ("wait",))
        chinese(zh["message"])
        assert "3" in zh["message"] and "retry-after" in r.headers
        assert zh["code"] == en["code"] == "too_many_questions"
        for w in (en["wait"], zh["wait"]):
            assert w["code"] == "own_pause" and w["interval_s"] == 3.0
            assert 0 < w["seconds_left"] <= 3.0


def test_the_phones_own_limits_are_codes_of_their_own_with_words_in_both_languages():
    """The class's own codes stay apart from the engine's, and the page says each in zh and
    en (the browser test sees a zh phone say own_pause)."""
    from classroom.page import PAGE
    from classroom.server import OWN_WAIT_CODES
    from engine.waits import WAIT_CODES

    assert OWN_WAIT_CODES == ("own_in_flight", "own_pause")
    assert not set(OWN_WAIT_CODES) & set(WAIT_CODES)
    for code in OWN_WAIT_CODES:
        assert PAGE.count(f"{code}: ") == 2, code  # STR.en.own and STR.zh.own
    assert "在等你自己的限制" in PAGE and "Waiting on your own limit" in PAGE


def test_an_unknown_answer_is_refused_in_the_phones_language(client):
    en = refusal(client.get("/class/answer/class-nope", **EN), 404)
    assert en["message"] == "no answer with this id for this phone (it may have expired)"
    zh = refusal(client.get("/class/answer/class-nope", **ZH), 404)
    chinese(zh["message"])
    assert zh["code"] == en["code"] == "answer_not_found" and zh["param"] == en["param"]


@pytest.mark.parametrize("err, numbers", [
    (APIError(429, "the server is full (7 requests in it); try again shortly",
              "rate_limit_error", code="queue_full", headers={"Retry-After": "1"}), ["7"]),
    (APIError(429, "this phone already has 1 requests running (user names do not count as "
                   "other clients)", "rate_limit_error", code="too_many_requests_per_user",
              headers={"Retry-After": "1"}), ["1"]),
    (APIError(429, "address 127.0.0.1 already has 4 requests running", "rate_limit_error",
              code="too_many_requests_per_address", headers={"Retry-After": "1"}), ["4"]),
    (APIError(400, "the prompt is 900 tokens; this server's max_model_len is 512, so a prompt "
                   "may have at most 511", param="prompt", code="context_length_exceeded"),
     ["900", "511"]),
])
def test_the_servers_admission_refusals_reach_a_chinese_phone_in_chinese(err, numbers):
    body = {"nickname": "ann", "question": "hi"}
    with app_over(FakeState(err)) as c:
        r = c.post("/class/ask", json=body, **EN)
        en = refusal(r, err.status)
        assert en["message"] == err.message and en["code"] == err.code
        r = c.post("/class/ask", json=body, **ZH)
        zh = refusal(r, err.status)
        chinese(zh["message"])
        assert {k: zh[k] for k in ("type", "param", "code")} == \
            {k: en[k] for k in ("type", "param", "code")}
        for n in numbers:
            assert n in zh["message"], (n, zh["message"])
        if err.headers:
            assert r.headers.get("retry-after") == "1"
        # the phone may ask again: a refused admission holds no place
        assert c.post("/class/ask", json=body, **EN).status_code == err.status


def test_the_page_sends_its_language_with_each_request():
    from classroom.page import PAGE
    for path in ('"/class/ask?lang=" + lang', '"/class/token?lang=" + lang', '"&lang=" + lang'):
        assert path in PAGE, path


def test_no_english_sentence_in_the_chinese_phones_words():
    """Every refusal a zh phone can get and every word of the page's zh table (classroom/static/
    student.js STR.zh: labels, notes, wait reasons) is Chinese: no run of three English words
    (names like KV, TTFT or ServeLab stand alone)."""
    fields = {"name": "nickname", "n": 3, "limit": 32, "prefix": "sim-", "interval": 3,
              "wait": 2}
    for key, (zh, _en) in REFUSALS.items():
        text = zh.format(zname=FIELDS_ZH["nickname"], **fields)
        assert not ENGLISH_RUN.findall(text), (key, text)
    js = (Path(classroom.__file__).parent / "static" / "student.js").read_text(encoding="utf-8")
    zh_table = js[js.index("\n  zh: {"):js.index("\n};", js.index("\n  zh: {"))]
    words = " | ".join(re.findall(r'"((?:[^"\\]|\\.)*)"', zh_table))
    assert len(words) > 500, "the zh table was not found whole"
    english = [r for r in ENGLISH_RUN.findall(words) if r != "English"]
    assert not english, english
