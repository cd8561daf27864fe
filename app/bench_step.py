"""`python -m app.bench_step`: how long one Step takes in the classroom app, on this machine.

A Step is the engine's step (the default session: 8 seats, the long-tail workload, continuous
batching over a paged KV cache) plus the redraw: the components a live page builds from the
new StepReport (seats and queue HTML, the KV map, the seat timeline, the six gauges and their
charts, serialised as Streamlit sends them). Both are timed over a whole run, step by step.
With `--apptest` the script also times the full Streamlit rerun a Step click causes
(AppTest: the shell, the sidebar and the dashboard page; no browser painting).
The goal is < 300 ms per Step on a 2-core CPU. Like app/main.py, this sets
OMP_WAIT_POLICY=PASSIVE unless the environment says otherwise: on a 2-core machine shared
with busy processes, spinning OpenMP threads made a Step ~15x slower. Compare with
`OMP_WAIT_POLICY=ACTIVE python -m app.bench_step` and `--threads 1`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads, as app/main.py

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.components import charts, gauges, kvmap, seats  # noqa: E402
from app.state import Session, Settings  # noqa: E402


def redraw(history: list[dict]) -> None:
    """What the batching, paging and dashboard pages build from a run's history."""
    last = history[-1]
    seats.seats_html(last)
    seats.queue_html(last)
    seats.timeline_chart(history).to_dict()
    kvmap.kv_grid_html(last["kv"])
    kvmap.kv_stats(last["kv"])
    gauges.gauge_values(history)
    for key in gauges.GAUGES:
        charts.gauge_history_chart(history, key).to_dict()


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def bench_session(settings: Settings) -> dict:
    session = Session(settings=settings)
    run = session.primary  # builds the engine (not timed)
    engine_ms, redraw_ms = [], []
    while not run.done:
        t0 = time.perf_counter()
        session.step()
        session.run()
        t1 = time.perf_counter()
        redraw(run.history)
        t2 = time.perf_counter()
        engine_ms.append(1000 * (t1 - t0))
        redraw_ms.append(1000 * (t2 - t1))
    total = [a + b for a, b in zip(engine_ms, redraw_ms)]
    return {"steps": len(total), "device": run.engine.describe(),
            "engine": engine_ms, "redraw": redraw_ms, "total": total}


def bench_apptest(steps: int) -> list[float]:
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app/main.py"), default_timeout=300)
    at.session_state["lang"] = "en"
    at.run()
    at.switch_page("pages/dashboard.py").run()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        at.button(key="ctl_step").click().run()
        times.append(1000 * (time.perf_counter() - t0))
        assert not at.exception, at.exception[0].value
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seats", type=int, default=8)
    ap.add_argument("--apptest", type=int, default=0, metavar="N",
                    help="also time N Step clicks through AppTest (the whole rerun)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    res = bench_session(Settings(seats=args.seats))
    print(f"{res['device']}, torch threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, {args.seats} seats, "
          f"{res['steps']} steps of the default workload")
    print(f"{'':8}{'median':>9}{'p90':>9}{'max':>9}   (ms)")
    for key in ("engine", "redraw", "total"):
        v = res[key]
        print(f"{key:8}{statistics.median(v):9.1f}{pct(v, 0.9):9.1f}{max(v):9.1f}")
    if args.apptest:
        v = bench_apptest(args.apptest)
        print(f"{'apptest':8}{statistics.median(v):9.1f}{pct(v, 0.9):9.1f}{max(v):9.1f}"
              f"   (a whole Streamlit rerun per Step click, dashboard page)")
    ok = statistics.median(res["total"]) < 300
    print(f"goal: median Step < 300 ms -> {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
