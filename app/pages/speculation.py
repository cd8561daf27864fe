"""Leak 3, one pass over the weights buys one token: speculative decoding, token by token.

Live: per request a strip per step (drafted tokens accepted in green, rejected in red, the
target's own correction or bonus in blue; each token's tooltip names the target's likeliest
tokens there); pick a drafted token to see p_target, p_draft, min(1, p_target / p_draft) and
the token inspector (what the draft had to match, and the row the target's own token came
from); acceptance rate, mean accepted length, tokens per target
pass and the measured speedup against the same engine without speculation, stepped
together. When the sidebar's speculation is off the page speculates with n-gram anyway.

Below, measured on demand: the greedy side-by-side (speculation off and on, fp32: the same
text from fewer target passes), the cost of one forward pass over n tokens (or the spec
benchmark's numbers from assets/bench/), speedup against concurrency, and the lossless
check (sampled frequencies with and without speculation against the target's probabilities).
"""

import html
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from app.classplan import page_variants  # noqa: E402
from app.components.alternatives import alternatives_html  # noqa: E402
from app.components.charts import (  # noqa: E402
    adaptive_k_chart,
    forward_cost_chart,
    k_history_chart,
    lossless_chart,
    speedup_chart,
)
from app.components.gauges import summary  # noqa: E402
from app.components.spec_strip import (  # noqa: E402
    accept_math,
    drafted_tokens,
    legend_html,
    records_for,
    spec_requests,
    spec_summary,
    strip_token_ids,
    strips_html,
    token_bytes,
    token_label,
)
from app.i18n import switch_label, t  # noqa: E402
from app.live import (  # noqa: E402
    get_session,
    kept_select,
    live_page,
    measured,
    runs_for,
    step_header,
)
from app.spec_lab import (  # noqa: E402
    apprentice_rows,
    bench_command,
    forward_cost,
    greedy_side_by_side,
    load_bench,
    lossless,
    recorded_date,
    speedup_rows,
)
from app.state import Run, Session  # noqa: E402
from engine.spec.adaptive import SpecLength  # noqa: E402

REQ_KEY, TOK_KEY = "spec_request", "spec_token"


def _fmt(x, pct: bool = False, digits: int = 2) -> str:
    if x is None:
        return "—"
    return f"{100 * x:.0f}%" if pct else f"{x:.{digits}f}"


def draw_token_math(run: Run, rid: str) -> None:
    tokens = drafted_tokens(run.history, rid)
    labels = [token_label(tok) for tok in tokens]  # computed now: format_func must not call t()
    index = kept_select(TOK_KEY + "_" + rid, list(range(len(tokens))), len(tokens) - 1,
                        label=t("spec.pick_token"), format_func=labels.__getitem__)
    if index is None:
        return
    tok = tokens[index]
    m = accept_math(tok)
    a, b, c = st.columns(3)
    a.metric("p_target", _fmt(m["p_target"], digits=3), help=t("spec.p_target.help"))
    b.metric("p_draft", _fmt(m["p_draft"], digits=3), help=t("spec.p_draft.help"))
    c.metric("min(1, p_target / p_draft)", _fmt(m["min_ratio"], digits=3),
             help=t("spec.ratio.help"))
    if tok["verdict"] == "discarded":
        st.caption(t("spec.discarded_note"))
    if run.settings.temperature == 0:
        st.caption(t("spec.greedy_note"))
    draw_alternatives(run, rid, tok)


def draw_alternatives(run: Run, rid: str, tok: dict) -> None:
    """The token inspector: what the picked drafted token had to match (the target's most
    likely tokens at its position) and the row of the token the target emitted after it."""
    rec = next((r for step, r in records_for(run.history, rid) if step == tok["step"]), None)
    if rec is None:
        return
    if tok["verdict"] != "discarded":
        if not tok.get("top"):
            st.caption(t("alts.not_recorded"))
            return
        st.caption(t("spec.alts_caption"))
        st.html(alternatives_html(tok["top"], tok["token_id"], tok["text"], tok["p_target"],
                                  mark=t("alts.mark.drafted"), rest=t("alts.rest")))
    if not rec.get("next_top"):
        return
    kind = rec["next_kind"]
    st.caption(t("spec.next_alts", text=rec["next_text"].replace("\n", "↵"),
                 kind=t(f"spec.kind.{kind}")))
    st.html(alternatives_html(rec["next_top"], rec["next_token_id"], rec["next_text"],
                              rec.get("next_p"), mark=t("alts.mark.emitted"), rest=t("alts.rest")))
    if kind == "correction" and run.settings.temperature > 0:
        st.caption(t("spec.residual_note"))


def draw_adaptive_k(run: Run) -> None:
    """Adaptive k: this step's choice, why (each k's expected tokens per second), and k over
    the run (the StepReport's spec_plan)."""
    plans = [(r["step"], r["spec_plan"]) for r in run.history
             if (r.get("spec_plan") or {}).get("estimates")]
    if not plans:
        st.caption(t("spec.adaptive_waiting"))
        return
    step, plan = plans[-1]
    best = max(plan["estimates"], key=lambda e: e["tokens_per_s"] or 0.0)
    key = "spec.adaptive_explored" if plan["explored"] else "spec.adaptive_now"
    st.caption(t(key, step=step, k=plan["k"], best=best["k"], every=SpecLength.EXPLORE_EVERY))
    left, right = st.columns(2, gap="large")
    with left:
        st.altair_chart(adaptive_k_chart(plan["estimates"], plan["k"]), width="stretch")
    with right:
        rows = [{"step": s, "k": p["k"], "explored": bool(p["explored"])} for s, p in plans]
        st.altair_chart(k_history_chart(rows), width="stretch")
    st.caption(t("spec.adaptive_caption"))


def draw(session: Session) -> list[Run]:
    s = session.settings
    runs = runs_for(session, page_variants("speculation", s))
    on = runs[0].settings
    run, base = runs
    step_header(runs)
    if s.spec == "off":
        st.info(t("spec.off_note"))
    st.caption(t("spec.running", method=switch_label("spec", on.spec), k=on.k))
    if on.lookup_first and on.spec != "ngram":
        recs = [rec for h in run.history for rec in h.get("spec", [])]
        by_lookup = sum(rec.get("source") == "lookup" for rec in recs)
        st.caption(t("spec.lookup_share", lookup=by_lookup, total=len(recs)))
    if on.adaptive_k:
        draw_adaptive_k(run)
    sm, with_spec, without = spec_summary(run.history), summary(run.history), summary(base.history)
    speedup = (with_spec["tokens_per_s"] / without["tokens_per_s"]
               if without["tokens_per_s"] and with_spec["tokens_per_s"] else None)
    cols = st.columns(3)
    cols[0].metric(t("gauge.acceptance"), _fmt(sm["acceptance_rate"], pct=True),
                   help=t("gauge.acceptance.help"), border=True)
    cols[1].metric(t("spec.a"), _fmt(sm["a"], pct=True), help=t("spec.a.help"), border=True)
    cols[2].metric(t("spec.mean_accepted"), _fmt(sm["mean_accepted"]),
                   help=t("spec.mean_accepted.help"), border=True)
    cols = st.columns(3)
    cols[0].metric(t("spec.predicted_per_pass"), _fmt(sm["predicted_tokens_per_pass"]),
                   help=t("spec.predicted_per_pass.help", k=on.k), border=True)
    cols[1].metric(t("spec.tokens_per_pass"), _fmt(sm["tokens_per_pass"]),
                   help=t("spec.tokens_per_pass.help"), border=True)
    cols[2].metric(t("spec.speedup_now"), "—" if speedup is None else f"×{speedup:.2f}",
                   help=t("spec.speedup_now.help", a=with_spec["tokens_per_s"],
                          b=without["tokens_per_s"]), border=True)
    if sm["a"] is not None:
        st.caption(t("spec.formula_vs_measured", a=sm["a"], n=sm["mean_drafted"],
                     pred=sm["predicted_tokens_per_pass"], got=sm["tokens_per_pass"]))
    st.html(legend_html())
    rids = spec_requests(run.history)
    busiest = max(rids, key=lambda r: len(records_for(run.history, r)), default=None)
    rid = kept_select(REQ_KEY, rids, busiest, label=t("spec.pick_request"))
    if rid is None:
        st.info(t("spec.no_drafts_yet"))
        return runs
    prompt = run.prompts.get(rid, "")
    st.caption(t("spec.prompt_of", rid=rid, name=run.names.get(rid, "")))
    st.html('<div style="font-size:15px;max-height:7em;overflow:auto;white-space:pre-wrap;'
            f'line-height:1.5;font-family:monospace">{html.escape(prompt[-400:])}</div>')
    by_id = token_bytes(run.engine.tokenizer, strip_token_ids(run.history, rid))
    st.html(strips_html(run.history, rid, by_id=by_id,
                        mark_lookup=on.lookup_first and on.spec != "ngram"))
    draw_token_math(run, rid)
    return runs


def recorded(bench: dict) -> str:
    """The caption of a chart drawn from a bench file: recorded, not live; command and date."""
    return t("spec.recorded", file=bench["_file"], cmd=bench_command(bench),
             date=recorded_date(bench) or t("spec.undated"))


def draw_forward_cost(bench: dict | None) -> None:
    st.subheader(t("spec.fwd_header"))
    st.caption(t("spec.fwd_caption"))
    rows = (bench or {}).get("forward_cost")
    source = recorded(bench) if rows else None
    model = get_session().settings.model
    now = measured("fwd_rows", "fwd_measure", t("spec.fwd_measure"),
                   lambda progress: forward_cost(model, progress=progress))
    if now:
        rows, source = now, t("spec.measured_now")
    if rows:
        st.altair_chart(forward_cost_chart(rows), width="stretch")
        st.caption(source)
        draw_bound(rows, bench)
    speed = speedup_rows((bench or {}).get("results"))
    if speed:
        methods = sorted({r["method"].split(" · ")[0] for r in speed})
        shown = [m for m in ("ngram", "eagle", "eagle+lookup+adaptive") if m in methods]
        pick = st.multiselect(t("spec.speedup_pick"), methods, default=shown or methods,
                              key="speedup_methods")
        st.altair_chart(speedup_chart([r for r in speed if r["method"].split(" · ")[0] in pick]),
                        width="stretch")
        st.caption(recorded(bench))
    else:
        st.caption(t("spec.no_bench"))


def draw_bound(rows: list[dict], bench: dict | None) -> None:
    """The lesson's formula over these forward costs: the speedup a draft of cost c accepted
    with probability a could give at batch 1, at its best k (benchmarks.spec_bench)."""
    from benchmarks.spec_bench import GOALS, needed_acceptance, speedup_bound

    head = ((bench or {}).get("draft_step") or {}).get("eagle") or {}
    left, right = st.columns(2)
    a = left.slider(t("spec.bound_a"), 0.0, 1.0, 0.5, 0.05, key="bound_a")
    c = right.slider(t("spec.bound_c"), 0.0, 0.5, round(float(head.get("vs_target") or 0.1), 2),
                     0.01, key="bound_c")
    best, perfect = speedup_bound(rows, c, a=a), speedup_bound(rows, c)
    st.caption(t("spec.bound", a=a, c=c, k=best["k"], s=best["speedup"], k1=perfect["k"],
                 s1=perfect["speedup"], n=max(r["tokens"] for r in rows)))
    # the a each speedup goal (GOALS) would need on these costs
    need = [needed_acceptance(rows, c, goal) for goal in GOALS]
    a1, a2 = (f"{x:.2f}" if x is not None else t("spec.bound_none") for x in need)
    st.caption(t("spec.bound_needed", c=c, a1=a1, a2=a2, g1=GOALS[0], g2=GOALS[1]))


def draw_apprentice(bench: dict | None) -> None:
    """The apprentice: what the trained EAGLE head is and what it costs, next to the int4
    twin, from the spec bench (recorded) and the head's own file (its training)."""
    from engine.spec.eagle import TRAIN_COMMAND, head_info

    st.subheader(t("spec.apprentice_header"))
    st.caption(t("spec.apprentice_caption"))
    info = head_info(model_name=get_session().settings.model)
    if info is None:
        st.info(t("side.eagle_missing", cmd=TRAIN_COMMAND))
    else:
        st.caption(t("spec.apprentice_trained", params=info["params"] / 1e6,
                     vocab=info["vocab_size"], agree=float(info.get("held_out_agreement", 0)),
                     wall=float(info.get("wall_s", 0)) / 60, cpu=float(info.get("cpu_s", 0)) / 60))
    rows = apprentice_rows(bench)
    if not rows:
        return
    names = {"draft": t("spec.apprentice.int4"), "eagle": t("spec.apprentice.eagle"),
             "eagle+adaptive": t("spec.apprentice.eagle_adaptive"),
             "eagle+lookup+adaptive": t("spec.apprentice.eagle_lookup")}
    table = [{t("spec.apprentice.who"): names[r["method"]],
              t("spec.apprentice.mb"): f"{r['weight_mb']:.0f}",
              t("spec.apprentice.cost"): _fmt(r["step_vs_target"]),
              t("spec.apprentice.acc_open"): _fmt(r.get("accept_open")),
              t("spec.apprentice.acc_grounded"): _fmt(r.get("accept_grounded")),
              t("spec.apprentice.speed_open"): _fmt(r.get("speedup_open")),
              t("spec.apprentice.speed_grounded"): _fmt(r.get("speedup_grounded"))}
             for r in rows]
    st.dataframe(table, hide_index=True, width="stretch")
    st.caption(recorded(bench))
    st.caption(t("spec.apprentice_cuda"))


def draw_lossless() -> None:
    st.subheader(t("spec.lossless_header"))
    st.caption(t("spec.lossless_caption"))
    s = get_session().settings
    method = s.spec if s.spec != "off" else "ngram"
    n = st.select_slider(t("spec.lossless_n"), (100, 200, 400), value=200, key="lossless_n")
    res = measured("lossless", "lossless_run", t("spec.lossless_run",
                                                 method=switch_label("spec", method)),
                   lambda progress: lossless(s.model, method, s.k, n, progress=progress))
    if not res:
        return
    series = {"p_target": t("spec.series.target"), "freq_off": t("spec.series.off"),
              "freq_on": t("spec.series.on", method=switch_label("spec", res["method"]))}
    rows = [{"token": "other" if r["text"] is None else r["text"].replace("\n", "↵"),
             "series": series[key], "value": r[key]}
            for r in res["rows"] for key in series]
    st.altair_chart(lossless_chart(pd.DataFrame(rows)), width="stretch")
    st.caption(t("spec.lossless_result", first=res["first_text"], n_off=res["n_off"],
                 n_on=res["n_on"], n=res["n"], tv_off=res["tv_off"], tv_on=res["tv_on"],
                 acc=_fmt(res["acceptance_rate"], pct=True)))


def draw_side_by_side() -> None:
    """Greedy, speculation off and on: the same text from fewer target passes (fp32)."""
    st.subheader(t("spec.sbs_header"))
    st.caption(t("spec.sbs_caption"))
    s = get_session().settings
    method = s.spec if s.spec != "off" else "ngram"
    res = measured("side_by_side", "sbs_run", t("spec.sbs_run", method=switch_label("spec", method)),
                   lambda progress: greedy_side_by_side(s.model, method, s.k, progress=progress))
    if not res:
        return
    same = sum(r["identical"] for r in res["rows"])
    a, b, c = st.columns(3)
    a.metric(t("spec.sbs_identical"), f"{same} / {len(res['rows'])}", border=True)
    b.metric(t("spec.sbs_passes"), f"{res['passes_off']} → {res['passes_on']}", border=True)
    c.metric(t("spec.tokens_per_pass"),
             f"{res['tokens'] / res['passes_off']:.2f} → {res['tokens'] / res['passes_on']:.2f}",
             border=True)
    table = [{t("spec.sbs_request"): r["name"], t("spec.sbs_same"): "✅" if r["identical"] else "❌",
              t("spec.sbs_passes"): f"{r['passes_off']} → {r['passes_on']}",
              t("spec.sbs_text"): r["text_on"]} for r in res["rows"]]
    st.dataframe(table, hide_index=True, width="stretch")


def extra() -> None:
    st.divider()
    draw_side_by_side()
    st.divider()
    bench = load_bench()
    draw_apprentice(bench)
    st.divider()
    left, right = st.columns(2, gap="large")
    with left:
        draw_forward_cost(bench)
    with right:
        draw_lossless()


live_page("speculation", draw, extra)
