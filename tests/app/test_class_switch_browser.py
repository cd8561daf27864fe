"""A switch flip in front of the class, in chromium: the teacher's Streamlit page and five
phones (three zh-CN, two en-US) on one class server.

Twice, with the five phones mid-answer, the teacher flips switches on the page: first
"after the requests in flight finish" (drain), then "now" (abort). Every phone ends with a
whole answer without a rescan or a reload (the cut ones ask again by themselves and say so
in their language), the same join URL works throughout, and the teacher's page shows the
new engine within 10 s of the server being ready (the moment a question held during the
flip is admitted), without a reload. The projector's layout is checked at 1920x1080 and
1280x720 (nicknames fit their seats, no gauge value cut), with large type too. Screenshots
go to build/screenshots/.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.app.test_classroom_browser import stop_class_server
from tests.browsing import SHOTS, Tab

PHONE = {"width": 390, "height": 844}
NICKS = ("小明", "小红同学", "李雷", "ann", "a-very-long-latin-nickname-30ch")
LOCALES = ("zh-CN", "zh-CN", "zh-CN", "en-US", "en-US")
QUESTION = "Write a long poem about the sea, with many verses."

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# every seat card's name fits its card; every gauge value is shown whole
LAYOUT_JS = """() => {
  const bad = [];
  for (const el of document.querySelectorAll('.sl-seat .sl-rid, .sl-seat')) {
    if (el.scrollWidth > el.clientWidth + 1) bad.push('overflow: ' + el.textContent);
  }
  for (const el of document.querySelectorAll('[data-testid="stMetricValue"] div, [data-testid="stMetricValue"]')) {
    if (el.scrollWidth > el.clientWidth + 1) bad.push('metric cut: ' + el.textContent);
  }
  return bad;
}"""


def held_question(url: str, code: str, generation: int, out: dict) -> None:
    """Short questions, one after another, until one is admitted by the new engine: one
    asked during the flip is held and admitted the moment the new engine is up, so its
    `accepted` event marks when the server was ready."""
    deadline = time.monotonic() + 300
    for i in range(200):
        if time.monotonic() > deadline:
            return
        auth = {"Authorization": f"Bearer {code}"}  # each try a new phone, with its token
        try:
            token = httpx.post(f"{url}/class/token", headers=auth, timeout=30).json()["phone"]
        except (httpx.HTTPError, ValueError, KeyError):
            time.sleep(0.2)  # the server is busy swapping: try again
            continue
        with httpx.stream("POST", f"{url}/class/ask", timeout=300,
                          headers={**auth, "X-ServeLab-Phone": token},
                          json={"nickname": f"late-{generation}-{i}", "question": "Hi."}) as r:
            out["status"] = r.status_code
            if r.status_code != 200:
                out["body"] = r.read().decode()
                return
            for line in r.iter_lines():
                if line.startswith("data: "):
                    ev = json.loads(line[6:])
                    if ev["type"] == "accepted":
                        out["ready"] = time.monotonic()
                        out["engine"] = ev["engine"]
                    if ev["type"] in ("done", "error"):
                        out["last"] = ev
                        break
        if out.get("engine") == generation:
            return


def long_answer(url: str, code: str, nickname: str) -> None:
    """One more student's long answer, read to its end: with it in flight beside the five
    phones' the drain lasts long enough for the teacher's page to show its countdown, also on
    a CPU fast enough to finish five answers within the page's poll."""
    auth = {"Authorization": f"Bearer {code}"}
    try:
        token = httpx.post(f"{url}/class/token", headers=auth, timeout=30).json()["phone"]
        with httpx.stream("POST", f"{url}/class/ask", timeout=300,
                          headers={**auth, "X-ServeLab-Phone": token},
                          json={"nickname": nickname, "question": QUESTION}) as r:
            for _ in r.iter_lines():
                pass
    except (httpx.HTTPError, ValueError, KeyError):
        pass  # only there to keep the engine busy; the phones' checks are the test


def test_five_phones_keep_their_answers_through_two_switch_flips(chromium, app_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with Tab(chromium, app_url, 1920, 1080) as teacher:
        page = teacher.page
        teacher.open("/classroom")
        page.get_by_role("button", name="Start the class server").click()
        code_el = page.locator("h3", has_text="Join code").locator("code")
        code_el.wait_for(timeout=240_000)
        code = code_el.inner_text().strip()
        url = page.locator("h3", has_text="Join at").locator("code").inner_text().strip()
        join = f"{url}#code={code}"
        phones, opened, passed = [], [], False
        may_ask = 0.0  # (time.monotonic) when the phones may ask their next question
        try:
            for nick, locale in zip(NICKS, LOCALES):
                ctx = chromium.new_context(viewport=PHONE, is_mobile=True, locale=locale)
                opened.append(ctx)
                p = ctx.new_page()
                p.set_default_timeout(180_000)
                p.goto(join)
                # every note the page shows, kept for the test
                p.evaluate("""() => { self.__notes = [];
                  new MutationObserver(() => self.__notes.push(
                    document.getElementById('note').textContent)).observe(
                    document.getElementById('note'), {childList: true, characterData: true,
                    subtree: true}); }""")
                p.fill("#nick", nick)
                p.fill("#q", QUESTION)
                phones.append(p)
            timings = {}
            for flip, (batching, kv, mode, engine_line) in enumerate((
                    ("static (tour bus)", "contiguous (banquet hall)", "drain",
                     "static · contiguous"),
                    ("continuous (subway)", "paged", "abort",
                     "continuous · paged"))):
                how = ("after the requests in flight finish" if mode == "drain"
                       else "now, cutting them")
                # the live view may redraw without pause (answers still streaming), so each
                # choice waits for its own radio to be checked, not for a quiet app
                for key, text in (("cls_run_batching", batching), ("cls_run_kv_layout", kv),
                                  ("cls_how", how)):
                    label = page.locator(f".st-key-{key} label", has_text=text)
                    label.click()
                    label.locator("input").wait_for(state="attached")
                    page.wait_for_function("(el) => el.checked",
                                           arg=label.locator("input").element_handle(),
                                           timeout=60_000)
                time.sleep(max(0.0, may_ask - time.monotonic()))
                extra = [threading.Thread(target=long_answer, args=(
                    url.removesuffix("/class"), code, f"extra-{flip}-{i}")) for i in range(8)]
                for th in extra:
                    th.start()
                for p in phones:
                    p.click("#ask")
                for p in phones:  # all five mid-answer
                    p.wait_for_function(
                        "() => document.getElementById('answer').textContent.length > 3")
                late: dict = {}
                page.get_by_role("button", name="Swap the engine for these switches").click()
                asker = threading.Thread(target=held_question,
                                         args=(url.removesuffix("/class"), code, flip + 1,
                                               late))
                asker.start()
                if mode == "drain":  # the countdown shows while the answers finish
                    page.get_by_text("Finishing the").wait_for(timeout=60_000)
                    page.screenshot(path=str(SHOTS / "class-teacher-draining.png"))
                page.get_by_text(f"The engine now: {engine_line}").wait_for(timeout=300_000)
                shown = time.monotonic()
                asker.join(300)
                for th in extra:
                    th.join(300)
                assert late.get("engine") == flip + 1 and late["last"]["type"] == "done", late
                timings[mode] = shown - late["ready"]
                assert timings[mode] < 10.0, timings
                for p in phones:  # every phone: a whole answer, on the page it opened
                    p.wait_for_function(
                        "() => /[0-9]/.test(document.getElementById('rate').textContent)")
                    assert p.url == join and p.inner_text("#answer").strip()
                    assert p.inner_text("#msg") == ""
                notes = [n for p in phones for n in p.evaluate("() => self.__notes")]
                if mode == "abort":  # the cut phones said why, in their language
                    assert any("asking again" in n or "重新提问" in n for n in notes), notes
                # the class's one question per 3 s after an answer: the phones ask again
                # once that has passed (meanwhile the next switches are chosen)
                may_ask = time.monotonic() + 3.5
            # the same join URL, still: a new phone joins and is answered
            ctx = chromium.new_context(viewport=PHONE, is_mobile=True, locale="zh-CN")
            opened.append(ctx)
            p = ctx.new_page()
            p.goto(join)
            p.fill("#nick", "新同学")
            p.fill("#q", "你好")
            p.click("#ask")
            p.wait_for_function(
                "() => /[0-9]/.test(document.getElementById('rate').textContent)", timeout=120_000)
            # projector legibility, mid-class: five students in seats
            time.sleep(max(0.0, may_ask - time.monotonic()))
            for p in phones:
                p.click("#ask")
            page.locator(".sl-seat .sl-rid").first.wait_for(timeout=60_000)
            for (w, h), large in (((1920, 1080), False), ((1280, 720), False),
                                  ((1280, 720), True)):
                if large:
                    # the live view redraws without pause while phones answer, so the app is
                    # never quiet here: wait for the large type itself
                    page.locator(".st-key-cls_large label").click()
                    page.wait_for_function("""() => { const e = document.querySelector(
                        '.sl-seat .sl-rid'); return e && parseFloat(getComputedStyle(e)
                        .fontSize) >= 27; }""", timeout=60_000)
                page.set_viewport_size({"width": w, "height": h})
                time.sleep(1.5)
                bad = page.evaluate(LAYOUT_JS)
                assert bad == [], (w, h, large, bad)
                name = f"class-teacher-{w}x{h}{'-large' if large else ''}.png"
                page.screenshot(path=str(SHOTS / name))
            print("teacher page showed the new engine, seconds after ready:", timings)
            assert teacher.exceptions() == 0
            passed = True
        finally:
            for ctx in opened:
                ctx.close()
            stop_class_server(page, passed)
