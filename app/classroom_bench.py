"""`python -m app.classroom_bench`: what thirty students' phones cost the two cores, measured
both ways the students' page could be built, and a student's first token with free seats.

1. The page the class server serves itself (`GET /class`, classroom/server.py):
   the server's resident memory and CPU seconds before and after N phones (chromium contexts)
   open it and sit idle.
2. A Streamlit page with the same inputs (nickname, question, Ask), run by `streamlit run`:
   the same figures for the Streamlit server process.
3. A text page of this app (`streamlit run app/main.py`, the glossary): what a session of
   the app itself costs.
4. First token: `--seats` students ask at once on an idle class server (every one has a free
   seat), through `POST /class/ask`; the time from sending to the first streamed text.

Only the server processes are measured: chromium plays the phones. Results are printed and
written as JSON (`--json`, default build/classroom-students.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from classroom.client import DEFAULT_SWITCHES, ClassServer

ROOT = Path(__file__).resolve().parents[1]

CHROMIUM = "/usr/bin/chromium"
STREAMLIT_STUDENT_PAGE = '''
import streamlit as st
st.title("ServeLab: ask the class engine")
code = st.text_input("Join code")
nick = st.text_input("Nickname", max_chars=32)
q = st.text_area("Question", max_chars=400)
if st.button("Ask"):
    st.write("(the answer would stream here)")
'''


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phones(url: str, n: int, idle_s: float, pid: int, ready: str) -> dict:
    """Open `url` in n phone-sized contexts (each until `ready`, a CSS selector, shows: the
    page has drawn), then sit idle; the server's memory and CPU."""
    from playwright.sync_api import sync_playwright

    before_mb, before_cpu = rss_mb(pid), cpu_s(pid)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        pages = []
        t0 = time.perf_counter()
        for _ in range(n):
            ctx = b.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
            p = ctx.new_page()
            p.set_default_timeout(180_000)
            p.goto(url)
            p.wait_for_selector(ready)
            pages.append(p)
        opened_s = time.perf_counter() - t0
        opened_cpu = cpu_s(pid)
        time.sleep(idle_s)
        after_mb, after_cpu = rss_mb(pid), cpu_s(pid)
        b.close()
    return {"rss_before_mb": before_mb, "rss_after_mb": after_mb,
            "rss_delta_mb": after_mb - before_mb, "cpu_s_opening": opened_cpu - before_cpu,
            "cpu_s_idle": after_cpu - opened_cpu, "idle_s": idle_s, "open_all_s": opened_s}


async def first_tokens(url: str, join_code: str, n: int) -> list[float]:
    import httpx

    async def one(c, i):
        sent = time.perf_counter()
        async with c.stream("POST", "/class/ask", json={
                "nickname": f"s{i}", "question": f"What is {i} plus {i}?"},
                headers={"Authorization": f"Bearer {join_code}"}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["type"] == "delta":
                    return time.perf_counter() - sent
        return float("nan")

    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        return list(await asyncio.gather(*(one(c, i) for i in range(n))))


@contextlib.contextmanager
def streamlit_page(script: Path | str):
    from app.streamlit_run import streamlit_server

    with streamlit_server(script, start_timeout_s=60) as (url, proc):
        yield url, proc.pid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.classroom_bench",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--students", type=int, default=30)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds the phones sit idle")
    ap.add_argument("--seats", type=int, default=16)
    ap.add_argument("--json", default=str(ROOT / "build" / "classroom-students.json"))
    args = ap.parse_args(argv)
    if not 1 <= args.students <= 200 or args.idle <= 0:
        ap.error("--students must be 1 to 200 and --idle > 0")
    if not os.path.exists(CHROMIUM):
        ap.error(f"{CHROMIUM} is missing: apt-get install -y chromium")
    out: dict = {"students": args.students}
    srv = ClassServer.start(DEFAULT_SWITCHES, seats=args.seats)
    try:
        time.sleep(2)
        out["server_page"] = phones(f"{srv.url}/class#code={srv.join_code}", args.students,
                                    args.idle, srv.proc.pid, "#ask")
        ttft = asyncio.run(first_tokens(srv.url, srv.join_code, args.seats))
        out["first_token_free_seats"] = {"students": args.seats,
                                         "median_s": statistics.median(ttft), "max_s": max(ttft)}
    finally:
        srv.stop()
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "student_page.py"
        script.write_text(STREAMLIT_STUDENT_PAGE)
        with streamlit_page(script) as (url, pid):
            time.sleep(2)
            out["streamlit_page"] = phones(url, args.students, args.idle, pid, "textarea")
    with streamlit_page("app/main.py") as (url, pid):
        time.sleep(2)
        out["app_page"] = phones(f"{url}/glossary", args.students, args.idle, pid,
                                 "h1")
    for name in ("server_page", "streamlit_page", "app_page"):
        r = out[name]
        print(f"{name:15s} RSS {r['rss_before_mb']:.0f} -> {r['rss_after_mb']:.0f} MB "
              f"(+{r['rss_delta_mb']:.0f}), CPU {r['cpu_s_opening']:.2f} s opening "
              f"{args.students} pages, {r['cpu_s_idle']:.2f} s over {r['idle_s']:.0f} s idle")
    f = out["first_token_free_seats"]
    print(f"first token, {f['students']} students on free seats: median {f['median_s']:.2f} s, "
          f"max {f['max_s']:.2f} s")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
