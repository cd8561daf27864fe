"""The "beyond" page's four charts, as pure functions from app/beyond_calc.py's results to
altair charts (the page draws them; labels come from app/i18n.py)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from app.components.charts import FONT, _style
from app.i18n import t

KEPT, RESIDUAL, TARGET, DRAFT = "#2e7d32", "#c62828", "#1565c0", "#ef6c00"


def _token_label(text: str) -> str:
    """A token as a bar label: a leading space shown as ␣, newlines as ⏎, never empty."""
    return (text.replace("\n", "⏎").replace(" ", "␣", 1) if text.startswith(" ")
            else text.replace("\n", "⏎")) or "∅"


def acceptance_charts(tokens: list[str], p, q, res) -> tuple[alt.Chart, alt.Chart]:
    """Left: p and q side by side per token. Right: p split into min(p, q) (kept) and
    (p − q)⁺ (the mass a rejection hands out again), next to the normalised residual."""
    labels = [f"{i + 1}. {_token_label(x)}" for i, x in enumerate(tokens)]
    order = labels
    p, q, res = [float(x) for x in p], [float(x) for x in q], [float(x) for x in res]
    pq = pd.DataFrame(
        [{"token": lab, "who": t("beyond.acc.target"), "prob": a} for lab, a in zip(labels, p)]
        + [{"token": lab, "who": t("beyond.acc.draft"), "prob": b} for lab, b in zip(labels, q)])
    left = alt.Chart(pq, title=t("beyond.acc.left_title")).mark_bar().encode(
        x=alt.X("token:N", sort=order, title=None,
                  axis=alt.Axis(labelAngle=-40, labelOverlap=False, labelLimit=160)),
        xOffset=alt.XOffset("who:N", sort=[t("beyond.acc.target"), t("beyond.acc.draft")]),
        y=alt.Y("prob:Q", title=t("beyond.acc.prob")),
        color=alt.Color("who:N", title=None, sort=[t("beyond.acc.target"), t("beyond.acc.draft")],
                        scale=alt.Scale(range=[TARGET, DRAFT]),
                        legend=alt.Legend(orient="top", labelLimit=400)),
        tooltip=["token:N", "who:N", alt.Tooltip("prob:Q", format=".4f")],
    ).properties(height=320)
    split = pd.DataFrame(
        [{"token": lab, "part": t("beyond.acc.kept"), "prob": min(a, b), "o": 0}
         for lab, a, b in zip(labels, p, q)]
        + [{"token": lab, "part": t("beyond.acc.excess"), "prob": max(a - b, 0.0), "o": 1}
           for lab, a, b in zip(labels, p, q)]
        + [{"token": lab, "part": t("beyond.acc.residual"), "prob": r, "o": 2}
           for lab, r in zip(labels, res)])
    split["stack"] = [t("beyond.acc.residual") if o == 2 else t("beyond.acc.target")
                      for o in split["o"]]
    parts = [t("beyond.acc.kept"), t("beyond.acc.excess"), t("beyond.acc.residual")]
    right = alt.Chart(split, title=t("beyond.acc.right_title")).mark_bar().encode(
        x=alt.X("token:N", sort=order, title=None,
                  axis=alt.Axis(labelAngle=-40, labelOverlap=False, labelLimit=160)),
        xOffset=alt.XOffset("stack:N", sort=[t("beyond.acc.target"), t("beyond.acc.residual")]),
        y=alt.Y("prob:Q", title=t("beyond.acc.prob"), stack="zero"),
        order=alt.Order("o:Q"),
        color=alt.Color("part:N", title=None, sort=parts,
                        scale=alt.Scale(domain=parts, range=[KEPT, RESIDUAL, "#f4a3a3"]),
                        legend=alt.Legend(orient="top", labelLimit=400)),
        tooltip=["token:N", "part:N", alt.Tooltip("prob:Q", format=".4f")],
    ).properties(height=320)
    return _style(left), _style(right)


def roofline_charts(rows: list[dict], crossover: float | None) -> tuple[alt.Chart, alt.Chart]:
    """Left: decode and verify step time against batch (log-log), marked by what bounds
    them, with the decode crossover as a rule. Right: speculation's speedup against batch."""
    decode, verify = t("beyond.roof.decode"), t("beyond.roof.verify")
    mem, comp = t("beyond.roof.memory"), t("beyond.roof.compute")
    df = pd.DataFrame(
        [{"batch": r["batch"], "step": decode, "ms": r["decode_ms"],
          "bound": mem if r["decode_bound"] == "memory" else comp} for r in rows]
        + [{"batch": r["batch"], "step": verify, "ms": r["verify_ms"],
            "bound": mem if r["verify_bound"] == "memory" else comp} for r in rows])
    base = alt.Chart(df)
    x = alt.X("batch:Q", scale=alt.Scale(type="log", base=2), title=t("beyond.roof.batch"))
    lines = base.mark_line().encode(
        x=x, y=alt.Y("ms:Q", scale=alt.Scale(type="log"), title=t("beyond.roof.ms")),
        color=alt.Color("step:N", title=None,
                        legend=alt.Legend(orient="top", labelLimit=400)))
    points = base.mark_point(size=90, filled=True).encode(
        x=x, y="ms:Q", color="step:N",
        shape=alt.Shape("bound:N", title=None, sort=[mem, comp],
                        legend=alt.Legend(orient="top", labelLimit=400)),
        tooltip=["batch:Q", "step:N", alt.Tooltip("ms:Q", format=".2f"), "bound:N"])
    layers = [lines, points]
    if crossover is not None:
        layers.append(alt.Chart(pd.DataFrame({"batch": [crossover]})).mark_rule(
            strokeDash=[6, 4], color="#555").encode(x="batch:Q"))
    left = alt.layer(*layers, title=t("beyond.roof.left_title")).properties(height=320)
    sp = pd.DataFrame([{"batch": r["batch"], "speedup": r["speedup"]} for r in rows])
    right = alt.layer(
        alt.Chart(sp).mark_line(point=True, color=KEPT).encode(
            x=alt.X("batch:Q", scale=alt.Scale(type="log", base=2), title=t("beyond.roof.batch")),
            y=alt.Y("speedup:Q", title=t("beyond.roof.speedup")),
            tooltip=["batch:Q", alt.Tooltip("speedup:Q", format=".2f")]),
        alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="#555", strokeDash=[4, 4])
        .encode(y="y:Q"),
        title=t("beyond.roof.right_title")).properties(height=320)
    return _style(left), _style(right)


def timeline_chart(lines: dict[str, dict]) -> alt.Chart:
    """One row per run: the wait to the first token as a bar (TTFT), then a dot per step that
    gave the request tokens, sized and labelled by how many (a burst when a draft was kept)."""
    spans, dots = [], []
    for name, tl in lines.items():
        spans.append({"run": name, "start": tl["arrive"], "end": tl["arrivals"][0]["t"],
                      "what": t("beyond.tl.ttft")})
        for a in tl["arrivals"]:
            dots.append({"run": name, "t": a["t"], "tokens": a["tokens"],
                         "label": str(a["tokens"]) if a["tokens"] > 1 else ""})
    order = list(lines)
    y = alt.Y("run:N", sort=order, title=None, axis=alt.Axis(labelLimit=400))
    bar = alt.Chart(pd.DataFrame(spans)).mark_bar(height=10, color="#9e9e9e").encode(
        x=alt.X("start:Q", title=t("beyond.tl.seconds")), x2="end:Q", y=y,
        tooltip=["run:N", alt.Tooltip("start:Q", format=".2f"), alt.Tooltip("end:Q", format=".2f")])
    ddf = pd.DataFrame(dots)
    pts = alt.Chart(ddf).mark_circle(opacity=0.8).encode(
        x="t:Q", y=y,
        size=alt.Size("tokens:Q", scale=alt.Scale(range=[40, 500]), legend=None),
        color=alt.Color("run:N", sort=order, legend=None),
        tooltip=["run:N", alt.Tooltip("t:Q", format=".3f"), "tokens:Q"])
    text = alt.Chart(ddf).mark_text(dy=-16, fontSize=FONT - 2).encode(x="t:Q", y=y, text="label:N")
    return _style(alt.layer(bar, pts, text).properties(height=220))


def blocks_chart(snaps: list[dict]) -> alt.Chart:
    """One row per moment of the request's life, one cell per logical block: its physical
    block and reference count, coloured by what just happened to it."""
    marks = ["new", "prefix", "shared", "copied", "held", "freed", "recomputed"]
    names = {m: t(f"beyond.blk.mark.{m}") for m in marks}
    events = [t(f"beyond.blk.event.{s['event']}") for s in snaps]
    rows = [{"event": ev, "logical": b["logical"], "what": names[b["mark"]],
             "cell": f"#{b['physical']} ×{b['refs']}"}
            for ev, s in zip(events, snaps) for b in s["blocks"]]
    df = pd.DataFrame(rows)
    y = alt.Y("event:N", sort=events, title=None)
    x = alt.X("logical:O", title=t("beyond.blk.logical"), axis=alt.Axis(labelAngle=0))
    cells = alt.Chart(df).mark_rect(stroke="white", strokeWidth=2).encode(
        x=x, y=y,
        color=alt.Color("what:N", title=None, sort=[names[m] for m in marks],
                        scale=alt.Scale(domain=[names[m] for m in marks],
                                        range=["#64b5f6", "#81c784", "#ce93d8", "#ffb74d",
                                               "#cfd8dc", "#f5f5f5", "#e57373"]),
                        legend=alt.Legend(orient="bottom", columns=4, labelLimit=400)),
        tooltip=["event:N", "logical:O", "what:N", "cell:N"])
    text = alt.Chart(df).mark_text(fontSize=FONT - 1, color="black").encode(x=x, y=y, text="cell:N")
    return _style(alt.layer(cells, text).properties(height=60 * len(snaps)))
