"""The projector's view of a server with no step stream: what its /metrics tell (running,
waiting, KV-cache usage, the TTFT and inter-token-latency histograms), read with
app/remote_metrics.py. Used by the Classroom page when the class server is a vLLM or SGLang
deployment (or `engine.serve --no-step-stream`)."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd
import streamlit as st

from app.i18n import STRINGS, t
from app.remote_metrics import Histogram, MetricsError, MetricsSnapshot, fetch_metrics

PREV_KEY = "_metrics_panel_prev"

STRINGS.update({
    "mp.header": {"zh": "服务器指标（没有逐步数据流：读 /metrics）",
                  "en": "The server's metrics (no step stream: reading /metrics)"},
    "mp.running": {"zh": "运行中", "en": "Running"},
    "mp.waiting": {"zh": "等待中", "en": "Waiting"},
    "mp.kv": {"zh": "KV 缓存占用", "en": "KV cache used"},
    "mp.tok_s": {"zh": "输出 token/秒", "en": "Output tok/s"},
    "mp.ttft": {"zh": "首 token 延迟（TTFT）", "en": "Time to first token (TTFT)"},
    "mp.itl": {"zh": "token 间延迟（ITL）", "en": "Inter-token latency (ITL)"},
    "mp.p50_p99": {"zh": "p50 {p50} · p99 {p99} · {n} 次", "en": "p50 {p50} · p99 {p99} · {n} observed"},
    "mp.none": {"zh": "还没有观测值", "en": "nothing observed yet"},
    "mp.bucket": {"zh": "区间（秒）", "en": "bucket (s)"},
    "mp.count": {"zh": "次数", "en": "count"},
    "mp.error": {"zh": "读不到服务器的指标：{msg}", "en": "Cannot read the server's metrics: {msg}"},
    "mp.models": {"zh": "模型：{models}", "en": "Model: {models}"},
    "mp.why": {"zh": "这些是服务器自己报告的汇总数字：看不到座位、KV 块或某个人的请求，"
                     "只能看到排队、占用和延迟分布。",
               "en": "These are the server's own totals: no seats, KV blocks or anyone's "
                     "request, only the queue, the usage and the latency distributions."},
})


def _secs(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def quantile_line(h: Histogram | None) -> str:
    if h is None or not h.count:
        return t("mp.none")
    return t("mp.p50_p99", p50=_secs(h.quantile(0.5)), p99=_secs(h.quantile(0.99)),
             n=int(h.count))


def histogram_chart(h: Histogram) -> alt.Chart:
    """Bars per bucket, the buckets' upper bounds as labels, in bucket order."""
    rows = [{"bucket": "≤ " + ("∞" if math.isinf(b["hi"]) else f"{b['hi']:g}"),
             "order": i, "count": b["count"]} for i, b in enumerate(h.bars())]
    df = pd.DataFrame(rows)
    return alt.Chart(df).mark_bar().encode(
        x=alt.X("bucket:N", sort=alt.SortField("order"), title=t("mp.bucket")),
        y=alt.Y("count:Q", title=t("mp.count")), tooltip=["bucket", "count"]).properties(
        height=200)


def metrics_panel(snap: MetricsSnapshot, prev: MetricsSnapshot | None = None) -> None:
    """Draw one read: the gauges, then the two histograms (all since the server started)."""
    st.subheader(t("mp.header"))
    st.caption(t("mp.why"))
    if snap.models:
        st.caption(t("mp.models", models=", ".join(snap.models)))
    cols = st.columns(4)
    cols[0].metric(t("mp.running"), "–" if snap.running is None else f"{snap.running:.0f}",
                   border=True)
    cols[1].metric(t("mp.waiting"), "–" if snap.waiting is None else f"{snap.waiting:.0f}",
                   border=True)
    cols[2].metric(t("mp.kv"), "–" if snap.kv_usage is None else f"{100 * snap.kv_usage:.0f}%",
                   border=True)
    rate = snap.tokens_per_s(prev)
    cols[3].metric(t("mp.tok_s"), "–" if rate is None else f"{rate:.1f}", border=True)
    left, right = st.columns(2)
    for col, key, h in ((left, "mp.ttft", snap.ttft), (right, "mp.itl", snap.itl)):
        with col:
            st.markdown(f"**{t(key)}**")
            st.caption(quantile_line(h))
            if h is not None and h.count:
                st.altair_chart(histogram_chart(h), width="stretch")


def server_metrics_view(url: str, headers: dict | None = None) -> MetricsSnapshot | None:
    """Read `url`/metrics now and draw it; an unreadable server is an error line, not a
    traceback. The previous read (kept in the session) gives the output rate."""
    key = (headers or {}).get("Authorization", "").removeprefix("Bearer ") or None
    try:
        snap = fetch_metrics(url, key, timeout=3.0)
    except MetricsError as exc:
        st.error(t("mp.error", msg=str(exc)))
        return None
    prev = st.session_state.get(PREV_KEY)
    metrics_panel(snap, prev if isinstance(prev, MetricsSnapshot) else None)
    st.session_state[PREV_KEY] = snap
    return snap
