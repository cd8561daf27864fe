"""The dashboard: the gauges of the sidebar's engine now, and their history over the steps.

Tokens/s, TTFT, TPOT, ITL, seats busy, KV used, acceptance rate and tokens per target pass,
measured by the engine on this machine (latencies on the engine's clock: pauses between
clicks do not count). With speculation on, the same workload also runs without it, stepped
together, and the page shows the measured speedup.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.classplan import page_variants  # noqa: E402
from app.components.charts import gauge_history_chart  # noqa: E402
from app.components.gauges import GAUGES, gauge_values, summary  # noqa: E402
from app.components.lesson import describe_switches  # noqa: E402
from app.i18n import t  # noqa: E402
from app.live import live_page, runs_for, step_header  # noqa: E402
from app.state import Run, Session  # noqa: E402


def speedup_line(run: Run, base: Run) -> None:
    """Tokens/s with speculation ÷ without, on the same workload stepped together."""
    on, off = summary(run.history), summary(base.history)
    ratio = on["tokens_per_s"] / off["tokens_per_s"] if on["tokens_per_s"] and off[
        "tokens_per_s"] else None
    st.metric(t("spec.speedup_now"), "—" if ratio is None else f"×{ratio:.2f}",
              help=t("spec.speedup_now.help", a=on["tokens_per_s"], b=off["tokens_per_s"]),
              border=True)


def draw(session: Session) -> list[Run]:
    s = session.settings
    runs = runs_for(session, page_variants("dashboard", s))
    run = runs[0]
    step_header(runs)
    st.caption(describe_switches({"batching": s.batching, "kv_layout": s.kv_layout,
                                  "spec": s.spec}))
    values = gauge_values(run.history)
    for row in (values[:4], values[4:]):
        for col, g in zip(st.columns(4), row):
            col.metric(g["label"], g["value"], help=g["help"], border=True)
    if len(runs) > 1:
        speedup_line(run, runs[1])
    if not run.history:
        st.info(t("live.press_step", n=len(run.names)))
        return runs
    cols = st.columns(4)
    for i, key in enumerate(GAUGES):  # titles as text: four charts a row are narrow
        cols[i % 4].markdown(f"**{t(f'gauge.{key}')}**")
        cols[i % 4].altair_chart(gauge_history_chart(run.history, key, titled=False),
                                 width="stretch")
    return runs


live_page("dashboard", draw)
