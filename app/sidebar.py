"""The sidebar every page shares: language, the three switches, sizes, workload, the teacher's
own prompt, Step / Play-Pause / Reset, and the device line.

Demo links open a page as `/<slug>?batching=..&kv_layout=..&spec=..`; those query parameters
set the switches once per link (a switch the teacher then flips wins, and removes them from
the URL). Widget keys: sw_batching, sw_kv_layout, sw_spec, sw_k, sw_adaptive, sw_lookup, sz_seats,
sz_blocks, sz_block_size, sz_prefix, sz_workload, sz_requests, sz_temperature, sz_samples,
custom_prompt, custom_max_tokens, custom_add, ctl_step, ctl_play, ctl_reset, ctl_speed.
"""

from __future__ import annotations

import streamlit as st

from app.i18n import language_selector, switch_label, t
from app.lessons import SWITCHES
from app.state import MAX_REQUESTS, MODELS, Session, Settings
from benchmarks.workloads import WORKLOAD_NAMES

DEFAULTS = Settings()
SPEEDS = (0.25, 0.5, 1.0, 2.0)  # seconds between two Play steps
PLAY_INTERVAL_S = 0.5  # the one Play starts with (one of SPEEDS)
QP_APPLIED = "_qp_applied"
WIDGET_OF = {"batching": "sw_batching", "kv_layout": "sw_kv_layout", "spec": "sw_spec"}


KEEP = "_keep_"  # widget values kept outside the widgets (see _restore)


def _restore() -> None:
    """Set every sidebar widget's value from its kept copy (or its default).

    Streamlit forgets a widget's value when the same widget is drawn under another page's
    id (a page run without main.py), so the values live in KEEP copies, written by each
    widget's on_change, and are handed back to the widgets at the start of every run.
    """
    s = st.session_state
    for key, value in {
        "sw_batching": DEFAULTS.batching, "sw_kv_layout": DEFAULTS.kv_layout,
        "sw_spec": DEFAULTS.spec, "sw_k": DEFAULTS.k, "sw_adaptive": DEFAULTS.adaptive_k,
        "sw_lookup": DEFAULTS.lookup_first, "sw_confidence": DEFAULTS.min_confidence,
        "sz_seats": DEFAULTS.seats,
        "sz_blocks": DEFAULTS.num_blocks, "sz_block_size": DEFAULTS.block_size,
        "sz_prefix": DEFAULTS.prefix_caching, "sz_workload": DEFAULTS.workload,
        "sz_temperature": DEFAULTS.temperature, "sz_samples": DEFAULTS.samples,
        "sz_requests": DEFAULTS.num_requests, "sz_model": DEFAULTS.model,
        "ctl_speed": PLAY_INTERVAL_S, "custom_max_tokens": 32,
    }.items():
        s[key] = s.get(KEEP + key, value)
        s[KEEP + key] = s[key]


def _keep(key: str) -> None:
    st.session_state[KEEP + key] = st.session_state[key]


def _kept(key: str) -> dict:
    """Widget kwargs: the key, and an on_change that keeps a copy of the new value."""
    return {"key": key, "on_change": _keep, "args": (key,)}


def apply_query_params() -> None:
    """Set the switches from `?batching=..&kv_layout=..&spec=..` once per distinct link."""
    wanted = {k: st.query_params[k] for k in SWITCHES if k in st.query_params}
    wanted = {k: v for k, v in wanted.items() if v in SWITCHES[k]}
    if not wanted:
        st.session_state[QP_APPLIED] = None
        return
    if wanted == st.session_state.get(QP_APPLIED):
        return
    for name, value in wanted.items():
        st.session_state[WIDGET_OF[name]] = st.session_state[KEEP + WIDGET_OF[name]] = value
    st.session_state[QP_APPLIED] = wanted


# Settings field -> the sidebar widget that sets it (the class plan's buttons set them all).
WIDGET_FOR = {"batching": "sw_batching", "kv_layout": "sw_kv_layout", "spec": "sw_spec",
              "k": "sw_k", "adaptive_k": "sw_adaptive", "lookup_first": "sw_lookup",
              "min_confidence": "sw_confidence", "seats": "sz_seats",
              "num_blocks": "sz_blocks",
              "block_size": "sz_block_size", "prefix_caching": "sz_prefix",
              "workload": "sz_workload", "num_requests": "sz_requests",
              "temperature": "sz_temperature", "samples": "sz_samples", "model": "sz_model"}


def set_knobs(knobs: dict) -> None:
    """Set sidebar widgets from Settings fields (applied by `_restore` on the next run); a
    link's switches in the URL no longer apply."""
    unknown = set(knobs) - set(WIDGET_FOR)
    if unknown:
        raise ValueError(f"unknown knobs {sorted(unknown)}; knobs are {sorted(WIDGET_FOR)}")
    for name, value in knobs.items():
        st.session_state[KEEP + WIDGET_FOR[name]] = value
    st.session_state[QP_APPLIED] = None


def _switch_flipped(key: str) -> None:
    """The teacher flipped a switch: the URL's switches no longer apply."""
    _keep(key)
    for k in SWITCHES:
        if k in st.query_params:
            del st.query_params[k]
    st.session_state[QP_APPLIED] = None


def settings_from_widgets() -> Settings:
    s = st.session_state
    return Settings(
        batching=s.sw_batching, kv_layout=s.sw_kv_layout, spec=s.sw_spec, k=int(s.sw_k),
        adaptive_k=bool(s.sw_adaptive), lookup_first=bool(s.sw_lookup),
        min_confidence=float(s.sw_confidence),
        seats=int(s.sz_seats), num_blocks=int(s.sz_blocks), block_size=int(s.sz_block_size),
        prefix_caching=bool(s.sz_prefix), workload=s.sz_workload,
        num_requests=int(s.sz_requests),
        temperature=float(s.sz_temperature), samples=int(s.sz_samples), model=s.sz_model,
    )


def eagle_trained() -> bool:
    """Has the EAGLE draft head been trained into the cache (engine/spec/train_draft.py)?"""
    from engine.spec.eagle import head_path

    return head_path(st.session_state.get("sz_model") or MODELS[0]).is_file()


def _switches() -> None:
    st.sidebar.subheader(t("side.switches"))
    eagle_ready = eagle_trained()
    for name in ("batching", "kv_layout", "spec"):
        # the EAGLE apprentice is offered once `python -m engine.spec.train_draft` built it
        options = [v for v in SWITCHES[name] if v != "eagle" or eagle_ready]
        if st.session_state[WIDGET_OF[name]] not in options:
            st.session_state[WIDGET_OF[name]] = options[0]
        labels = {v: switch_label(name, v) for v in options}
        st.sidebar.radio(switch_label(name), options, key=WIDGET_OF[name],
                         format_func=labels.__getitem__, horizontal=True,
                         on_change=_switch_flipped, args=(WIDGET_OF[name],))
    if not eagle_ready:  # a button trains it here, with a progress bar (app/apprentice.py)
        from app import apprentice

        with st.sidebar:
            apprentice.panel(st.session_state.get("sz_model") or MODELS[0], t, eagle_ready)
    if st.session_state.sw_spec != "off":
        st.sidebar.slider(t("side.k"), 1, 8, help=t("side.k.help"),
                          **_kept("sw_k"))
        st.sidebar.checkbox(t("side.adaptive"), help=t("side.adaptive.help"),
                            **_kept("sw_adaptive"))
    if st.session_state.sw_spec in ("draft", "eagle"):
        st.sidebar.checkbox(t("side.lookup_first"), help=t("side.lookup_first.help"),
                            **_kept("sw_lookup"))
    if st.session_state.sw_spec == "eagle":
        st.sidebar.slider(t("side.confidence"), 0.0, 0.9, step=0.1,
                          help=t("side.confidence.help"), **_kept("sw_confidence"))


def _sizes() -> None:
    with st.sidebar.expander(t("side.sizes"), expanded=False):
        st.slider(t("side.seats"), 1, 16, help=t("side.seats.help"), **_kept("sz_seats"))
        st.slider(t("side.blocks"), 16, 256, step=8, help=t("side.blocks.help"),
                  **_kept("sz_blocks"))
        st.select_slider(t("side.block_size"), (8, 16, 32), help=t("side.block_size.help"),
                         **_kept("sz_block_size"))
        st.checkbox(t("side.prefix"), help=t("side.prefix.help"),
                    disabled=st.session_state.sw_kv_layout != "paged", **_kept("sz_prefix"))
        st.slider(t("side.temperature"), 0.0, 1.5, step=0.1, help=t("side.temperature.help"),
                  **_kept("sz_temperature"))
        if len(MODELS) > 1:
            st.selectbox(t("side.model"), MODELS, **_kept("sz_model"))
    labels = {w: t(f"workload.{w}") for w in WORKLOAD_NAMES}
    st.sidebar.selectbox(t("side.workload"), WORKLOAD_NAMES, format_func=labels.__getitem__,
                         **_kept("sz_workload"))
    st.sidebar.slider(t("side.requests"), 1, MAX_REQUESTS, help=t("side.requests.help"),
                      **_kept("sz_requests"))
    st.sidebar.slider(t("side.samples"), 1, 4, help=t("side.samples.help"),
                      **_kept("sz_samples"))


CUSTOM_RESULT = "_custom_result"


def _add_custom(session: Session) -> None:
    """Button callback: add the typed prompt, keep the outcome to show in this run."""
    try:
        rid = session.add_prompt(st.session_state.get("custom_prompt") or "",
                                 int(st.session_state.custom_max_tokens))
    except ValueError as exc:
        st.session_state[CUSTOM_RESULT] = ("error", t("side.custom.bad", msg=str(exc)))
    else:
        st.session_state[CUSTOM_RESULT] = ("success", t("side.custom.added", rid=rid))


def _custom_prompt(session: Session) -> None:
    result = st.session_state.pop(CUSTOM_RESULT, None)
    with st.sidebar.expander(t("side.custom"), expanded=result is not None):
        st.text_area(t("side.custom.prompt"), key="custom_prompt", height=90,
                     placeholder=t("side.custom.placeholder"))
        st.number_input(t("side.custom.max_tokens"), 1, 64, **_kept("custom_max_tokens"))
        st.button(t("side.custom.add"), key="custom_add", on_click=_add_custom,
                  args=(session,))
        if result is not None:
            kind, message = result
            (st.error if kind == "error" else st.success)(message)


def _step(session: Session) -> None:
    session.step()


def set_playing(session: Session, playing: bool) -> None:
    """The state the clicked button's label promised (Play -> playing, Pause -> paused), not a
    toggle: a click that lands after the run ended by itself, or twice, must not flip the run
    back on."""
    session.playing = playing


def _reset(session: Session) -> None:
    session.reset()


def _controls(session: Session) -> None:
    c1, c2, c3 = st.sidebar.columns(3)
    c1.button(t("side.step"), key="ctl_step", on_click=_step, args=(session,),
              width="stretch", type="primary")
    c2.button(t("side.pause") if session.playing else t("side.play"), key="ctl_play",
              on_click=set_playing, args=(session, not session.playing), width="stretch")
    c3.button(t("side.reset"), key="ctl_reset", on_click=_reset, args=(session,),
              width="stretch")
    labels = {s: t("side.speed.value", s=s) for s in SPEEDS}
    st.sidebar.select_slider(t("side.speed"), SPEEDS, format_func=labels.__getitem__,
                             **_kept("ctl_speed"))


def draw_sidebar(session: Session) -> Settings:
    """Draw the sidebar; return the Settings it shows (the caller applies them)."""
    language_selector()
    _restore()
    apply_query_params()
    _switches()
    _sizes()
    settings = settings_from_widgets()
    session.apply(settings)
    _controls(session)
    _custom_prompt(session)
    return settings


def device_line(description: str) -> None:
    st.sidebar.caption(f":material/memory: `{description}`")  # the plan's own terms, as code
