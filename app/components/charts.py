"""Every altair chart of the app, as pure functions from data to a chart.

One charting library for the whole app (altair); large fonts for a classroom projector.
Streamlit fits a chart into its `height` with the title and the axes included, so the
heights here are whole-chart heights.
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.components.gauges import GAUGES, history_frame
from app.i18n import t

FONT = 15
STEP_AXIS = alt.Axis(tickMinStep=1, format="d")  # steps are whole numbers


def _style(chart: alt.Chart) -> alt.Chart:
    return chart.configure_axis(labelFontSize=FONT, titleFontSize=FONT).configure_legend(
        labelFontSize=FONT, titleFontSize=FONT).configure_title(fontSize=FONT + 2)


def gauge_history_chart(history: list[dict], key: str, height: int = 280,
                        titled: bool = True) -> alt.Chart:
    """One gauge over the steps (a line; gaps where it is not defined yet). `titled=False`
    leaves the title to the page: in a narrow column vega cuts a title ("吞吐（to…"),
    where the page's text wraps."""
    df = history_frame(history)[["step", key]].rename(columns={key: "value"})
    fmt = ".0%" if key in ("seats_busy", "kv_used", "acceptance") else ",.1f"
    title = t(f"gauge.{key}") if titled else ""
    chart = alt.Chart(df, title=title).mark_line(point=True, strokeWidth=3).encode(
        x=alt.X("step:Q", title=t("seats.axis_step"), axis=STEP_AXIS),
        y=alt.Y("value:Q", title=None, axis=alt.Axis(format=fmt)),
        tooltip=[alt.Tooltip("step:Q"), alt.Tooltip("value:Q", format=fmt)],
    ).properties(height=height)
    return _style(chart)


def compare_chart(histories: dict[str, list[dict]], key: str, height: int = 320) -> alt.Chart:
    """One gauge over the steps for several runs (one line each): the side-by-side pages."""
    frames = []
    for label, history in histories.items():
        df = history_frame(history)[["step", key]].rename(columns={key: "value"})
        df["run"] = label
        frames.append(df)
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["step", "value", "run"])
    fmt = ".0%" if key in ("seats_busy", "kv_used", "acceptance") else ",.1f"
    chart = alt.Chart(df, title=t(f"gauge.{key}")).mark_line(point=True, strokeWidth=3).encode(
        x=alt.X("step:Q", title=t("seats.axis_step"), axis=STEP_AXIS),
        y=alt.Y("value:Q", title=None, axis=alt.Axis(format=fmt)),
        color=alt.Color("run:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=["run:N", "step:Q", alt.Tooltip("value:Q", format=fmt)],
    ).properties(height=height)
    return _style(chart)


def forward_cost_chart(rows: list[dict]) -> alt.Chart:
    """Measured time of one target forward pass over n new tokens, and relative to n = 1."""
    df = pd.DataFrame(rows)
    base = float(df.loc[df["tokens"].idxmin(), "ms"])
    df["relative"] = df["ms"] / base
    bars = alt.Chart(df, title=t("spec.fwd_title")).mark_bar(color="#1f6fd1").encode(
        x=alt.X("tokens:O", title=t("spec.fwd_tokens")),
        y=alt.Y("ms:Q", title=t("spec.fwd_ms")),
        tooltip=["tokens:O", alt.Tooltip("ms:Q", format=".1f"),
                 alt.Tooltip("relative:Q", format=".2f")],
    )
    text = bars.mark_text(dy=-10, fontSize=FONT).encode(
        text=alt.Text("relative:Q", format=".2f"))
    return _style((bars + text).properties(height=380))


def speedup_chart(results: list[dict]) -> alt.Chart:
    """Speculation's measured speedup against the number of concurrent requests."""
    df = pd.DataFrame(results)
    # the legend below the lines: method names like "eagle+lookup+adaptive · grounded" are long
    color = (alt.Color("method:N", title=None,
                       legend=alt.Legend(orient="bottom", columns=1, labelLimit=0))
             if "method" in df else alt.value("#1f6fd1"))
    line = alt.Chart(df, title=t("spec.speedup_title")).mark_line(point=True, strokeWidth=3)
    rule = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[6, 4]).encode(y="y:Q")
    chart = line.encode(
        x=alt.X("concurrency:Q", title=t("spec.concurrency"), scale=alt.Scale(type="log", base=2)),
        y=alt.Y("speedup:Q", title=t("spec.speedup")),
        color=color,
        tooltip=[c for c in ("method", "concurrency", "speedup") if c in df],
    )
    legend_rows = df["method"].nunique() if "method" in df else 0
    return _style((chart + rule).properties(height=320 + 26 * legend_rows))


def adaptive_k_chart(estimates: list[dict], chosen: int) -> alt.Chart:
    """Adaptive k: the tokens per second the engine expects from each k this step, the chosen
    k in blue (estimates: the StepReport's spec_plan["estimates"])."""
    df = pd.DataFrame([{"k": e["k"], "tokens_per_s": e["tokens_per_s"] or 0.0,
                        "tokens": e["tokens_per_request"], "ms": e["step_ms"],
                        "chosen": e["k"] == chosen} for e in estimates])
    bars = alt.Chart(df, title=t("spec.adaptive_title")).mark_bar().encode(
        x=alt.X("k:O", title="k", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("tokens_per_s:Q", title=t("spec.adaptive_y")),
        color=alt.condition(alt.datum.chosen, alt.value("#1f6fd1"), alt.value("#bbbbbb")),
        tooltip=[alt.Tooltip("k:O"), alt.Tooltip("tokens_per_s:Q", format=".1f"),
                 alt.Tooltip("tokens:Q", format=".2f"), alt.Tooltip("ms:Q", format=".1f")],
    )
    return _style(bars.properties(height=300))


def k_history_chart(rows: list[dict]) -> alt.Chart:
    """Adaptive k over the run: the k each step drafted with (rows: step, k, explored)."""
    df = pd.DataFrame(rows)
    line = alt.Chart(df, title=t("spec.k_history_title")).mark_line(
        interpolate="step-after", color="#1f6fd1").encode(
        x=alt.X("step:Q", title=t("spec.step_axis")), y=alt.Y("k:Q", title="k"))
    dots = alt.Chart(df[df["explored"]]).mark_point(color="#ff7f0e", filled=True).encode(
        x="step:Q", y="k:Q", tooltip=["step:Q", "k:Q"])
    return _style((line + dots).properties(height=300))


def lossless_chart(df: pd.DataFrame) -> alt.Chart:
    """Grouped bars per candidate token: the target's probability and two sampled frequencies.

    df columns: token (display text), series (translated label), value (probability).
    """
    chart = alt.Chart(df, title=t("spec.lossless_title")).mark_bar().encode(
        x=alt.X("token:N", title=None, sort=None, axis=alt.Axis(labelAngle=0)),
        xOffset="series:N",
        y=alt.Y("value:Q", title=t("spec.probability"), axis=alt.Axis(format=".0%")),
        color=alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom"),
                        scale=alt.Scale(range=["#444444", "#ff7f0e", "#1f6fd1"])),
        tooltip=["token:N", "series:N", alt.Tooltip("value:Q", format=".3f")],
    ).properties(height=420)
    return _style(chart)


def race_chart(rows: list[dict]) -> alt.Chart:
    """Measured output tokens/s of the naive server (grey) and the engine (green), in the
    order given."""
    df = pd.DataFrame(rows)
    bars = alt.Chart(df).mark_bar(size=60).encode(
        x=alt.X("system:N", title=None, sort=None, axis=alt.Axis(labelAngle=0)),
        y=alt.Y("tokens_per_s:Q", title=t("gauge.tokens_per_s")),
        color=alt.Color("system:N", legend=None,
                        scale=alt.Scale(domain=list(df["system"]),
                                        range=["#9a9a9a", "#2e9e4f"])),
        tooltip=["system:N", alt.Tooltip("tokens_per_s:Q", format=".1f")],
    )
    text = bars.mark_text(dy=-12, fontSize=FONT + 3).encode(
        text=alt.Text("tokens_per_s:Q", format=".1f"))
    return _style((bars + text).properties(height=360))


__all__ = ["GAUGES", "compare_chart", "forward_cost_chart", "gauge_history_chart",
           "lossless_chart", "race_chart", "speedup_chart"]
