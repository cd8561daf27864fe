"""Predict, then reveal: on a class-plan stop's page, the students commit to a prediction (a
choice of ranges) before Step or Play shows the answer; when the runs are done the page sets
the measurement against it (the Transformer Explainer / distill.pub habit: a guess before
the picture).

`start_stop(stop, session)` is the class plan's button: it sets every knob the stop names, resets the
session and marks the stop current. `prediction_box(slug, runs)` draws the current stop's
prediction on its page. Choices and reveals live in `st.session_state` (PREDICTIONS, REVEALS),
so the plan page can list them all.
"""

from __future__ import annotations

import streamlit as st

from app.classplan import Stop, stop_by_id
from app.i18n import get_lang, t
from app.sidebar import PLAY_INTERVAL_S, set_knobs, set_playing
from app.state import Run, Session
from app.votes_panel import open_button, prediction_payload

CURRENT, GOTO = "class_stop", "_class_goto"
# Set by a stop's button, taken by its page's first draw: the page opens with the prediction
# in view (the new page keeps the plan page's scroll position, which can hide it).
SCROLL = "_class_scroll"
PREDICTIONS, REVEALS = "class_predictions", "class_reveals"
# What a page keeps from an earlier measurement, cleared when one of its stops starts, so the
# answer is not on screen before the students predict (the home race's result).
PAGE_RESULTS = {"home": ("race_result",)}


def start_stop(stop: Stop, session: Session) -> None:
    """Button callback: set every knob of `stop`, start its workload afresh, open its page."""
    set_knobs(stop.knobs)
    session.settings = stop.settings  # what the sidebar will show; the runs start over
    session.reset()
    session.stride = stop.stride  # a long run advances several steps a tick: its minute
    st.session_state[CURRENT] = stop.id
    st.session_state.setdefault(PREDICTIONS, {}).pop(stop.id, None)
    st.session_state.setdefault(REVEALS, {}).pop(stop.id, None)
    st.session_state.pop(f"pred_{stop.id}_choice", None)
    for key in PAGE_RESULTS.get(stop.page, ()):
        st.session_state.pop(key, None)
    st.session_state[GOTO] = stop.page
    st.session_state[SCROLL] = stop.id


def current_stop(slug: str) -> Stop | None:
    stop_id = st.session_state.get(CURRENT)
    if not stop_id:
        return None
    stop = stop_by_id(stop_id)
    return stop if stop.page == slug and stop.prediction else None


def _lock(stop: Stop) -> None:
    choice = st.session_state.get(f"pred_{stop.id}_choice")
    if choice is not None:
        st.session_state.setdefault(PREDICTIONS, {})[stop.id] = choice


def prediction_box(slug: str, runs: list[Run], extra: dict | None = None,
                   session: Session | None = None) -> None:
    """The current stop's prediction on page `slug`: choose and lock, then the reveal."""
    stop = current_stop(slug)
    if stop is None:
        return
    lang, pred = get_lang(), stop.prediction
    chosen = st.session_state.get(PREDICTIONS, {}).get(stop.id)
    with st.container(border=True, key=f"pred_{stop.id}"):
        if st.session_state.pop(SCROLL, None) == stop.id:
            _scroll_into_view(f"st-key-pred_{stop.id}")
        st.markdown(f"**{t('predict.title')}** {pred.question.get(lang)}")
        open_button(prediction_payload(stop), f"pred_{stop.id}")
        if chosen is None:
            st.radio(t("predict.choose"), range(len(pred.choices)), index=None,
                     format_func=lambda i: pred.choices[i].get(lang),
                     key=f"pred_{stop.id}_choice", horizontal=True)
            st.button(t("predict.lock"), key=f"pred_{stop.id}_lock", on_click=_lock,
                      args=(stop,), type="primary")
            st.caption(t("predict.before_race" if slug == "home" else "predict.before"))
            return
        views = [(r.settings, r.history, r.done) for r in runs]
        reveal = pred.reveal(views, extra)
        left, right = st.columns([3, 1], vertical_alignment="center")
        left.markdown(f"{t('predict.yours')}: **{pred.choices[chosen].get(lang)}**")
        if reveal is None and session is not None and runs:
            _play_button(right, session)
            _run_progress(stop, session)
        if reveal is None:
            st.caption(t("predict.waiting_race" if slug == "home" else "predict.waiting"))
            return
        value, index = reveal
        st.session_state.setdefault(REVEALS, {})[stop.id] = (value, index)
        shown = pred.value_fmt.format(value)
        message = t("predict.measured", value=shown, choice=pred.choices[index].get(lang))
        (st.success if index == chosen else st.warning)(
            f"{message} {t('predict.right' if index == chosen else 'predict.wrong')}")
        detail = pred.detail(views, extra or {}) if pred.detail else None
        if detail is not None:
            st.caption(detail.get(lang))
        rng = pred.expect_text(lang)
        st.caption(t("plan.in_range") if pred.expected(value)
                   else t("plan.out_of_range", range=rng))


def _scroll_into_view(css_class: str) -> None:
    """Scroll the page so the element with `css_class` is at the top of the screen: the stop's
    prediction, and below it as much of the page's picture as fits (a projector at 1280x720
    shows the title or the picture, not both). Repeated while the page settles, since
    elements drawn above it move it down, and charts drawn below it late (Vega draws after
    the script run) are what let the page scroll that far."""
    st.html(f"""<script>(() => {{
      const go = () => {{
        const el = document.querySelector(".{css_class}");
        const main = document.querySelector('[data-testid="stMain"]');
        if (!el || !main) return;
        // room below the page's end, so a short page can still bring the prediction up
        const body = main.querySelector('[data-testid="stMainBlockContainer"]');
        if (body) body.style.paddingBottom = "70vh";
        main.scrollTop += el.getBoundingClientRect().top - 8;
      }};
      [0, 300, 1000, 2000, 3000].forEach((ms) => setTimeout(go, ms));
    }})();</script>""", unsafe_allow_javascript=True)


def _run_progress(stop: Stop, session: Session) -> None:
    """How far the stop's run is and about how long Play still takes: its steps against the
    run's length (measured headless, Stop.run_steps), at Play's pace and the stop's stride."""
    total = stop.run_steps
    if not total or session.tick == 0 or session.settings != stop.settings:
        return  # (a knob changed since the stop was set up: its run is another length)
    interval = float(st.session_state.get("ctl_speed", PLAY_INTERVAL_S))
    left = max(0, total - session.tick) / session.stride * interval
    st.progress(min(1.0, session.tick / total),
                text=t("predict.progress", step=min(session.tick, total), total=total,
                       s=f"{left:.0f}", stride=session.stride))


def _play_button(where, session: Session) -> None:
    """Play / Pause next to the locked prediction, so the run control is on screen with the
    question (the sidebar's own Play may sit below a projector's fold). Inside the live
    view's fragment a click reruns the whole app: Play's timer is set outside the fragment."""
    label = t("side.pause") if session.playing else t("side.play")
    # the state this label promises, set by the click (not a toggle: a click that lands after
    # the run ended by itself must not start it again)
    if where.button(label, key="pred_play", type="primary", width="stretch",
                    on_click=set_playing, args=(session, not session.playing)):
        st.rerun(scope="app")
