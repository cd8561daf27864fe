"""`python -m benchmarks.classroom`: a whole class on one class server, measured.

Two scenarios, each with the class server (`ClassServer.start`, `python -m engine.serve` with the
class switches), the teacher's Classroom page (`streamlit run app/main.py`, configured with the
server through `SERVELAB_CLASS_*`) open in chromium on the projector, and the phones on this
machine:

- `load` (`--users 1000 --students 30`): the teacher adds simulated users with the page's own
  button (short answers) while students each ask questions through `POST /class/ask`, the
  route the students' page streams from. Figures: the teacher page's redraw times ("redrawn
  in N ms") and the students' first-token times.
- `votes` (`--phones 60`): five chromium phones (zh-CN and en-US) and the rest as plain HTTP
  clients doing what the students' page does (token, join, poll the round every second, some
  ask); votes one at a time, each timed until the projector counts it, then the rest at once.
  Figures: page shown, round shown, vote to count, redraw times, the answers' first tokens.

Each run returns everything it saw (`run_load`, `run_votes`); tests/app/test_classroom_load.py
and test_class_of_sixty.py run both small and assert what must hold (every answer whole, no
block leaked, every vote counted once, no page error); this command runs them at full size and
writes the figures (with the machine's load average: other work moves every figure) as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
BROWSER_LOCALES = ("zh-CN", "en-US", "zh-CN", "en-US", "zh-CN")
PHONE = {"width": 390, "height": 844}
VOTES_GOALS = {"page_shown_s": 2.0, "vote_to_count_s": 1.0, "redraw_ms": 300.0}  # reported
ASK_PAUSE_S = 3.5  # the students' page allows a question 3 s after an answer
# a phone's answer is over: the students' page shows its figures (the rate)
RATE_SHOWN_JS = "() => /[0-9]/.test(document.getElementById('rate').textContent)"


@contextlib.contextmanager
def teacher_page(srv, log_path: Path, browser=None):
    """The app configured with the class server `srv`, its Classroom page open and connected
    in chromium at 1920x1080: yields (Tab, browser). `browser`: a playwright chromium already
    open in this thread (the tests' session browser), or None to launch one."""
    from app.streamlit_run import streamlit_server
    from benchmarks.browser import Tab, launch

    env = {"SERVELAB_CLASS_URL": srv.url, "SERVELAB_CLASS_JOIN_CODE": srv.join_code,
           "SERVELAB_CLASS_ADMIN_KEY": srv.admin_key}
    with contextlib.ExitStack() as stack:
        app_url, _proc = stack.enter_context(
            streamlit_server("app/main.py", env=env, log_path=log_path))
        if browser is None:
            from playwright.sync_api import sync_playwright

            browser = launch(stack.enter_context(sync_playwright()))
            stack.callback(browser.close)
        with Tab(browser, app_url, 1920, 1080) as teacher:
            teacher.open("/classroom")
            teacher.page.get_by_role("button", name=f"Connect to {srv.url}").click()
            yield teacher, browser


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value} (each sample's value, summed over its labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


# --- load: simulated users and students ---------------------------------------------------

async def student(client, i: int, join_code: str, questions: int, out: list) -> None:
    """One student: `questions` questions, each after the page's rate limit allows it. Like the
    students' page, it first gets its phone token (the class's limits count by it)."""
    auth = {"Authorization": f"Bearer {join_code}"}
    token = (await client.post("/class/token", headers=auth)).json()["phone"]
    headers = {**auth, "X-ServeLab-Phone": token}
    for k in range(questions):
        if k:
            await asyncio.sleep(ASK_PAUSE_S)
        sent, first, done, status = time.perf_counter(), None, None, None
        async with client.stream("POST", "/class/ask", json={
                "nickname": f"student{i}", "question": f"Question {k}: what is {i} + {k}?"},
                headers=headers) as r:
            status = r.status_code
            if status == 200:
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    ev = json.loads(line[6:])
                    if ev["type"] == "delta" and first is None:
                        first = time.perf_counter()
                    if ev["type"] in ("done", "error"):
                        done = ev
        out.append({"student": i, "status": status, "end": done and done["type"],
                    "ttft_s": None if first is None else first - sent,
                    "tokens": done and done.get("tokens")})


def redraw_line(page) -> tuple[float, int] | None:
    loc = page.get_by_text(re.compile(r"redrawn in \d+ ms · \d+ steps received"))
    if not loc.count():
        return None
    m = re.search(r"redrawn in (\d+) ms · (\d+) steps", loc.first.inner_text())
    return float(m.group(1)), int(m.group(2))


def settled_metrics(srv, requests: int, timeout_s: float = 10.0) -> dict[str, float]:
    """The server's gauges once the last requests' metrics have landed: `requests` counted as
    served and nothing left running, waiting or holding KV (else as they are at `timeout_s`)."""
    end = time.monotonic() + timeout_s
    while True:
        vals = metric_values(srv.get("/metrics").text)
        landed = (vals.get("vllm:request_success_total", 0) >= requests
                  and vals.get("vllm:num_requests_running", 0) == 0
                  and vals.get("vllm:num_requests_waiting", 0) == 0
                  and vals.get("vllm:kv_cache_usage_perc", 0) == 0)
        if landed or time.monotonic() > end:
            return vals
        time.sleep(0.1)


def run_load(users: int, students: int, questions_each: int, tmp: Path,
             deadline_s: float = 900, browser=None) -> dict:
    """The `load` scenario; returns what it saw (see the module's docstring)."""
    from classroom.client import DEFAULT_SWITCHES, ClassServer

    load_before = os.getloadavg()[0]
    srv = ClassServer.start(DEFAULT_SWITCHES)
    try:
        with teacher_page(srv, tmp / "streamlit.log", browser) as (teacher, _):
            page = teacher.page
            box = page.get_by_label("Users", exact=True)
            box.wait_for(timeout=120_000)
            box.fill(str(users))
            box.press("Enter")
            rate = page.get_by_label("Rate (users/s)", exact=True)
            rate.fill("50")
            rate.press("Enter")
            # the button names the users once the input's rerun has landed (a click sends
            # every widget's value with it, the rate's too)
            page.get_by_role("button", name=f"Add {users} simulated users").click()
            page.get_by_text(re.compile(rf"simulated users: \d+ of {users} served")).wait_for(
                timeout=120_000)
            answers: list[dict] = []

            async def class_of_students():
                async with httpx.AsyncClient(base_url=srv.url,
                                             timeout=httpx.Timeout(600, connect=30)) as c:
                    await asyncio.gather(*(student(c, i, srv.join_code, questions_each, answers)
                                           for i in range(students)))

            thread = threading.Thread(target=lambda: asyncio.run(class_of_students()),
                                      daemon=True)
            thread.start()
            redraws, steps, table = [], [], False
            end = time.monotonic() + deadline_s
            while time.monotonic() < end:
                line = redraw_line(page)
                if line is not None:
                    redraws.append(line[0])
                    steps.append(line[1])
                table = page.locator('[data-testid="stDataFrame"]').count() > 0
                if not thread.is_alive() and table:
                    break  # the students are done and the load run's row is in the table
                time.sleep(1.0)
            thread.join(60)
            if not table:  # the load run's row, a moment after the students' last answer
                with contextlib.suppress(Exception):
                    page.locator('[data-testid="stDataFrame"]').wait_for(timeout=60_000)
                    table = True
            exceptions = teacher.exceptions()
        metrics = settled_metrics(srv, users + students * questions_each)
    finally:
        srv.stop()
    ttfts = sorted(a["ttft_s"] for a in answers if a["ttft_s"] is not None)
    return {
        "users": users, "students": students, "questions_each": questions_each,
        "answers": answers, "redraws": redraws, "steps": steps, "table_shown": table,
        "page_exceptions": exceptions, "metrics": metrics,
        "figures": {
            "students": students, "questions_each": questions_each, "simulated": users,
            "load_average_1min_before": round(load_before, 2),
            "load_average_1min_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
            "redraw_ms_median": statistics.median(redraws) if redraws else None,
            "redraw_ms_p90": sorted(redraws)[int(0.9 * (len(redraws) - 1))] if redraws
            else None, "redraws": len(redraws),
            "student_ttft_s_median": statistics.median(ttfts) if ttfts else None,
            "student_ttft_s_max": ttfts[-1] if ttfts else None,
            "requests_served": metrics.get("vllm:request_success_total")}}


# --- votes: a class of phones voting ------------------------------------------------------

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
    """Phones as plain HTTP clients in one asyncio loop on a thread: token, join, poll the
    round every second like the page, the first `asking` ask a question. `pids` fill as they
    join."""

    def __init__(self, url: str, join_code: str, n: int, asking: int, deadline_s: float):
        self.url, self.code, self.asking, self.deadline_s = url, join_code, asking, deadline_s
        self.pids: list[str | None] = [None] * n
        self.tokens: list[str | None] = [None] * n
        self.polls, self.answers, self.errors = 0, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self.main()), daemon=True)

    async def phone(self, c: httpx.AsyncClient, i: int) -> None:
        auth = {"Authorization": f"Bearer {self.code}"}
        r = await c.post("/class/token", headers=auth)
        if r.status_code != 200:
            self.errors.append(r.text[:200])
            return
        self.tokens[i] = r.json()["phone"]
        r = await c.post("/class/join", headers={**auth, "Accept-Language": "zh-CN,zh"},
                         json={"phone": None})
        if r.status_code != 200:
            self.errors.append(r.text[:200])
            return
        self.pids[i] = r.json()["phone"]
        jobs = [self.poll(c, {**auth, "X-Phone": self.pids[i]})]
        if i < self.asking:
            jobs.append(self.ask(c, i))
        await asyncio.gather(*jobs)

    async def poll(self, c: httpx.AsyncClient, headers: dict) -> None:
        end = time.monotonic() + self.deadline_s
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
            await asyncio.gather(*(self.phone(c, i) for i in range(len(self.pids))))


def current_round(srv) -> str:
    """The open round's id, as the projector's view names it."""
    r = httpx.get(f"{srv.url}/v1/servelab/votes/state", headers=srv.headers, timeout=10).json()
    return r["round"]["id"]


def run_votes(phones: int, tmp: Path, browser_phones: int = len(BROWSER_LOCALES),
              asking: int = 10, timed_light: int = 10, deadline_s: float = 600,
              browser=None) -> dict:
    """The `votes` scenario: `phones` phones, `browser_phones` of them chromium; returns what
    it saw (see the module's docstring)."""
    from app.lessons import load_quiz
    from classroom.client import DEFAULT_SWITCHES, ClassServer

    locales = [BROWSER_LOCALES[i % len(BROWSER_LOCALES)] for i in range(browser_phones)]
    n_light = phones - browser_phones
    quiz = load_quiz().questions[0]
    n_choices = len(quiz.choices)
    load_before = os.getloadavg()[0]
    srv = ClassServer.start(DEFAULT_SWITCHES)
    light = LightPhones(srv.url, srv.join_code, n_light, min(asking, n_light), deadline_s)
    seen: dict = {"phone_errors": [], "phone_answers": [], "asked_labels": []}
    try:
        with teacher_page(srv, tmp / "streamlit.log", browser) as (teacher, browser):
            page = teacher.page
            r = httpx.post(f"{srv.url}/v1/servelab/votes/open", headers=srv.headers,
                           json={"quiz": quiz.id, "seconds": deadline_s}, timeout=10)
            r.raise_for_status()
            seen["round_drawn"] = wait_count(page, 0, 120) is not None
            light.thread.start()
            # the real phones: page shown, then the round's choices drawn
            shown, round_shown, real, contexts = [], [], [], []
            for locale in locales:
                ctx = browser.new_context(viewport=PHONE, is_mobile=True, locale=locale)
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
                seen["asked_labels"].append((locale, p.inner_text("#ask")))
                real.append((p, errors))
            # the real phones ask too (a question each, answered while the class votes)
            for i, (p, _) in enumerate(real):
                p.fill("#nick", "小明" if i % 2 == 0 else f"phone{i}")
                p.fill("#q", "为什么分页注意力能减少显存浪费？请简短回答。" if i % 2 == 0
                       else "Why does paged attention waste less memory? Briefly.")
                p.click("#ask")
            end = time.monotonic() + 120
            while None in light.pids and time.monotonic() < end and not light.errors:
                time.sleep(0.2)
            seen["light_joined"] = n_light - light.pids.count(None)
            redraw_live, redraw_votes, latencies, missed = [], [], [], []
            voters = [("phone", p) for p, _ in real] + [
                ("light", pid) for pid in light.pids[:timed_light] if pid]
            count, all_in_s = 0, None
            with httpx.Client(base_url=srv.url, timeout=10) as c:
                for k, (kind, who) in enumerate(voters):  # one at a time, until counted
                    time.sleep(0.3 + 0.37 * (k % 3))  # not in step with the 0.5 s redraw
                    live, votes = redraw_times(page)
                    redraw_live += live
                    redraw_votes += votes
                    t0 = time.perf_counter()
                    if kind == "phone":
                        who.locator("#vp-choices button").nth(k % n_choices).click()
                    else:
                        r = c.post("/class/vote", params={"lang": "en"}, json={
                            "round": current_round(srv), "choice": k % n_choices},
                            headers={"Authorization": f"Bearer {srv.join_code}",
                                     "X-Phone": who})
                        r.raise_for_status()
                    count += 1
                    if wait_count(page, count, 10) is None:
                        missed.append(count)
                    latencies.append(time.perf_counter() - t0)
                rid, t0 = current_round(srv), time.perf_counter()
                for k, pid in enumerate(light.pids[timed_light:]):  # the rest at once
                    if pid:
                        c.post("/class/vote", json={"round": rid, "choice": k % 2},
                               headers={"Authorization": f"Bearer {srv.join_code}",
                                        "X-Phone": pid}).raise_for_status()
                if wait_count(page, phones, 20) is not None:
                    all_in_s = time.perf_counter() - t0
                seen["projector_count"] = projector_count(page)
            for _ in range(10):  # the redraw lines while the answers still stream
                live, votes = redraw_times(page)
                redraw_live += live
                redraw_votes += votes
                if len(light.answers) >= light.asking and all(
                        p.evaluate(RATE_SHOWN_JS) for p, _ in real):
                    break  # every answer is done: nothing streams any more
                time.sleep(0.7)
            light.stop.set()
            for p, errors in real:  # the real phones show their figures when done
                with contextlib.suppress(Exception):
                    p.wait_for_function(RATE_SHOWN_JS, timeout=240_000)
                seen["phone_answers"].append(p.inner_text("#answer").strip())
                seen["phone_errors"] += errors
            light.thread.join(240)
            seen["page_exceptions"] = teacher.exceptions()
            for ctx in contexts:
                ctx.close()
        state = httpx.get(f"{srv.url}/v1/servelab/votes/state", headers=srv.headers,
                          timeout=10).json()
    finally:
        light.stop.set()
        srv.stop()
    ttfts = [a["ttft_s"] for a in light.answers if a["ttft_s"] is not None]
    figures = {
        "load_average_1min_before": round(load_before, 2),
        "load_average_1min_after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "phones": phones, "chromium_phones": len(locales),
        "page_shown_s": [round(x, 3) for x in shown],
        "round_shown_s": [round(x, 3) for x in round_shown],
        "vote_to_count_s_median": round(statistics.median(latencies), 3),
        "vote_to_count_s_max": round(max(latencies), 3), "votes_timed": len(latencies),
        f"last_{phones - len(voters)}_votes_to_count_s": all_in_s and round(all_in_s, 3),
        "redraw_ms_median": statistics.median(redraw_live) if redraw_live else None,
        "redraw_ms_max": max(redraw_live, default=None), "redraws": len(redraw_live),
        "vote_panel_drawn_ms_median": statistics.median(redraw_votes) if redraw_votes
        else None, "light_polls": light.polls,
        "light_ttft_s_median": statistics.median(ttfts) if ttfts else None}
    figures["goals_met"] = {
        "page_shown_s": max(shown) < VOTES_GOALS["page_shown_s"],
        "vote_to_count_s": figures["vote_to_count_s_median"] < VOTES_GOALS["vote_to_count_s"],
        "redraw_ms": figures["redraw_ms_median"] is not None
        and figures["redraw_ms_median"] < VOTES_GOALS["redraw_ms"]}
    return {**seen, "phones": phones, "light_errors": light.errors,
            "light_answers": light.answers, "asking": min(asking, n_light),
            "votes_missed": missed, "all_in_s": all_in_s, "state": state,
            "redraw_live": redraw_live, "redraw_votes": redraw_votes, "figures": figures}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.classroom", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=("load", "votes"))
    ap.add_argument("--users", type=int, default=1000, help="load: simulated users")
    ap.add_argument("--students", type=int, default=30, help="load: students asking")
    ap.add_argument("--questions", type=int, default=2, help="load: questions per student")
    ap.add_argument("--phones", type=int, default=60, help="votes: phones in the class")
    ap.add_argument("--json", type=Path, default=None,
                    help="where the figures go (default build/classroom-SCENARIO.json)")
    args = ap.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        if args.scenario == "load":
            seen = run_load(args.users, args.students, args.questions, Path(tmp))
        else:
            seen = run_votes(args.phones, Path(tmp))
    out = args.json or ROOT / "build" / f"classroom-{args.scenario}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(seen["figures"], indent=1))
    print(json.dumps(seen["figures"], indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
