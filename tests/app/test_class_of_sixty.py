"""A class of sixty on one class server: five real phones (chromium, zh-CN and en-US) and 55
lightweight phones (httpx, doing what the students' page does), with the teacher's Classroom
page open on the projector, all on this machine.

The test starts the class server itself (`ClassServer.start`) and the app with it configured
(`SERVELAB_CLASS_*`), connects the teacher's page, and opens a phone round from the self-test
over the teacher's vote route. Then:
- each chromium phone opens the students' page; its page is shown when the Ask button is
  visible, and the round when its choices are drawn (both timed from the navigation);
- each httpx phone gets its phone token (`POST /class/token`), joins the vote
  (`POST /class/join`), polls the round once a second (`GET /class/vote`) as the page does,
  and a few ask a question (`POST /class/ask`), so the engine works during the votes;
- votes one at a time (phones tapping a choice, httpx phones posting it): each vote's time
  until the projector's count (`data-voted` on the teacher's page) shows it; then the rest
  vote at once and the count must reach sixty;
- the teacher page's redraw times ("redrawn in N ms" of the live view, "drawn in N ms" of
  the vote panel) are read throughout.
What must hold is asserted: every phone's page and round shown, every vote on the projector
(each within 10 s, all sixty at the end), every answer finished, no page error. The timings
are figures, not assertions (a shared CI machine's load moves them): they are written to
build/class-of-sixty.json with the load average before and after, and compared with the
goals in `GOALS` there (docs/teaching.md quotes a run).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import threading
import time

import httpx
import pytest

from classroom.client import DEFAULT_SWITCHES, ClassServer
from tests.app.test_browser import CHROMIUM, ROOT, Tab
from tests.app.test_classroom_load import streamlit_with

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BROWSER_LOCALES = ("zh-CN", "en-US", "zh-CN", "en-US", "zh-CN")
LIGHT = 55
ASKING = 10  # of the light phones, these ask one question each while the class votes
TIMED_LIGHT = 10  # light phones whose votes are timed one at a time (with every real phone)
PHONE = {"width": 390, "height": 844}
OUT = ROOT / "build" / "class-of-sixty.json"
DEADLINE_S = 600  # the whole class, bounded
GOALS = {"page_shown_s": 2.0, "vote_to_count_s": 1.0, "redraw_ms": 300.0}  # reported


def projector_count(page) -> int | None:
    """The count of votes the teacher's page shows now (None before the round is drawn)."""
    return page.evaluate("""() => { const e = document.querySelector('.vt-big[data-voted]');
                                    return e ? Number(e.dataset.voted) : null; }""")


def wait_count(page, n: int, timeout_s: float) -> float | None:
    """Seconds until the projector shows at least `n` votes (None: not within `timeout_s`)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        got = projector_count(page)
        if got is not None and got >= n:
            return time.perf_counter() - t0
        time.sleep(0.02)
    return None


def redraw_times(page) -> tuple[list[float], list[float]]:
    """The teacher page's redraw lines now: the live view's and the vote panel's (ms)."""
    text = page.locator('[data-testid="stMain"]').inner_text()
    live = [float(m) for m in re.findall(r"redrawn in (\d+) ms", text)]
    votes = [float(m) for m in re.findall(r"(?<!re)drawn in (\d+) ms", text)]
    return live, votes


class LightPhones:
    """55 phones as plain HTTP clients in one asyncio loop on a thread: token, join, poll the
    round every second like the page, some ask a question. `pids` fill as they join."""

    def __init__(self, url: str, join_code: str):
        self.url, self.code = url, join_code
        self.pids: list[str | None] = [None] * LIGHT
        self.tokens: list[str | None] = [None] * LIGHT
        self.polls, self.answers, self.errors = 0, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self.main()), daemon=True)

    async def phone(self, c: httpx.AsyncClient, i: int) -> None:
        auth = {"Authorization": f"Bearer {self.code}"}
        r = await c.post("/class/token", headers=auth)
        assert r.status_code == 200, r.text
        self.tokens[i] = r.json()["phone"]
        r = await c.post("/class/join", headers={**auth, "Accept-Language": "zh-CN,zh"},
                         json={"phone": None})
        assert r.status_code == 200, r.text
        self.pids[i] = r.json()["phone"]
        jobs = [self.poll(c, {**auth, "X-Phone": self.pids[i]})]
        if i < ASKING:
            jobs.append(self.ask(c, i))
        await asyncio.gather(*jobs)

    async def poll(self, c: httpx.AsyncClient, headers: dict) -> None:
        end = time.monotonic() + DEADLINE_S
        while not self.stop.is_set() and time.monotonic() < end:
            r = await c.get("/class/vote", headers=headers, params={"lang": "zh"})
            if r.status_code != 200:
                self.errors.append(r.text[:200])
            self.polls += 1
            await asyncio.sleep(1.0)

    async def ask(self, c: httpx.AsyncClient, i: int) -> None:
        headers = {"Authorization": f"Bearer {self.code}", "X-ServeLab-Phone": self.tokens[i]}
        sent, first = time.perf_counter(), None
        async with c.stream("POST", "/class/ask", headers=headers, json={
                "nickname": f"学生{i}", "question": f"What is {i} + 1? Answer briefly."}) as r:
            if r.status_code != 200:
                self.errors.append((await r.aread())[:200].decode())
                return
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    ev = json.loads(line[6:])
                    if ev["type"] == "delta" and first is None:
                        first = time.perf_counter() - sent
                    if ev["type"] in ("done", "error"):
                        self.answers.append({"type": ev["type"], "ttft_s": first})

    async def main(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(120, connect=30),
                                     limits=httpx.Limits(max_connections=200)) as c:
            await asyncio.gather(*(self.phone(c, i) for i in range(LIGHT)),
                                 return_exceptions=False)


def test_a_class_of_sixty_phones(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium fonts-noto-cjk")
    from playwright.sync_api import sync_playwright

    from app.lessons import load_quiz

    quiz = load_quiz().questions[0]
    load_before = os.getloadavg()[0]  # other work on the machine slows every figure
    srv = ClassServer.start(DEFAULT_SWITCHES)
    light = LightPhones(srv.url, srv.join_code)
    contexts = []  # closed with the browser if the test fails
    try:
        env = {"SERVELAB_CLASS_URL": srv.url, "SERVELAB_CLASS_JOIN_CODE": srv.join_code,
               "SERVELAB_CLASS_ADMIN_KEY": srv.admin_key}
        with streamlit_with(env, tmp_path / "streamlit.log") as app_url, \
                sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-background-networking",
                "--disable-gpu"])
            with Tab(b, app_url, 1920, 1080) as teacher:
                page = teacher.page
                teacher.open("/classroom")
                page.get_by_role("button", name=f"Connect to {srv.url}").click()
                r = httpx.post(f"{srv.url}/v1/servelab/votes/open", headers=srv.headers,
                               json={"quiz": quiz.id, "seconds": DEADLINE_S}, timeout=10)
                assert r.status_code == 200, r.text
                assert wait_count(page, 0, 120) is not None, "the projector shows no round"

                light.thread.start()
                # the real phones: page shown, then the round's choices drawn
                shown, round_shown, phones = [], [], []
                for locale in BROWSER_LOCALES:
                    ctx = b.new_context(viewport=PHONE, is_mobile=True, locale=locale)
                    contexts.append(ctx)
                    p = ctx.new_page()
                    p.set_default_timeout(30_000)
                    errors: list[str] = []
                    p.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
                    t0 = time.perf_counter()
                    p.goto(f"{srv.url}/class#code={srv.join_code}", wait_until="commit")
                    p.wait_for_selector("#ask", state="visible")
                    shown.append(time.perf_counter() - t0)
                    p.wait_for_selector("#vp-choices button")
                    round_shown.append(time.perf_counter() - t0)
                    want = "提问" if locale == "zh-CN" else "Ask"
                    assert p.inner_text("#ask") == want, (locale, p.inner_text("#ask"))
                    phones.append((p, errors))
                # the real phones ask too (a question each, answered while the class votes)
                for i, (p, _) in enumerate(phones):
                    p.fill("#nick", "小明" if i % 2 == 0 else f"phone{i}")
                    p.fill("#q", "为什么分页注意力能减少显存浪费？请简短回答。" if i % 2 == 0
                           else "Why does paged attention waste less memory? Briefly.")
                    p.click("#ask")
                end = time.monotonic() + 120
                while None in light.pids and time.monotonic() < end:
                    time.sleep(0.2)
                assert None not in light.pids, f"{light.pids.count(None)} phones did not join"
                assert not light.errors, light.errors[:3]

                redraw_live, redraw_votes = [], []

                def sample_redraws():
                    live, votes = redraw_times(page)
                    redraw_live.extend(live)
                    redraw_votes.extend(votes)

                # votes one at a time: each until the projector counts it
                latencies, count = [], 0
                with httpx.Client(base_url=srv.url, timeout=10) as c:
                    voters = [("phone", p) for p, _ in phones] + [
                        ("light", pid) for pid in light.pids[:TIMED_LIGHT]]
                    for k, (kind, who) in enumerate(voters):
                        time.sleep(0.3 + 0.37 * (k % 3))  # not in step with the 0.5 s redraw
                        sample_redraws()
                        t0 = time.perf_counter()
                        if kind == "phone":
                            who.locator("#vp-choices button").nth(k % quiz_choices(quiz)).click()
                        else:
                            r = c.post("/class/vote", params={"lang": "en"}, json={
                                "round": current_round(srv), "choice": k % quiz_choices(quiz)},
                                headers={"Authorization": f"Bearer {srv.join_code}",
                                         "X-Phone": who})
                            assert r.status_code == 200, r.text
                        count += 1
                        seen = wait_count(page, count, 10)
                        assert seen is not None, f"vote {count} never reached the projector"
                        latencies.append(time.perf_counter() - t0)
                    # the rest of the class at once
                    rid = current_round(srv)
                    t0 = time.perf_counter()
                    for k, pid in enumerate(light.pids[TIMED_LIGHT:]):
                        r = c.post("/class/vote", json={"round": rid, "choice": k % 2},
                                   headers={"Authorization": f"Bearer {srv.join_code}",
                                            "X-Phone": pid})
                        assert r.status_code == 200, r.text
                    all_in = wait_count(page, 60, 20)
                    assert all_in is not None, f"the projector stopped at {projector_count(page)}"
                    all_in_s = time.perf_counter() - t0
                for _ in range(10):  # the redraw lines while the answers still stream
                    sample_redraws()
                    time.sleep(0.7)
                light.stop.set()
                # the phones' answers arrived (the real ones show their figures when done)
                for p, errors in phones:
                    p.wait_for_function(
                        "() => /[0-9]/.test(document.getElementById('rate').textContent)",
                        timeout=240_000)
                    assert p.inner_text("#answer").strip()
                    assert not errors, errors
                light.thread.join(240)
                assert teacher.exceptions() == 0
                for ctx in contexts:
                    ctx.close()
        assert len(light.answers) == ASKING and all(
            a["type"] == "done" for a in light.answers), light.answers
        state = httpx.get(f"{srv.url}/v1/servelab/votes/state", headers=srv.headers,
                          timeout=10).json()
        assert state["round"]["voted"] == 60, state["round"]
        figures = {
            "load_average_1min_before": round(load_before, 2),
            "load_average_1min_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
            "phones": len(BROWSER_LOCALES) + LIGHT, "chromium_phones": len(BROWSER_LOCALES),
            "page_shown_s": [round(x, 3) for x in shown],
            "round_shown_s": [round(x, 3) for x in round_shown],
            "vote_to_count_s_median": round(statistics.median(latencies), 3),
            "vote_to_count_s_max": round(max(latencies), 3), "votes_timed": len(latencies),
            "last_45_votes_to_count_s": round(all_in_s, 3),
            "redraw_ms_median": statistics.median(redraw_live) if redraw_live else None,
            "redraw_ms_max": max(redraw_live, default=None), "redraws": len(redraw_live),
            "vote_panel_drawn_ms_median": statistics.median(redraw_votes) if redraw_votes
            else None,
            "light_polls": light.polls,
            "light_ttft_s_median": statistics.median(a["ttft_s"] for a in light.answers)}
        figures["goals_met"] = {
            "page_shown_s": max(shown) < GOALS["page_shown_s"],
            "vote_to_count_s": figures["vote_to_count_s_median"] < GOALS["vote_to_count_s"],
            "redraw_ms": figures["redraw_ms_median"] is not None
            and figures["redraw_ms_median"] < GOALS["redraw_ms"]}
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(figures, indent=1))
        print(json.dumps(figures, indent=1))
        assert redraw_live, "the teacher's live view never said how long it took"
        assert redraw_votes, "the vote panel never said how long it took"
    finally:
        light.stop.set()
        srv.stop()


def quiz_choices(quiz) -> int:
    return len(quiz.choices)


def current_round(srv: ClassServer) -> str:
    """The open round's id, as the projector's view names it."""
    r = httpx.get(f"{srv.url}/v1/servelab/votes/state", headers=srv.headers, timeout=10).json()
    return r["round"]["id"]
