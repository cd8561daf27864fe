"""The students' page in chromium, on a real class server (in this process): its language
follows the phone's (zh-CN, en-US) with a toggle, the journey panel fills from the phone's
own request, a reload mid-answer reattaches to the answer and shows the rest of it, and a
phone that waited at the door reads, after its answer, its own timeline with the codes the
step stream sent for it, then its own pause as a wait of its own. Screenshots of a Chinese
phone's journey, door and timeline go to build/screenshots/."""

from __future__ import annotations

import re

import httpx
import pytest

from engine import EngineConfig, LLMEngine
from engine.server import ServerSettings
from tests.browsing import SHOTS
from tests.conftest import SMALL, running_server

PHONE = {"width": 390, "height": 844}
JOIN, ADMIN = "join-code-1", "admin-key-1"

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def class_server():
    from classroom.server import ClassLimits, routers

    engine = LLMEngine(EngineConfig(**SMALL))
    # a pause after an answer long enough that a phone asking again at once meets it
    with running_server(engine, ServerSettings(api_key=JOIN, admin_key=ADMIN),
                        routers=routers(limits=ClassLimits(min_interval_s=30))) as (url, app):
        yield url


def phone(chromium, url: str, locale: str):
    ctx = chromium.new_context(viewport=PHONE, is_mobile=True, locale=locale)
    p = ctx.new_page()
    p.set_default_timeout(120_000)
    errors: list[str] = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    # the page's CSP refuses any inline style or script: chromium says so on the console
    p.on("console", lambda m: errors.append(m.text)
         if "Content Security Policy" in m.text else None)
    p.goto(f"{url}/class#code={JOIN}")
    return ctx, p, errors


def test_the_students_page_speaks_the_phones_language(chromium, class_server):
    SHOTS.mkdir(parents=True, exist_ok=True)
    zh_ctx, zh, zh_err = phone(chromium, class_server, "zh-CN")
    en_ctx, en, en_err = phone(chromium, class_server, "en-US")
    try:
        assert zh.inner_text("#ask") == "提问" and zh.inner_text("label[for=code]") == "加入码"
        assert zh.evaluate("document.documentElement.lang") == "zh-CN"
        assert "小型英文模型" in zh.inner_text(".model")
        assert en.inner_text("#ask") == "Ask" and en.inner_text("label[for=code]") == "Join code"
        assert "small English model" in en.inner_text(".model")
        # the toggle: the other language, every labelled string, and back
        en.click("#lang")
        assert en.inner_text("#ask") == "提问" and en.inner_text("h1").startswith("ServeLab：")
        en.click("#lang")
        assert en.inner_text("#ask") == "Ask"
        # a Chinese nickname and question, end to end, and the journey panel in Chinese
        zh.fill("#nick", "小明")
        zh.fill("#q", "请写一首关于大海的长诗。")
        zh.click("#ask")
        zh.wait_for_function("() => /[0-9]/.test(document.getElementById('rate').textContent)")
        assert zh.inner_text("#asked") == "小明: 请写一首关于大海的长诗。"
        assert zh.inner_text("#answer").strip()
        assert "\ufffd" not in zh.inner_text("#answer")
        assert zh.inner_text("#seat").startswith("座位 ")
        assert "首 token 延迟" in zh.inner_text("#ttft")
        assert "第" in zh.inner_text("#j-seat") and "步上车" in zh.inner_text("#j-seat")
        assert zh.locator("#pages span").count() >= 1
        assert zh.locator("#pages span").first.inner_text().startswith("0 → ")
        assert zh.locator("#tokens .tk sup").count() >= 1  # tokens with their step numbers
        assert zh.inner_text("#j-class")  # the class comparison line
        zh.screenshot(path=str(SHOTS / "class-phone-zh-journey.png"), full_page=True)
        assert not zh_err and not en_err, (zh_err, en_err)
    finally:
        zh_ctx.close()
        en_ctx.close()


def test_a_reload_mid_answer_shows_the_rest_of_it(chromium, class_server):
    ctx, p, errors = phone(chromium, class_server, "en-US")
    try:
        p.fill("#nick", "reloader")
        p.fill("#q", "Write a long story about a ship at sea, with many details.")
        p.click("#ask")
        p.wait_for_function("() => document.getElementById('answer').textContent.length > 20")
        before = p.inner_text("#answer")
        assert not p.evaluate("() => /[0-9]/.test(document.getElementById('rate')"
                              ".textContent)"), "the answer ended before the reload"
        saved = p.evaluate("() => JSON.parse(localStorage.getItem('servelab-answer'))")
        p.reload()
        p.wait_for_function("() => /[0-9]/.test(document.getElementById('rate').textContent)")
        after = p.inner_text("#answer")
        assert after.startswith(before.rstrip()[:20]) and len(after) > len(before), (before,
                                                                                    after)
        assert p.inner_text("#asked").startswith("reloader: Write a long story")
        assert p.inner_text("#note") == "Reconnected to your answer."
        # the whole answer, as the server kept it for this phone
        secret = p.evaluate("() => localStorage.getItem('servelab-phone')")
        with httpx.stream("GET", f"{class_server}/class/answer/{saved['rid']}",
                          headers={"Authorization": f"Bearer {JOIN}",
                                   "X-Phone-Secret": secret}, timeout=60) as r:
            import json
            text = "".join(json.loads(line[6:]).get("text", "") for line in r.iter_lines()
                           if line.startswith("data: ")
                           and json.loads(line[6:])["type"] == "delta")
        assert after == text
        # a second reload once it is over shows the finished answer again
        p.reload()
        p.wait_for_function("() => /[0-9]/.test(document.getElementById('rate').textContent)")
        assert p.inner_text("#answer") == text
        assert not errors, errors
    finally:
        ctx.close()


def test_a_phone_at_the_door_reads_its_own_reason_in_chinese(chromium, class_server):
    """Eight long answers take every seat; a zh-CN phone that asks then waits at the door and
    reads why in Chinese, with the engine's own numbers: the code the step stream sent for its
    request (engine/waits.py), in the words of the page's language."""
    import json
    import threading
    import time

    auth = {"Authorization": f"Bearer {ADMIN}"}
    events: list[dict] = []
    stop = threading.Event()

    def watch():  # the teacher's step stream, bounded in count and time
        deadline = time.monotonic() + 240
        with httpx.stream("GET", f"{class_server}/v1/servelab/steps", headers=auth,
                          params={"limit": 2000}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                if stop.is_set() or time.monotonic() > deadline:
                    return

    def long_answer(i):
        httpx.post(f"{class_server}/v1/completions", headers=auth, timeout=240, json={
            "model": "smollm2-135m", "prompt": f"Story {i}:", "max_tokens": 160,
            "ignore_eos": True})

    threading.Thread(target=watch, daemon=True).start()
    blockers = [threading.Thread(target=long_answer, args=(i,)) for i in range(8)]
    for b in blockers:
        b.start()
    deadline = time.monotonic() + 60
    while not any(sum(s["request_id"] is not None for s in e["seats"]) == 8
                  for e in events[-3:]):
        assert time.monotonic() < deadline, "the eight answers never took every seat"
        time.sleep(0.05)
    ctx, p, errors = phone(chromium, class_server, "zh-CN")
    try:
        p.fill("#nick", "门口的人")
        p.fill("#q", "你好")
        p.click("#ask")
        p.wait_for_function("() => document.getElementById('j-door').textContent"
                            ".includes('个座位都坐满了')")
        door = p.inner_text("#j-door")
        p.screenshot(path=str(SHOTS / "class-phone-zh-door.png"), full_page=True)
        p.wait_for_function("() => /[0-9]/.test(document.getElementById('rate').textContent)",
                            timeout=240_000)
        rid = p.evaluate("() => JSON.parse(localStorage.getItem('servelab-answer')).rid")
        # after the answer, its own timeline: one row a stretch, the reasons' codes on them
        p.locator("#timeline").wait_for(state="visible")
        rows = p.evaluate("""() => [...document.querySelectorAll('#tl-rows .tl-row')].map(r => ({
            phase: r.dataset.phase, text: r.textContent,
            codes: [...r.querySelectorAll('.tl-code')].map(c => c.dataset.code),
            bar: r.querySelector('.tl-bar').getBoundingClientRect().width}))""")
        timeline_text = p.inner_text("#timeline")
        answer = p.inner_text("#answer")
        p.screenshot(path=str(SHOTS / "class-phone-zh-timeline.png"), full_page=True)
        # asking again at once: the phone's own limit, said as a wait of its own, in Chinese
        p.fill("#q", "再问一次")
        p.click("#ask")
        p.wait_for_function("() => document.getElementById('own').dataset.code === 'own_pause'")
        own = p.inner_text("#own")
        p.locator("#own").scroll_into_view_if_needed()
        p.screenshot(path=str(SHOTS / "class-phone-zh-own.png"))
        assert p.inner_text("#answer") == answer and p.inner_text("#msg") == ""
        assert p.inner_text("#timeline") == timeline_text  # the last answer's, back on screen
        # the page gave the class the nickname it asked with: the one name the teacher's
        # hide list and the projector's masking know (listed by handle, never the phone's id)
        deadline = time.monotonic() + 30
        while True:
            names = httpx.get(f"{class_server}/v1/servelab/votes/state", headers=auth,
                              timeout=10).json()["names"]
            if any(n["name"] == "门口的人" for n in names) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert any(n["name"] == "门口的人" for n in names), names
        vote_id = p.evaluate("() => localStorage.getItem('servelab-vote-id')")
        assert vote_id and vote_id not in json.dumps(names)
        assert not errors, errors
    finally:
        ctx.close()
        stop.set()
        for b in blockers:
            b.join(240)
    sent = [e["waits"][rid] for e in events if rid in e.get("waits", {})]
    assert sent and sent[0]["code"] == "seats_full", sent[:3]
    assert f"全部 {sent[0]['seats']} 个座位都坐满了" in door, door
    assert "在门口" in door and "座位已满" in door  # its place, and the reasons it waited for
    # the timeline names the very codes the step stream sent for this request, in order
    assert [r["phase"] for r in rows][0] == "queued" and rows[-1]["phase"] == "decode"
    assert "prefill" in [r["phase"] for r in rows], rows
    codes = list(dict.fromkeys(c for r in rows for c in r["codes"]))
    assert codes == list(dict.fromkeys(w["code"] for w in sent)), (codes, sent[:5])
    waited = [e["step"] for e in events if rid in e.get("waiting", [])]
    assert re.search(rf"第 {waited[0]}(–| 步)", rows[0]["text"]), (waited[:3], rows[0])
    assert all(r["bar"] > 0 for r in rows), rows  # drawn through CSSOM, under the CSP
    assert "排队" in timeline_text and "解码" in timeline_text and "毫秒" in timeline_text
    assert "座位已满" in rows[0]["text"], rows[0]
    assert own.startswith("在等你自己的限制") and "秒后可以再问" in own, own
