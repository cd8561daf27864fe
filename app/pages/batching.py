"""Leak 1, finished riders keep their seats: static and continuous batching side by side.

Two engines of the session, equal but for the batching switch, step together on the same
workload: each shows its subway car (seats and riders), the queue at the door, its seats-busy
and tokens/s gauges and its seat x step timeline, where seats held by finished riders (static
batching) are drawn as waste. Below, the token inspector: a request's latest tokens, each
with the model's most likely alternatives and the one the sampler chose.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.classplan import page_variants  # noqa: E402
from app.components.alternatives import (  # noqa: E402
    alternatives_html,
    inspectable_requests,
    sampled_tokens,
)
from app.components.gauges import summary  # noqa: E402
from app.components.seats import (  # noqa: E402
    queue_html,
    seat_use,
    seats_html,
    timeline_chart,
    waits_chart,
)
from app.components.spec_strip import pct  # noqa: E402
from app.i18n import switch_label, t  # noqa: E402
from app.live import (  # noqa: E402
    compare_row,
    kept_select,
    live_page,
    runs_for,
    side_by_side,
    step_header,
)
from app.state import Run, Session  # noqa: E402
from engine.config import BATCHING as MODES  # noqa: E402


def draw_run(run: Run) -> None:
    last = run.last
    if last is None:
        st.info(t("live.press_step", n=len(run.names)))
        return
    use = seat_use(run.history)
    stats = summary(run.history)
    a, b, c = st.columns(3)
    a.metric(t("gauge.tokens_per_s"), f"{last['metrics'].get('tokens_per_s', 0):.1f}")
    busy = sum(1 for s in last["seats"] if s["state"] in ("running", "prefill"))
    b.metric(t("gauge.seats_busy"), f"{busy} / {len(last['seats'])}")
    c.metric(t("batching.useful_seat_steps"), f"{100 * use['busy_frac']:.0f}%",
             help=t("batching.useful_seat_steps.help"))
    st.html(seats_html(last))
    st.html(queue_html(last))
    st.caption(t("batching.totals", tokens=stats["tokens"], steps=stats["steps"],
                 wasted=use["idle-finished"]))


def draw_inspector(run: Run) -> None:
    """Pick a request and one of its latest tokens: the model's most likely tokens at that
    position, as bars, and the sampler's choice outlined."""
    rids = inspectable_requests(run.history)
    if not rids:
        st.caption(t("alts.wait") if not run.history and run.settings.spec == "off"
                   else t("alts.none"))
        return
    rid = kept_select("alts_request", rids, rids[0], label=t("spec.pick_request"),
                      format_func=lambda r: f"{r} · {run.names.get(r, '')}")
    tokens = sampled_tokens(run.history, rid, run.engine.tokenizer)
    labels = [f"{t('spec.step', n=tok['step'])} · «{tok['text'].replace(chr(10), '↵')}» · "
              f"{pct(tok['p'])}" for tok in tokens]
    index = kept_select("alts_token_" + rid, list(range(len(tokens))), len(tokens) - 1,
                        label=t("alts.pick_token"), format_func=labels.__getitem__)
    if index is None:
        return
    tok = tokens[index]
    st.html(alternatives_html(tok["top"], tok["token_id"], tok["text"], tok["p"],
                              mark=t("alts.mark.chosen"), rest=t("alts.rest")))
    st.caption(t("alts.caption"))


def draw(session: Session) -> list[Run]:
    s = session.settings
    runs = runs_for(session, page_variants("batching", s))
    step_header(runs)
    side_by_side("batching", MODES, s.batching, runs, draw_run)
    if any(r.history for r in runs):
        st.subheader(t("batching.timeline"))
        st.caption(t("batching.timeline.help"))
        for col, mode, run in zip(st.columns(2, gap="medium"), MODES, runs):
            if run.history:
                col.altair_chart(timeline_chart(run.history, switch_label("batching", mode)),
                                 width="stretch")
        charts = [waits_chart(run.history, switch_label("batching", mode))
                  for mode, run in zip(MODES, runs)]
        if any(c is not None for c in charts):
            st.subheader(t("seats.waits_chart"))
            st.caption(t("seats.waits_chart.help"))
            for col, chart in zip(st.columns(2, gap="medium"), charts):
                if chart is not None:
                    col.altair_chart(chart, width="stretch")
        compare_row("batching", MODES, runs, ("seats_busy", "tokens_per_s"))
    with st.expander(t("alts.header")):
        draw_inspector(runs[MODES.index(s.batching)])
    return runs


live_page("batching", draw)
