"""The dashboard: the six gauges of the sidebar's engine now, and their history over the steps.

Tokens/s, TTFT, TPOT, seats busy, KV used and acceptance rate, measured by the engine on
this machine (latencies on the engine's clock: pauses between clicks do not count).
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.components.charts import gauge_history_chart  # noqa: E402
from app.components.gauges import GAUGES, gauge_values  # noqa: E402
from app.components.lesson import describe_switches  # noqa: E402
from app.i18n import t  # noqa: E402
from app.live import live_page, runs_for, step_header  # noqa: E402
from app.state import Run, Session  # noqa: E402


def draw(session: Session) -> list[Run]:
    s = session.settings
    run = runs_for(session, [s])[0]
    step_header([run])
    st.caption(describe_switches({"batching": s.batching, "kv_layout": s.kv_layout,
                                  "spec": s.spec}))
    values = gauge_values(run.history)
    for row in (values[:3], values[3:]):
        for col, g in zip(st.columns(3), row):
            col.metric(g["label"], g["value"], help=g["help"], border=True)
    if not run.history:
        st.info(t("live.press_step", n=len(run.names)))
        return [run]
    cols = st.columns(3)
    for i, key in enumerate(GAUGES):
        cols[i % 3].altair_chart(gauge_history_chart(run.history, key), width="stretch")
    return [run]


live_page("dashboard", draw)
