"""The teacher's Classroom page: the whole class boards one engine, live on the projector.

Chapter 6.4's "one server serving a thousand people", with the class as the people. The page
starts the class server (`python -m classroom.serve`, a child process: classroom/client.py) or
adopts one named in server-side configuration, shows the join panel (address, QR code, join
code), and draws the server's step stream with the other pages' components: the seats with
each student's nickname, the queue at the door, the KV block map with each student's blocks,
the gauges and their history, the drafts when speculation is on. "Add N simulated users"
runs `python -m benchmarks.load` against the same server; simulated riders are drawn grey.
Flipping a switch swaps the engine inside the class server, which keeps its address, join
code and QR code: after the requests in flight finish (a countdown with a bound) or at once
(their phones ask again by themselves); the page follows the swap to its end without a
reload. Each configuration's measured TTFT, TPOT and throughput stay in a table for the end
of the class. A click on a nickname under the students list draws that request's timeline
(app/class_timeline.py); the class server's recent steps download as a trace. Every string is in the app's language; "Large type" enlarges the live view for
a big room.

There is one class per app process (the server and the stream are `st.cache_resource`), so
a second teacher tab sees the same class. Nicknames and questions are untrusted: they reach
HTML only through the components' `html.escape`; questions are hidden unless the teacher
turns on "Show questions on screen".
"""

import html
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.class_timeline import timeline_picker  # noqa: E402
from app.components.charts import gauge_history_chart  # noqa: E402
from app.components.classroom import (  # noqa: E402
    LARGE_CSS,
    class_kv_html,
    display_labels,
    door_html,
    fitted,
    held_seats,
    mask_owners,
    mask_questions,
    questions_html,
    relabel,
    riders,
    student_rows,
    students_html,
)
from app.components.gauges import gauge_values  # noqa: E402
from app.components.kvmap import legend_html  # noqa: E402
from app.components.seats import seats_html, waits_chart  # noqa: E402
from app.components.spec_strip import CSS as SPEC_CSS  # noqa: E402
from app.components.spec_strip import strip_html  # noqa: E402
from app.i18n import switch_label, t  # noqa: E402
from app.predict import REVEALS  # noqa: E402
from app.sidebar import KEEP, WIDGET_FOR  # noqa: E402
from app.votes_panel import attach  # noqa: E402
from app.votes_panel import projector as vote_projector  # noqa: E402
from app.why_round import ask_button  # noqa: E402
from classroom.client import (  # noqa: E402
    ARRIVALS,
    DEFAULT_KV_BLOCKS,
    DEFAULT_SWITCHES,
    ClassRoom,
    ClassServer,
    LoadRun,
    config_key,
    configured_server,
    join_url,
    lan_address,
    offered_switches,
    qr_svg,
)


def _secrets() -> dict:
    """The `[classroom]` table of .streamlit/secrets.toml (empty without a secrets file)."""
    try:
        return dict(st.secrets.get("classroom", {}))
    except Exception:  # no secrets file: nothing configured
        return {}


@st.cache_resource(show_spinner=False)
def classroom() -> ClassRoom:
    return ClassRoom()


def switch_radios(current: dict, prefix: str) -> dict:
    """The three switches, and under speculation its refinements (as in the sidebar): k,
    adaptive k, prompt lookup in front of a draft model."""
    cols = st.columns(3)
    out = {}
    for col, (name, values) in zip(cols, offered_switches().items()):
        values = values if current[name] in values else (*values, current[name])
        labels = {v: switch_label(name, v) for v in values}  # in this run's language
        out[name] = col.radio(switch_label(name), values, index=values.index(current[name]),
                              format_func=labels.__getitem__, key=f"{prefix}_{name}",
                              horizontal=True)
    spec_col = cols[2]
    # k reaches the server as the spec's num_speculative_tokens; with speculation off it
    # stays the default (what the server reads back for an engine without a spec)
    out["k"] = int(spec_col.slider(
        t("side.k"), 1, 8, value=int(current.get("k", DEFAULT_SWITCHES["k"])),
        help=t("side.k.help"), key=f"{prefix}_k")) if out["spec"] != "off" \
        else DEFAULT_SWITCHES["k"]
    out["adaptive_k"] = out["spec"] != "off" and spec_col.checkbox(
        t("side.adaptive"), value=bool(current.get("adaptive_k")), help=t("side.adaptive.help"),
        key=f"{prefix}_adaptive_k")
    out["lookup_first"] = out["spec"] in ("draft", "eagle") and spec_col.checkbox(
        t("side.lookup_first"), value=bool(current.get("lookup_first")),
        help=t("side.lookup_first.help"), key=f"{prefix}_lookup_first")
    return out


def controls(room: ClassRoom) -> None:
    srv = room.server
    if room.error:
        st.error(room.error)
    if room.launching is not None:
        start_progress_view(room)
        return
    if srv is None:
        st.subheader(t("cls.start.title"))
        # a new class starts with the k the teacher set in the sidebar on another page (the
        # sidebar's kept copy: this page draws no sidebar switches), else the default
        k = st.session_state.get(KEEP + WIDGET_FOR["k"], DEFAULT_SWITCHES["k"])
        switches = switch_radios({**DEFAULT_SWITCHES, "k": k}, "cls_new")
        from app.components.model_choice import model_choice

        if model := model_choice():
            switches["model"] = model
        lan = lan_address()
        on_net = st.checkbox(t("cls.network"), value=False, key="cls_network",
                             help=t("cls.network.help"))
        where = lan if (on_net and lan) else "127.0.0.1"
        st.caption(t("cls.listen", host=where)
                   + (t("cls.listen.nolan") if on_net and not lan else ""))
        kv_blocks = st.number_input(t("cls.kv.knob"), 32, 4096, room.kv_blocks or
                                    DEFAULT_KV_BLOCKS, step=32, key="cls_kv_blocks",
                                    help=t("cls.kv.knob.help"))
        a, b = st.columns(2)
        if a.button(t("cls.start"), type="primary", key="cls_start"):
            room.error = ""
            try:  # the server starts in the background; the page follows it (and can cancel)
                room.begin_start(switches, on_net, kv_blocks=int(kv_blocks))
            except (RuntimeError, OSError) as exc:
                room.error = str(exc)
            st.rerun()
        if (conf := configured_server(_secrets())) and b.button(t("cls.adopt", url=conf["url"]),
                                                      key="cls_adopt"):
            room.attach(ClassServer.adopt(conf))
            st.rerun()
        return
    if room.pending is not None:
        swap_progress(room)
        return
    # a running class: its switches, and Stop
    st.subheader(t("cls.switches"))
    st.caption(t("cls.engine_now", config=config_key(srv.switches), kv=room.kv_blocks))
    switches = switch_radios(srv.switches, "cls_run")
    kv_blocks = st.number_input(t("cls.kv.knob"), 32, 4096, room.kv_blocks or
                                DEFAULT_KV_BLOCKS, step=32, key="cls_run_kv_blocks",
                                help=t("cls.kv.knob.help"))
    if switches != srv.switches or int(kv_blocks) != room.kv_blocks:
        how = st.radio(t("cls.apply"), ("drain", "abort"), key="cls_how", horizontal=True,
                       format_func=lambda v: t(f"cls.apply.{v}"))
        if st.button(t("cls.apply.button"), key="cls_apply"):
            try:
                room.restart(switches, abort=how == "abort", kv_blocks=int(kv_blocks))
            except (RuntimeError, OSError) as exc:
                room.error = t("cls.apply.refused", why=str(exc))
            st.rerun()
    if not srv.adopted and st.button(t("cls.stop"), key="cls_stop"):
        room.stop()
        st.rerun()


@st.fragment(run_every=0.5)
def start_progress_view(room: ClassRoom) -> None:
    """The class server starting, followed on the page: what it is doing (a model's download
    with its progress bar, then the engine's start), and Cancel; the whole page once it
    answers, or its error."""
    try:
        progress = room.poll_start()
    except RuntimeError as exc:
        room.error = str(exc)
        st.rerun(scope="app")
        return
    if room.launching is None:  # it answers: the class page
        st.rerun(scope="app")
        return
    st.info(t("cls.starting"))
    fraction, text = progress
    text = text.replace("`", "'")  # the server's own words, shown as code (its log's)
    if fraction is not None:
        st.progress(fraction, text=t("cls.starting.download", what=f"`{text}`"))
    elif text:
        st.caption(f"`{text}`")
    st.button(t("cls.start.cancel"), key="cls_start_cancel", on_click=room.cancel_start)


@st.fragment(run_every=0.5)
def swap_progress(room: ClassRoom) -> None:
    """The switch flip, followed to its end on this page (no reload): the drain's countdown,
    the build, then the whole page again with the new engine."""
    state = room.swap_state()
    if state is None or state.get("done") or state.get("phase") == "failed":
        st.rerun(scope="app")
        return
    phase = state.get("phase", "building")
    if phase == "draining":
        left, bound = state.get("seconds_left", 0.0), state.get("drain_s", 0.0) or 1.0
        st.info(t("cls.swap.draining", s=f"{left:.0f}", n=state.get("in_flight", 0)))
        st.progress(max(0.0, min(1.0, 1 - left / bound)))
    else:
        st.info(t("cls.swap.building"))
    st.caption(t("cls.swap.same_address"))


def join_panel(srv: ClassServer) -> None:
    url = join_url(srv.url, srv.join_code)
    st.markdown(f"### {t('cls.join.at')} `{srv.url}/class`")
    st.markdown(f"### {t('cls.join.code')} `{srv.join_code or t('cls.join.none')}`")
    st.image(qr_svg(url, scale=5), caption=t("cls.join.scan"), width=200)
    if srv.host.startswith("127."):
        st.caption(t("cls.join.local"))
    elif not srv.adopted:
        st.caption(t("cls.join.lan", host=srv.host))


def simulated_users(room: ClassRoom) -> None:
    st.subheader(t("cls.sim.title"))
    run = room.load
    if run is not None and run.running:  # its progress bar is in the live view
        if st.button(t("cls.sim.stop"), key="cls_load_stop"):
            run.stop()
        return
    a, b, c = st.columns(3)
    n = a.number_input(t("cls.sim.users"), 1, 1000, 200, step=50, key="cls_users")
    arrival = b.selectbox(t("cls.sim.arrivals"), ARRIVALS, key="cls_arrival")
    rate = c.number_input(t("cls.sim.rate"), 0.5, 200.0, 8.0, key="cls_rate",
                          disabled=arrival == "all-at-once")
    if st.button(t("cls.sim.add", n=int(n)), key="cls_load"):
        room.load = LoadRun(room.server, int(n), arrival, float(rate))
        st.rerun()


def live(room: ClassRoom, show_questions: bool, large: bool = False) -> None:
    t0 = time.perf_counter()
    room.record_load()
    stream = room.stream
    if stream is None:
        return
    report, history, owners = stream.snapshot()
    if large:
        st.html(LARGE_CSS)
    if report is None and stream.error and "404" in stream.error and room.server is not None:
        # a server with no step stream (vLLM, SGLang, --no-step-stream): its /metrics instead
        from app.components.metrics_panel import server_metrics_view

        server_metrics_view(room.server.url, room.server.headers)
        return
    if stream.error:
        st.warning(stream.error)
    run = room.load
    if run is not None and run.running:
        st.progress(min(1.0, run.done / max(1, run.total)),
                    text=t("cls.sim.progress", done=run.done, total=run.total))
    if report is None:
        st.info(t("cls.waiting_first"))
        return
    # every student's name as the class's hide list and word list allow, in every view below
    masking = room.masking()
    owners = mask_owners({**report.get("owners", {}), **owners}, masking)
    report = {**report, "owners": owners}
    # empty seats keep the student who just left them for a few seconds, "answered"
    held = held_seats(report, history, owners, time.monotonic())
    labels = display_labels(held, owners)
    short, full = fitted(labels)
    shown = relabel(held, short)
    who = riders(report, owners)
    answered = sum(1 for s in held["seats"] if s["state"] == "answered")
    st.markdown(t("cls.live.line", step=report["step"], person=who["person"],
                  answered=answered, sim=who["simulated"], waiting=len(report["waiting"])))
    values = gauge_values(history)
    # three gauges a row: in a column of a 1280 or 1920 px projector a row of all of them
    # cuts their values ("11% / 1...")
    for i in range(0, len(values), 3):
        for col, g in zip(st.columns(3), values[i:i + 3]):
            col.metric(g["label"], g["value"], help=g["help"], border=True)
    seats_col, kv_col = st.columns(2, gap="medium")
    with seats_col:
        st.html(seats_html(shown, titles=full))
        st.html(door_html(report, owners, labels))
        ask_button(report, lambda rid: labels.get(rid, rid))  # masked as on the projector
        if rows := student_rows(history, owners):  # (st.html refuses an empty body)
            st.html(students_html(rows))
            timeline_picker(rows, room.timeline)  # a click on a name: its request's timeline
    with kv_col:
        st.html(class_kv_html(shown["kv"], full))
        st.html(legend_html())
    if shown.get("spec"):  # this step's drafts: accepted green, rejected red
        st.html(SPEC_CSS + "".join(f"<b>{html.escape(rec['request_id'])}</b>"
                                   + strip_html(shown["step"], rec)
                                   for rec in shown["spec"][:8]))
    if len(history) > 1:
        a, b = st.columns(2)
        a.altair_chart(gauge_history_chart(history, "tokens_per_s", 220), width="stretch")
        b.altair_chart(gauge_history_chart(history, "ttft", 220), width="stretch")
        if (chart := waits_chart(history, t("seats.waits_chart"))) is not None:
            st.altair_chart(chart, width="stretch")  # the class's reasons, step by step
    if show_questions and room.server is not None:
        try:
            qs = room.server.get("/v1/servelab/class/questions", timeout=2).json()["questions"]
        except Exception:
            qs = {}
        pairs = [(q["nickname"], q["question"]) for q in list(qs.values())[::-1][:8]]
        st.html(questions_html(mask_questions(pairs, masking)))
    if room.table:
        st.subheader(t("cls.table"))
        st.dataframe(list(room.table.values()), hide_index=True)
    ms = 1000 * (time.perf_counter() - t0)
    room.redraw_ms.append(ms)
    st.caption(t("cls.redrawn", ms=f"{ms:.0f}", n=stream.events))


def main() -> None:
    from app.nav import ensure_shell

    ensure_shell()
    room = classroom()
    st.title(t("cls.title"))
    st.caption(t("cls.intro"))
    st.caption(t("plan.scale"))
    left, right = st.columns([3, 2], gap="large")
    with left:
        controls(room)
    srv = room.server
    attach(None if srv is None else srv.url, srv.headers if srv else None)
    if srv is None:
        return
    with right:  # the same address and QR code through a switch flip
        join_panel(srv)
        vote_projector(st.session_state.get(REVEALS, {}))
    if room.pending is not None:
        return
    with left:
        simulated_users(room)
        # the class server's recent steps as a trace, read from it when the button is clicked
        st.download_button(t("cls.trace"), room.trace, file_name="servelab-class.trace.json",
                           mime="application/json", key="cls_trace", help=t("cls.trace.help"),
                           on_click="ignore")
        a, b = st.columns(2)
        show_questions = a.toggle(t("cls.questions"), value=False, key="cls_questions",
                                  help=t("cls.questions.help"))
        large = b.toggle(t("cls.large"), value=False, key="cls_large",
                         help=t("cls.large.help"))

    @st.fragment(run_every=1.0)
    def live_fragment():
        live(room, show_questions, large)

    live_fragment()


main()
