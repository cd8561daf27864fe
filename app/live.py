"""What every live page shares: the session's `Session`, the model loaded once per server, and
`live_view`, which draws a page's live part inside a fragment that Play reruns on a timer.

A live page is `live_page(slug, draw)`: its live view (left) and its lesson (right). `draw`
receives the Session, draws, and returns the runs it drew; while Play is on the fragment
advances the clock once per tick of the timer, and stops playing when those runs are done.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import streamlit as st

from app.components.charts import compare_chart
from app.components.lesson import render_lesson
from app.i18n import switch_label, t
from app.nav import ensure_shell
from app.predict import prediction_box
from app.state import Run, Session, Settings

SESSION_KEY = "servelab_session"


def get_session() -> Session:
    """This browser session's Session (created on first use)."""
    if SESSION_KEY not in st.session_state:
        st.session_state[SESSION_KEY] = Session()
    return st.session_state[SESSION_KEY]


def ensure_model(model: str) -> None:
    """Load the model once per server process, with a progress bar the first time.

    The engine's model cache (engine/model/weights_cache.py) holds the weights for every session and
    makes a second session wait for a load in progress instead of starting another."""
    from engine.model.hardware import resolve_dtype
    from engine.model.loader import is_loaded, load_model

    dtype = resolve_dtype("auto")  # what EngineConfig(dtype="auto") picks
    if is_loaded(model, dtype):
        return
    holder = st.empty()
    bar = holder.progress(0.0, text=t("live.loading_model"))

    def progress(fraction: float, message: str) -> None:
        bar.progress(min(1.0, max(0.0, float(fraction))),
                     text=f"{t('live.loading_model')} {message}")

    load_model(model, dtype, progress)
    holder.empty()


def request(flag: str) -> None:
    """Button callback: ask this run to do the button's work (a callback survives the rerun
    that `ensure_shell` may make, a plain button's True does not)."""
    st.session_state[flag] = True


def runs_for(session: Session, variants: list[Settings]) -> list[Run]:
    """Build and catch up the runs for `variants`, with a spinner when that takes a while."""
    # (a tick of Play is `stride` steps: only more than two ticks' catching up is slow)
    slow = any(v not in session.runs or session.tick - session.runs[v].ticks > 2 * session.stride
               for v in variants)
    if slow:
        with st.spinner(t("live.preparing")):
            return [session.run(v) for v in variants]
    return [session.run(v) for v in variants]


def _play_tick(session: Session, interval: float) -> None:
    now = time.monotonic()
    if now - session.last_play_s >= 0.8 * interval:
        session.tick += session.stride
        session.last_play_s = now


def live_view(draw: Callable[[Session], list[Run]], slug: str | None = None) -> None:
    """Run `draw` inside a fragment; while Play is on, the fragment reruns every interval.
    Above the view, the class plan's prediction for page `slug` when one of its stops is on
    (app/predict.py): drawn after `draw`, so its reveal sees this tick's runs."""
    session = get_session()
    interval = float(st.session_state.get("ctl_speed", 0.5)) if session.playing else None

    @st.fragment(run_every=interval)
    def fragment() -> None:
        if session.playing and interval:
            _play_tick(session, interval)
        box = st.container()
        try:
            runs = draw(session)
        except ValueError as exc:  # e.g. a KV budget too small for one request
            st.error(t("live.build_error", msg=str(exc)))
            session.playing = False
            return
        if slug is not None:
            with box:
                prediction_box(slug, runs, session=session)
        if session.playing and runs and all(r.done for r in runs):
            session.playing = False
            st.rerun(scope="app")

    fragment()


def step_header(runs: list[Run]) -> None:
    """The step counter and, when everything is done, a note that Step has nothing left."""
    session = get_session()
    st.markdown(f"### {t('live.step', n=session.tick)}")
    if runs and all(r.done for r in runs):
        st.caption(t("live.all_done"))
    elif session.playing:
        st.caption(t("live.playing"))


def variant_title(switch: str, value: str, chosen: str) -> str:
    """A column's heading: the switch value its run uses, checked when the sidebar chose it."""
    mark = f" · :material/check: {t('live.sidebar_choice')}" if value == chosen else ""
    return f"{switch_label(switch, value)}{mark}"


def side_by_side(switch: str, values: tuple[str, ...], chosen: str, runs: list[Run],
                 draw_run: Callable[[Run], None]) -> None:
    """One column per run, headed by its value of `switch`; `draw_run` fills each column."""
    for col, value, run in zip(st.columns(len(runs), gap="medium"), values, runs):
        with col:
            st.subheader(variant_title(switch, value, chosen))
            draw_run(run)


def compare_row(switch: str, values: tuple[str, ...], runs: list[Run],
                gauges: tuple[str, ...]) -> None:
    """One chart per gauge, side by side, each with a line per run (named by its `switch`)."""
    histories = {switch_label(switch, v): r.history for v, r in zip(values, runs)}
    for col, gauge in zip(st.columns(len(gauges), gap="medium"), gauges):
        col.altair_chart(compare_chart(histories, gauge), width="stretch")


def kept_select(key: str, options: list, default=None, **kw):
    """A selectbox whose kept value falls back to `default` (else the first option) when the
    options no longer hold it (a request that left, a token of another request)."""
    if not options:
        return None
    if st.session_state.get(key) not in options:
        st.session_state[key] = default if default in options else options[0]
    return st.selectbox(options=options, key=key, **kw)


def measured(key: str, button: str, label: str,
             measure: Callable[[Callable[[float, str], None]], object], **button_kw) -> object:
    """A button (key `button`) that runs `measure(progress)` under a progress bar; the result
    is kept in `st.session_state[key]` and returned (None until the button has been pressed).

    The button's callback asks the next run to measure, so the request survives the rerun
    that `ensure_shell` may make.
    """
    pending = key + "_pending"
    st.button(label, key=button, on_click=request, args=(pending,), **button_kw)
    if st.session_state.pop(pending, False):
        bar = st.progress(0.0)
        st.session_state[key] = measure(lambda f, m: bar.progress(min(1.0, max(0.0, f)), text=m))
        bar.empty()
    return st.session_state.get(key)


def page_with_lesson(slug: str, body: Callable[[], None], title: str | None = None,
                     lesson_width: float = 2.0) -> None:
    """A live page's frame: the shell, the title, `body` on the left and the lesson on the
    right."""
    ensure_shell()
    st.title(title or t(f"page.{slug}"))
    st.caption(t("plan.scale"))
    left, lesson = st.columns([5, lesson_width], gap="large")
    with left:
        body()
    with lesson:
        lesson_panel(slug)


def live_page(slug: str, draw: Callable[[Session], list[Run]],
              extra: Callable[[], None] | None = None, lesson_width: float = 2.0) -> None:
    """A live page: the live view (then `extra`, drawn once per full run) on the left, the
    lesson on the right."""

    def body() -> None:
        live_view(draw, slug)
        if extra is not None:
            extra()

    page_with_lesson(slug, body, lesson_width=lesson_width)


# The lesson's own headings are sized for a page of their own; beside a live view they shrink.
LESSON_CSS = """<style>
.st-key-lesson_panel h1{font-size:1.9rem;} .st-key-lesson_panel h2{font-size:1.45rem;}
.st-key-lesson_panel h3{font-size:1.2rem;}
</style>"""


def lesson_panel(slug: str) -> None:
    """The lesson, in a scrolling panel beside the live view."""
    st.html(LESSON_CSS)
    with st.container(height=900, border=False, key="lesson_panel"):
        render_lesson(slug)
