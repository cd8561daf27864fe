"""Lesson page "beyond": what production engines add to the three fixes, and the shelf life
of the chapter's numbers; then four pictures of what a CPU cannot show live, each labelled by
where it comes from (app/beyond_calc.py computes them):

1. the acceptance rule over a real next-token distribution, with a draft the student drags;
   Σ min(p, q) computed, next to the engine's own rejection sampler measured on this machine;
2. a 7B model's decode step on an H100 or H200, computed from the datasheets (a roofline);
3. one request's token arrivals with speculation off and on, from a bundled recording of
   real engine runs;
4. one request's KV blocks through their life, driven through the engine's own allocator.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app import beyond_calc as bc  # noqa: E402
from app.components.beyond_charts import (  # noqa: E402
    acceptance_charts,
    blocks_chart,
    roofline_charts,
    timeline_chart,
)
from app.components.lesson import render_lesson  # noqa: E402
from app.i18n import language_selector, t  # noqa: E402

RECORDING = bc.ROOT / "assets" / "recordings" / "cpu-class-longtail.jsonl.gz"
SAMPLER_DRAWS = 20000
# The stand-in when the recorded distribution is missing: a made-up top list, said so.
CONSTRUCTED = {"tokens": ["A", "B", "C", "D", "E", "F"],
               "probs": [0.45, 0.2, 0.15, 0.1, 0.06, 0.04]}

language_selector()
st.caption(t("plan.scale"))
render_lesson("beyond")
st.header(t("beyond.figs_header"))
st.caption(t("beyond.figs_intro"))


@st.cache_data(show_spinner=False)
def _sampled(probs: tuple, temperature: float, mix: float) -> float:
    q = bc.draft_from(list(probs), temperature, mix)
    return bc.acceptance_by_sampling(list(probs), q, draws=SAMPLER_DRAWS, seed=0)["accepted"]


def draw_acceptance() -> None:
    st.subheader(t("beyond.acc.header"))
    try:
        data = bc.load_next_token()
    except ValueError as exc:
        st.error(str(exc))
        data = None
    if data is None:
        data = CONSTRUCTED
        st.caption(t("beyond.acc.constructed"))
    else:
        st.caption(t("beyond.acc.source", prompt=data["prompt"], n=len(data["probs"]),
                     model=data["model"], command=data["command"], machine=data["machine"],
                     date=data["date"]))
    a, b = st.columns(2)
    temperature = a.select_slider(t("beyond.acc.temperature"),
                                  (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0), value=2.0,
                                  key="beyond_temp")
    mix = b.slider(t("beyond.acc.mix"), 0.0, 1.0, 0.0, step=0.05, key="beyond_mix")
    p = bc.as_distribution(data["probs"], "p")
    q = bc.draft_from(p, temperature, mix)
    left, right = acceptance_charts(data["tokens"], p, q, bc.residual(p, q))
    st.altair_chart(left, width="stretch")
    m1, m2 = st.columns(2)
    m1.metric(t("beyond.acc.computed"), f"{bc.overlap(p, q):.3f}", border=True,
              help=t("beyond.acc.computed_help"))
    m2.metric(t("beyond.acc.measured"),
              f"{_sampled(tuple(float(x) for x in p), temperature, mix):.3f}", border=True,
              help=t("beyond.acc.measured_help", n=SAMPLER_DRAWS))
    st.altair_chart(right, width="stretch")
    st.caption(t("beyond.acc.caption"))


def draw_roofline() -> None:
    st.subheader(t("beyond.roof.header"))
    st.caption(t("beyond.roof.source"))
    gpus, model = bc.gpus(), bc.llama2_7b()
    a, b, c = st.columns(3)
    name = a.radio(t("beyond.roof.gpu"), list(gpus), horizontal=True, key="beyond_gpu")
    context = b.select_slider(t("beyond.roof.context"), (0, 32, 128, 512, 1024, 2048, 4096, 8192),
                              value=32, key="beyond_ctx")
    k = c.slider(t("beyond.roof.k"), 1, 8, 4, key="beyond_k")
    d, e = st.columns(2)
    alpha = d.slider(t("beyond.roof.alpha"), 0.0, 1.0, 0.8, step=0.05, key="beyond_alpha")
    draft_cost = e.slider(t("beyond.roof.draft_cost"), 0.0, 0.2, 0.0, step=0.01,
                          key="beyond_draft_cost")
    gpu = gpus[name]
    top = bc.max_batch(gpu, model, context, k + 1)
    if top < 1:
        st.warning(t("beyond.roof.no_fit"))
        return
    batches = sorted({b for b in (2 ** i for i in range(14)) if b <= top} | {top})
    rows = bc.roofline_rows(gpu, model, context, k, alpha, draft_cost, batches=batches)
    cross = bc.crossover_batch(gpu, model, context)
    cross_v = bc.crossover_batch(gpu, model, context, k + 1)
    shown = cross if cross <= top else None
    left, right = roofline_charts(rows, shown)
    st.altair_chart(left, width="stretch")
    m1, m2 = st.columns(2)
    m1.metric(t("beyond.roof.cross"), f"{cross:.0f}" if shown else t("beyond.roof.never"),
              border=True)
    m2.metric(t("beyond.roof.cross_verify", n=k + 1),
              f"{cross_v:.0f}" if cross_v <= top else t("beyond.roof.never"), border=True)
    m3, m4 = st.columns(2)
    m3.metric(t("beyond.roof.fit"), f"{top}", border=True)
    m4.metric(t("beyond.roof.gain1"), f"{rows[0]['speedup']:.2f}x", border=True)
    st.altair_chart(right, width="stretch")
    st.caption(t("beyond.roof.caption", e=f"{bc.tokens_per_pass(alpha, k):.2f}"))


@st.cache_data(show_spinner=False)
def _recorded_timelines() -> dict | None:
    from engine.recording import read_recording

    if not RECORDING.is_file():
        return None
    rec = read_recording(RECORDING)
    settings = [r["settings"] for r in rec.header["runs"]]
    off = next((i for i, s in enumerate(settings)
                if s["spec"] == "off" and s["batching"] == "continuous"), None)
    on = next((i for i, s in enumerate(settings) if s["spec"] != "off"), None)
    if off is None or on is None:  # a recording without both runs: nothing to set side by side
        return None
    rid = bc.pick_request([rec.runs[off], rec.runs[on]])
    question = rec.prompts[off].get(rid, "")
    question = question.split("user\n", 1)[-1].split("<|im_end|>", 1)[0]
    return {"rid": rid, "question": question, "spec": settings[on]["spec"],
            "k": settings[on]["k"], "seats": settings[off]["seats"],
            "requests": settings[off]["num_requests"], "date": rec.date[:10],
            "machine": rec.machine.get("cpu_model", "?") + f" ({rec.machine.get('cores', '?')})",
            "off": bc.request_timeline(rec.runs[off], rid),
            "on": bc.request_timeline(rec.runs[on], rid)}


def draw_timeline() -> None:
    st.subheader(t("beyond.tl.header"))
    data = _recorded_timelines()
    if data is None:
        st.info(t("beyond.tl.missing"))
        return
    st.caption(t("beyond.tl.source", file=RECORDING.name, machine=data["machine"],
                 date=data["date"], seats=data["seats"], n=data["requests"], rid=data["rid"],
                 spec=data["spec"], k=data["k"]))
    st.text(data["question"])
    off_name, on_name = t("beyond.tl.off"), t("beyond.tl.on", spec=data["spec"], k=data["k"])
    st.altair_chart(timeline_chart({off_name: data["off"], on_name: data["on"]}),
                    width="stretch")
    table = {t("beyond.tl.run"): [], t("beyond.tl.ttft"): [], t("beyond.tl.tpot"): [],
             t("beyond.tl.itl_max"): [], t("beyond.tl.tokens_col"): [],
             t("beyond.tl.steps_col"): []}
    for name, tl in ((off_name, data["off"]), (on_name, data["on"])):
        for col, value in zip(table.values(), (
                name, f"{tl['ttft']:.2f} s", f"{1000 * tl['tpot']:.0f} ms",
                f"{1000 * max(tl['itl'] or [0.0]):.0f} ms", tl["tokens"], tl["steps"])):
            col.append(value)
    st.table(table)
    st.caption(t("beyond.tl.caption"))


@st.cache_data(show_spinner=False)
def _block_life() -> list[dict]:
    return bc.block_life(block_size=4)


def draw_blocks() -> None:
    st.subheader(t("beyond.blk.header"))
    st.caption(t("beyond.blk.source"))
    snaps = _block_life()
    st.altair_chart(blocks_chart(snaps), width="stretch")
    for s in snaps:
        st.markdown(f"- **{t('beyond.blk.event.' + s['event'])}** — "
                    f"{t('beyond.blk.explain.' + s['event'])}")


draw_acceptance()
draw_roofline()
draw_timeline()
draw_blocks()
st.caption(t("lesson.live_only_here"))
