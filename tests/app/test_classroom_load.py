"""The bounded class load test: 30 students and 1,000 simulated users on one class server, with
the teacher's page open in chromium the whole time.

The test starts the class server itself (`ClassServer.start`, so it holds the admin key) and
hands it to the app through server-side configuration (`SERVELAB_CLASS_*`), so the teacher
connects with the page's "Connect to" button. The teacher adds 1,000 simulated users with the
page's own button (short answers: `benchmarks.load --max-tokens-scale 0.25`); meanwhile 30
students each ask two questions through `POST /class/ask`, the route the students' page
streams from. All are served, no block is leaked (the server's own gauges, read with the
admin key), and the teacher's page keeps redrawing: its "redrawn in N ms · K steps received"
line moves on through the run. The measured redraw times and the students' first-token times
are written to build/classroom-load.json (docs/performance.md quotes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import statistics
import threading
import time

import pytest

from classroom.client import DEFAULT_SWITCHES, ClassServer
from tests.app.test_browser import CHROMIUM, ROOT, Tab

pytestmark = [pytest.mark.browser, pytest.mark.slow]
STUDENTS, QUESTIONS_EACH, SIMULATED = 30, 2, 1000
OUT = ROOT / "build" / "classroom-load.json"


@contextlib.contextmanager
def streamlit_with(env: dict, log_path):
    from app.streamlit_run import streamlit_server

    with streamlit_server("app/main.py", env=env, log_path=log_path) as (url, _proc):
        yield url


async def student(client, i: int, join_code: str, out: list) -> None:
    """One student: two questions, the second after the page's rate limit allows it. Like the
    students' page, it first gets its phone token (the class's limits count by it)."""
    auth = {"Authorization": f"Bearer {join_code}"}
    token = (await client.post("/class/token", headers=auth)).json()["phone"]
    headers = {**auth, "X-ServeLab-Phone": token}
    for k in range(QUESTIONS_EACH):
        sent, first, done = time.perf_counter(), None, None
        async with client.stream("POST", "/class/ask", json={
                "nickname": f"student{i}", "question": f"Question {k}: what is {i} + {k}?"},
                headers=headers) as r:
            assert r.status_code == 200, await r.aread()
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                ev = json.loads(line[6:])
                if ev["type"] == "delta" and first is None:
                    first = time.perf_counter()
                if ev["type"] in ("done", "error"):
                    done = ev
        assert done is not None and done["type"] == "done", done
        out.append({"student": i, "ttft_s": first - sent, "tokens": done["tokens"]})
        await asyncio.sleep(3.5)  # the students' page allows a question 3 s after an answer


async def class_of_students(url: str, join_code: str, out: list) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600, connect=30)) as c:
        await asyncio.gather(*(student(c, i, join_code, out) for i in range(STUDENTS)))


def redraw_line(page) -> tuple[float, int] | None:
    loc = page.get_by_text(re.compile(r"redrawn in \d+ ms · \d+ steps received"))
    if not loc.count():
        return None
    m = re.search(r"redrawn in (\d+) ms · (\d+) steps", loc.first.inner_text())
    return float(m.group(1)), int(m.group(2))


def test_thirty_students_and_a_thousand_simulated_users(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    srv = ClassServer.start(DEFAULT_SWITCHES)
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
                users = page.get_by_label("Users", exact=True)
                users.wait_for(timeout=120_000)
                users.fill(str(SIMULATED))
                users.press("Enter")
                rate = page.get_by_label("Rate (users/s)", exact=True)
                rate.fill("50")
                rate.press("Enter")
                time.sleep(2)  # let the inputs' reruns land
                page.get_by_role("button", name=f"Add {SIMULATED} simulated users").click()
                page.get_by_text(re.compile(r"simulated users: \d+ of 1000 served")).wait_for(
                    timeout=120_000)
                answers: list[dict] = []
                students = threading.Thread(target=lambda: asyncio.run(
                    class_of_students(srv.url, srv.join_code, answers)), daemon=True)
                students.start()
                redraws, steps = [], []
                deadline = time.monotonic() + 900
                while time.monotonic() < deadline:
                    line = redraw_line(page)
                    if line is not None:
                        redraws.append(line[0])
                        steps.append(line[1])
                    if not students.is_alive() and page.locator(
                            '[data-testid="stDataFrame"]').count():
                        break  # the students are done and the load run's row is in the table
                    time.sleep(1.0)
                students.join(60)
                assert len(answers) == STUDENTS * QUESTIONS_EACH, len(answers)
                # the teacher's page redrew throughout: steps kept arriving
                assert len(steps) > 20 and steps[-1] > steps[0] + 100, steps[-10:]
                # the load run's row is in the table (its figures are checked below)
                page.locator('[data-testid="stDataFrame"]').wait_for(timeout=60_000)
                assert teacher.exceptions() == 0
        # no leaked blocks, nothing left in the server
        time.sleep(1)
        from tests.engine.server.test_steps_metrics import metric_values

        vals = metric_values(srv.get("/metrics").text)
        assert vals["vllm:kv_cache_usage_perc"] == 0
        assert vals["vllm:num_requests_running"] == 0 == vals["vllm:num_requests_waiting"]
        ok = vals["vllm:request_success_total"]
        assert ok == SIMULATED + STUDENTS * QUESTIONS_EACH, ok
        ttft = sorted(a["ttft_s"] for a in answers)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps({
            "students": STUDENTS, "questions_each": QUESTIONS_EACH, "simulated": SIMULATED,
            "redraw_ms_median": statistics.median(redraws), "redraw_ms_p90":
                sorted(redraws)[int(0.9 * (len(redraws) - 1))], "redraws": len(redraws),
            "student_ttft_s_median": statistics.median(ttft), "student_ttft_s_max": ttft[-1],
            "requests_served": ok}, indent=1))
    finally:
        srv.stop()
