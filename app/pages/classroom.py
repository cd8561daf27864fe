"""The teacher's Classroom page: the whole class boards one engine, live on the projector.

Chapter 6.4's "one server serving a thousand people", with the class as the people. The page
starts the class server (`python -m engine.serve`, a child process: app/classroom.py) or
adopts one named in server-side configuration, shows the join panel (address, QR code, join
code), and draws the server's step stream with the other pages' components: the seats with
each student's nickname, the queue at the door, the KV block map with each student's blocks,
the gauges and their history, the drafts when speculation is on. "Add N simulated users"
runs `python -m engine.load` against the same server; simulated riders are drawn grey.
Flipping a switch restarts the class engine, after the requests in flight finish or at once
(aborting them: their pages say the engine went away); each configuration's measured TTFT,
TPOT and throughput stay in a table for the end of the class.

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

from app.classroom import (  # noqa: E402
    ARRIVALS,
    DEFAULT_SWITCHES,
    ClassRoom,
    ClassServer,
    LoadRun,
    configured_server,
    join_url,
    lan_address,
    offered_switches,
    qr_svg,
)
from app.components.charts import gauge_history_chart  # noqa: E402
from app.components.classroom import (  # noqa: E402
    display_labels,
    door_html,
    questions_html,
    relabel,
    riders,
    student_rows,
    students_html,
)
from app.components.gauges import gauge_values  # noqa: E402
from app.components.kvmap import kv_grid_html, legend_html  # noqa: E402
from app.components.seats import seats_html  # noqa: E402
from app.components.spec_strip import CSS as SPEC_CSS  # noqa: E402
from app.components.spec_strip import strip_html  # noqa: E402
from app.i18n import switch_label, t  # noqa: E402


@st.cache_resource(show_spinner=False)
def classroom() -> ClassRoom:
    return ClassRoom()


def switch_radios(current: dict, prefix: str) -> dict:
    """The three switches, and under speculation its two refinements (as in the sidebar)."""
    cols = st.columns(3)
    out = {}
    for col, (name, values) in zip(cols, offered_switches().items()):
        values = values if current[name] in values else (*values, current[name])
        labels = {v: switch_label(name, v) for v in values}  # in this run's language
        out[name] = col.radio(switch_label(name), values, index=values.index(current[name]),
                              format_func=labels.__getitem__, key=f"{prefix}_{name}",
                              horizontal=True)
    spec_col = cols[2]
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
    if room.status:
        st.info(room.status)
        return
    if srv is None:
        st.subheader("Start the class")
        switches = switch_radios(DEFAULT_SWITCHES, "cls_new")
        from app.components.model_choice import model_choice

        if model := model_choice():
            switches["model"] = model
        lan = lan_address()
        on_net = st.checkbox(
            "Let phones on this network join", value=False, key="cls_network",
            help="Off: the server listens on 127.0.0.1, so only this computer can open the "
                 "students' page. On: it listens on this computer's network address, so "
                 "phones on the same Wi-Fi can; the join code is then required.")
        st.caption(f"It will listen on {lan if (on_net and lan) else '127.0.0.1'}"
                   + (" (no network address found: this computer only)"
                      if on_net and not lan else ""))
        a, b = st.columns(2)
        if a.button("Start the class server", type="primary", key="cls_start"):
            room.error = ""
            with st.spinner("starting python -m engine.serve ..."):
                try:
                    room.start(switches, on_net)
                except RuntimeError as exc:
                    room.error = str(exc)
            st.rerun()
        if (conf := configured_server()) and b.button(f"Connect to {conf['url']}",
                                                      key="cls_adopt"):
            room.attach(ClassServer.adopt(conf))
            st.rerun()
        return
    # a running class: its switches, and Stop
    st.subheader("The class engine's switches")
    switches = switch_radios(srv.switches, "cls_run")
    if srv.switches.get("model"):  # a restart keeps the class's model
        switches["model"] = srv.switches["model"]
    if switches != srv.switches and not srv.adopted:
        how = st.radio("Apply", ("after the requests in flight finish", "now, aborting them"),
                       key="cls_how", horizontal=True)
        if st.button("Restart the class engine with these switches", key="cls_apply"):
            room.restart(switches, abort=how.startswith("now"))
            st.rerun()
    if not srv.adopted and st.button("Stop the class server", key="cls_stop"):
        room.stop()
        st.rerun()


def join_panel(srv: ClassServer) -> None:
    url = join_url(srv.url, srv.join_code)
    st.markdown(f"### Join at `{srv.url}/class`")
    st.markdown(f"### Join code: `{srv.join_code or '(none: this computer only)'}`")
    st.image(qr_svg(url, scale=5), caption="scan to join", width=200)
    if srv.host.startswith("127."):
        st.caption("Listening on 127.0.0.1: only this computer can join. Stop, tick "
                   "\"Let phones on this network join\" and start again for the class.")
    elif not srv.adopted:
        st.caption(f"Listening on {srv.host}, this computer's address on its network, "
                   "because you asked phones to join; anyone on this network with the "
                   "join code can ask questions.")


def simulated_users(room: ClassRoom) -> None:
    st.subheader("Simulated users")
    run = room.load
    if run is not None and run.running:  # its progress bar is in the live view
        if st.button("Stop the simulated users", key="cls_load_stop"):
            run.stop()
        return
    a, b, c = st.columns(3)
    n = a.number_input("Users", 1, 1000, 200, step=50, key="cls_users")
    arrival = b.selectbox("Arrivals", ARRIVALS, key="cls_arrival")
    rate = c.number_input("Rate (users/s)", 0.5, 200.0, 8.0, key="cls_rate",
                          disabled=arrival == "all-at-once")
    if st.button(f"Add {int(n)} simulated users", key="cls_load"):
        room.load = LoadRun(room.server, int(n), arrival, float(rate))
        st.rerun()


def live(room: ClassRoom, show_questions: bool) -> None:
    t0 = time.perf_counter()
    room.record_load()
    stream = room.stream
    if stream is None:
        return
    report, history, owners = stream.snapshot()
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
                    text=f"simulated users: {run.done} of {run.total} served")
    if report is None:
        st.info("Waiting for the first step: ask a question from the students' page.")
        return
    labels = display_labels(report, owners)
    shown = relabel(report, labels)
    who = riders(report, owners)
    st.markdown(f"**Step {report['step']}** · students seated: {who['person']} · "
                f"simulated seated: {who['simulated']} · waiting: {len(report['waiting'])}")
    values = gauge_values(history)
    for col, g in zip(st.columns(len(values)), values):
        col.metric(g["label"], g["value"], help=g["help"], border=True)
    seats_col, kv_col = st.columns(2, gap="medium")
    with seats_col:
        st.html(seats_html(shown))
        st.html(door_html(report, owners, labels))
        if rows := student_rows(history, owners):  # (st.html refuses an empty body)
            st.html(students_html(rows))
    with kv_col:
        st.html(kv_grid_html(shown["kv"], columns=32))  # a class pool is large
        st.html(legend_html())
    if shown.get("spec"):  # this step's drafts: accepted green, rejected red
        st.html(SPEC_CSS + "".join(f"<b>{html.escape(rec['request_id'])}</b>"
                                   + strip_html(shown["step"], rec)
                                   for rec in shown["spec"][:8]))
    if len(history) > 1:
        a, b = st.columns(2)
        a.altair_chart(gauge_history_chart(history, "tokens_per_s", 220), width="stretch")
        b.altair_chart(gauge_history_chart(history, "ttft", 220), width="stretch")
    if show_questions and room.server is not None:
        try:
            qs = room.server.get("/v1/servelab/class/questions", timeout=2).json()["questions"]
        except Exception:
            qs = {}
        pairs = [(q["nickname"], q["question"]) for q in list(qs.values())[::-1][:8]]
        st.html(questions_html(pairs))
    if room.table:
        st.subheader("Each configuration, measured")
        st.dataframe(list(room.table.values()), hide_index=True)
    ms = 1000 * (time.perf_counter() - t0)
    room.redraw_ms.append(ms)
    st.caption(f"redrawn in {ms:.0f} ms · {stream.events} steps received")


def main() -> None:
    from app.nav import ensure_shell

    ensure_shell()
    room = classroom()
    st.title("Classroom: the whole class on one engine")
    st.caption("Each student asks from a phone; the projector shows their requests queue at "
               "the door, take a seat, grow their page tables and leave. Then add a thousand "
               "simulated users and flip the switches.")
    st.caption(t("plan.scale"))
    left, right = st.columns([3, 2], gap="large")
    with left:
        controls(room)
    srv = room.server
    if srv is None or room.status:
        return
    with right:
        join_panel(srv)
    with left:
        simulated_users(room)
        show_questions = st.toggle("Show questions on screen", value=False,
                                   key="cls_questions",
                                   help="Off: nicknames only. The projector is public.")

    @st.fragment(run_every=1.0)
    def live_fragment():
        live(room, show_questions)

    live_fragment()


main()
