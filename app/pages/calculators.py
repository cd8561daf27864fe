"""Small live calculators for the chapter's formulas (app/calculators.py): KV bytes per token
and per conversation, the bus sum, a and k -> tokens per target pass, and the roofline from
this machine's measured read bandwidth and the session engine's measured step times.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import altair as alt  # noqa: E402
import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from app.calculators import (  # noqa: E402
    SHAPES,
    ModelShape,
    bus_sum,
    kv_bytes,
    parse_lengths,
    roofline_rows,
    tokens_per_pass,
)
from app.i18n import t  # noqa: E402
from app.live import get_session, measured  # noqa: E402
from app.nav import ensure_shell  # noqa: E402


def _mb(n: float) -> str:
    return f"{n / 2**20:.2f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def kv_calculator() -> None:
    st.subheader(t("calc.kv"))
    names = [s.name for s in SHAPES]
    pick = st.selectbox(t("calc.kv.model"), names, key="calc_shape")
    base = SHAPES[names.index(pick)]
    a, b, c, d = st.columns(4)
    layers = a.number_input(t("calc.kv.layers"), 1, 200, base.layers, key=f"calc_l_{pick}")
    heads = b.number_input(t("calc.kv.heads"), 1, 256, base.kv_heads, key=f"calc_h_{pick}")
    dim = c.number_input(t("calc.kv.dim"), 1, 1024, base.head_dim, key=f"calc_d_{pick}")
    nbytes = d.selectbox(t("calc.kv.bytes"), (2, 4, 1), key="calc_bytes")
    tokens = st.slider(t("calc.kv.tokens"), 128, 32768, 2048, step=128, key="calc_tokens")
    shape = ModelShape(pick, int(layers), int(heads), int(dim))
    per_token = kv_bytes(shape, int(nbytes))
    x, y = st.columns(2)
    x.metric(t("calc.kv.per_token"), f"{per_token / 1024:.1f} KiB", border=True)
    y.metric(t("calc.kv.per_conv", n=tokens), _mb(kv_bytes(shape, int(nbytes), tokens)),
             border=True)
    st.caption(t("calc.kv.formula", l=layers, h=heads, d=dim, b=nbytes))


def bus_calculator() -> None:
    st.subheader(t("calc.bus"))
    text = st.text_input(t("calc.bus.lengths"), "12, 8, 200, 16, 9, 30, 14, 180", key="calc_len")
    seats = st.slider(t("calc.bus.seats"), 1, 16, 4, key="calc_seats")
    try:
        res = bus_sum(parse_lengths(text), seats)
    except ValueError as exc:
        st.error(t("calc.bad", msg=str(exc)))
        return
    a, b, c = st.columns(3)
    a.metric(t("calc.bus.useful"), f"{res['useful']} / {res['static_seat_steps']}", border=True)
    b.metric(t("calc.bus.static_frac"), f"{res['static_useful_frac']:.0%}", border=True)
    c.metric(t("calc.bus.steps"), f"{res['static_steps']} → {res['continuous_steps']}",
             border=True)
    st.caption(t("calc.bus.help"))


def spec_calculator() -> None:
    st.subheader(t("calc.spec"))
    a_col, k_col = st.columns(2)
    a = a_col.slider("a", 0.0, 1.0, 0.7, step=0.05, key="calc_a")
    k = k_col.slider("k", 1, 8, 4, key="calc_k")
    st.metric(t("spec.predicted_per_pass"), f"{tokens_per_pass(a, k):.2f}", border=True)
    df = pd.DataFrame([{"k": kk, "tokens": tokens_per_pass(a, kk)} for kk in range(1, 9)])
    st.altair_chart(alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("k:O", title="k"), y=alt.Y("tokens:Q", title=t("spec.tokens_per_pass"))),
        width="stretch")


def _bandwidth(progress) -> float:
    import torch

    from benchmarks.bench import memory_read_bandwidth

    progress(0.1, "…")
    return memory_read_bandwidth(torch.device("cpu"), nbytes=256 * 2**20, repeats=3) / 1e9


def roofline() -> None:
    st.subheader(t("calc.roof"))
    st.caption(t("calc.roof.help"))
    session = get_session()
    run = session.primary
    weights = run.engine.model.weight_bytes
    bw = measured("calc_bw", "calc_bw_run", t("calc.roof.measure"), _bandwidth)
    rows = roofline_rows(run.history, weights)
    if not rows:
        st.info(t("calc.roof.no_steps"))
        return
    df = pd.DataFrame(rows)
    chart = alt.Chart(df).mark_circle(size=70).encode(
        x=alt.X("tokens:Q", scale=alt.Scale(type="log"), title=t("calc.roof.tokens")),
        y=alt.Y("gb_s:Q", title=t("calc.roof.rate")), tooltip=["step", "tokens", "ms", "gb_s"])
    if bw:
        line = alt.Chart(pd.DataFrame([{"bw": bw}])).mark_rule(color="#d62728").encode(y="bw:Q")
        chart = chart + line
        st.caption(t("calc.roof.result", bw=bw, w=weights / 1e6,
                     floor=1000 * weights / (bw * 1e9),
                     best=float(df["gb_s"].max())))
    st.altair_chart(chart, width="stretch")


def main() -> None:
    ensure_shell()
    st.title(t("page.calculators"))
    st.caption(t("plan.scale"))
    left, right = st.columns(2, gap="large")
    with left:
        kv_calculator()
        spec_calculator()
    with right:
        bus_calculator()
        roofline()


main()
