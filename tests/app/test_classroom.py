"""The classroom's pure parts, without a model or a browser: labels (nicknames for students, one
grey "sim" for simulated users), every nickname and question escaped in the HTML the projector
shows, the join URL and its QR code, the class server's command line, the load run's checks,
and the results table."""

from __future__ import annotations

import copy
import json
import pathlib

import pytest

from app.components.classroom import (
    SIM,
    display_labels,
    door_html,
    questions_html,
    relabel,
    riders,
    student_rows,
    students_html,
)
from app.components.kvmap import kv_grid_html
from app.components.seats import seats_html
from classroom.client import (
    DEFAULT_SWITCHES,
    LoadRun,
    comparison_row,
    join_url,
    qr_svg,
    serve_args,
    slim,
)

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "reports.json"


@pytest.fixture(autouse=True)
def english(monkeypatch):
    """The components' strings in English (each test that checks Chinese says so)."""
    monkeypatch.setattr("app.i18n.get_lang", lambda: "en")
XSS = ("<script>alert(1)</script>", '<img src=x onerror="alert(2)">')


def class_report() -> tuple[dict, dict]:
    """A real recorded report, its requests given to two hostile students and simulated users."""
    history = json.loads(FIXTURE.read_text())["continuous_paged_prefix"]
    report = copy.deepcopy(next(r for r in history if r["kv"]["block_tables"]
                                and sum(1 for s in r["seats"] if s["request_id"]) >= 3))
    rids = [s["request_id"] for s in report["seats"] if s["request_id"]]
    owners = {rid: {"user": f"sim-{i}", "kind": "simulated"} for i, rid in enumerate(rids)}
    owners[rids[0]] = {"user": XSS[0], "kind": "person"}
    owners[rids[1]] = {"user": XSS[1], "kind": "person"}
    for i, rid in enumerate(report["waiting"]):
        owners[rid] = {"user": XSS[i % 2] if i < 2 else f"sim-w{i}",
                       "kind": "person" if i < 2 else "simulated"}
    return report, owners


def test_labels_are_nicknames_and_sim():
    report, owners = class_report()
    labels = display_labels(report, owners)
    seated = [s["request_id"] for s in report["seats"] if s["request_id"]]
    assert labels[seated[0]] == XSS[0] and labels[seated[1]] == XSS[1]
    assert all(labels[r] == SIM for r in seated[2:])
    shown = relabel(report, labels)
    assert [s["request_id"] for s in shown["seats"] if s["request_id"]][:2] == list(XSS)
    # every block's owner is relabelled, and the original report is untouched
    assert all(o in (*XSS, SIM) for b in shown["kv"]["blocks"] for o in b["owners"]), shown
    assert report["seats"][0]["request_id"] in owners
    assert riders(report, owners) == {"person": 2, "simulated": len(seated) - 2}


def test_same_nickname_twice_gets_two_labels():
    report, owners = class_report()
    seated = [s["request_id"] for s in report["seats"] if s["request_id"]]
    owners[seated[1]] = dict(owners[seated[0]])
    labels = display_labels(report, owners)
    assert labels[seated[0]] != labels[seated[1]]
    assert labels[seated[1]].startswith(XSS[0])


def test_every_view_escapes_nicknames_and_questions():
    report, owners = class_report()
    labels = display_labels(report, owners)
    shown = relabel(report, labels)
    pages = [seats_html(shown), kv_grid_html(shown["kv"]), door_html(report, owners, labels),
             questions_html([(XSS[0], XSS[1]), (XSS[1], XSS[0])])]
    for page in pages:
        assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[0]
    assert "&lt;img src=x onerror=" in pages[3]


def test_door_counts_simulated_users_apart():
    report, owners = class_report()
    report["waiting"] = ["p1", "s1", "s2", "s3"]
    owners.update({"p1": {"user": "ann", "kind": "person"},
                   **{f"s{i}": {"user": f"sim-{i}", "kind": "simulated"} for i in (1, 2, 3)}})
    html = door_html(report, owners, display_labels(report, owners))
    assert "ann" in html and "3 simulated" in html and "At the door: 4" in html


def test_join_url_and_qr():
    url = join_url("http://192.168.1.5:8123", "abc_12")
    assert url == "http://192.168.1.5:8123/class#code=abc_12"
    svg = qr_svg(url)
    assert svg.startswith("<svg") and "path" in svg


def test_serve_args_carry_the_switches():
    args = serve_args({**DEFAULT_SWITCHES, "spec": "ngram", "batching": "static"}, "127.0.0.1",
                      8123, "code")
    assert args[1:3] == ["-m", "classroom.serve"]
    assert args[args.index("--batching") + 1] == "static"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["method"] == "ngram"
    assert "--api-key=code" in args
    assert "--speculative-config" not in serve_args(DEFAULT_SWITCHES, "127.0.0.1", 1, None)


def test_the_spec_refinements_reach_the_server_and_the_table():
    """k, adaptive k and prompt lookup in front (draft / eagle only) travel in the
    --speculative-config the server parses, and name the configuration's table row."""
    from classroom.client import config_key
    from engine.config import EngineConfig
    from engine.serve import build_parser

    def spec_of(**sw):
        args = serve_args({**DEFAULT_SWITCHES, **sw}, "127.0.0.1", 8123, None)
        return EngineConfig.from_args(build_parser().parse_args(args[3:])).spec

    s = spec_of(spec="eagle", adaptive_k=True, lookup_first=True)
    assert (s.method, s.adaptive_k, s.prompt_lookup_first) == ("eagle", True, True)
    assert s.num_speculative_tokens == DEFAULT_SWITCHES["k"]
    assert spec_of(spec="ngram", k=2).num_speculative_tokens == 2  # the class page's k
    s = spec_of(spec="ngram", adaptive_k=True, lookup_first=True)  # lookup is ngram itself
    assert (s.method, s.adaptive_k, s.prompt_lookup_first) == ("ngram", True, False)
    s = spec_of(spec="draft")
    assert (s.adaptive_k, s.prompt_lookup_first) == (False, False)
    assert config_key({**DEFAULT_SWITCHES, "spec": "draft", "adaptive_k": True,
                       "lookup_first": True}) == \
        "continuous · paged · spec draft + adaptive k + lookup"
    assert config_key({**DEFAULT_SWITCHES, "adaptive_k": True}) == \
        "continuous · paged · spec off"


def test_eagle_is_offered_once_its_head_is_trained(tmp_path, monkeypatch):
    from classroom import client as classroom
    from engine.spec import eagle

    head = tmp_path / "head.safetensors"
    monkeypatch.setattr(eagle, "head_path", lambda model_name="smollm2-135m": head)
    assert "eagle" not in classroom.offered_switches()["spec"]
    head.write_bytes(b"")
    assert classroom.offered_switches()["spec"] == ("off", "ngram", "draft", "eagle")


def test_a_join_code_starting_with_a_dash_reaches_the_server():
    """token_urlsafe codes may start with "-": passed as --api-key=CODE, argparse keeps it."""
    from engine.serve import build_parser

    args = serve_args(DEFAULT_SWITCHES, "127.0.0.1", 8123, "-xY3_z")
    assert build_parser().parse_args(args[3:]).api_key == "-xY3_z"


def test_load_run_refuses_bad_numbers():
    with pytest.raises(ValueError, match="users must be 1 to 1000"):
        LoadRun(None, 1001, "poisson", 8.0)
    with pytest.raises(ValueError, match="arrival must be one of"):
        LoadRun(None, 10, "sometimes", 8.0)


def test_slim_keeps_what_the_gauges_read():
    from app.components.gauges import gauge_values

    history = json.loads(FIXTURE.read_text())["spec_ngram"]
    assert gauge_values([slim(r) for r in history]) == gauge_values(history)


def test_slim_keeps_the_reasons_tally():
    """The projector's chart of reasons reads the class's slim history as it reads the full
    reports: the same counts per step and code."""
    from app.components.seats import waits_frame

    history = json.loads(FIXTURE.read_text())["static_contiguous"]
    full = waits_frame(history)
    assert len(full) and full["requests"].sum() == sum(len(r["waits"]) for r in history)
    assert waits_frame([slim(r) for r in history]).equals(full)


def test_comparison_row():
    row = comparison_row(DEFAULT_SWITCHES, {
        "users": 10, "ok": 10, "ttft_p50_s": 0.1234, "ttft_p99_s": 0.5, "tpot_p50_s": 0.02,
        "output_tok_per_s": 123.45})
    assert row["TTFT p50 (ms)"] == 123.4 and row["output tok/s"] == 123.5
    assert row["configuration"] == "continuous · paged · spec off"


def test_students_list_keeps_short_answers_on_screen():
    history = [slim(r) for r in json.loads(FIXTURE.read_text())["continuous_paged_prefix"]]
    first = next(s["request_id"] for s in history[2]["seats"] if s["request_id"])
    owners = {first: {"user": XSS[1], "kind": "person"}}
    rows = student_rows(history, owners)
    assert len(rows) == 1 and rows[0]["nickname"] == XSS[1]
    assert rows[0]["seat"] is not None and rows[0]["blocks"] >= 1 and rows[0]["tokens"] >= 1
    assert rows[0]["state"] == "answered"
    html = students_html(rows)
    assert "<img src=x" not in html and "&lt;img src=x" in html


def test_width_rules_fit_long_and_chinese_nicknames():
    """A CJK character counts two columns; a name over the width ends in "…" and keeps its
    full text for the tooltip; two names that shorten alike stay apart."""
    from app.components.classroom import SEAT_WIDTH, display_width, fit, fitted

    assert display_width("小明") == 4 == display_width("abcd")
    assert fit("小明", SEAT_WIDTH) == "小明"
    long = "a" * 30
    assert fit(long, SEAT_WIDTH) == "a" * (SEAT_WIDTH - 1) + "…"
    assert display_width(fit("很长的中文昵称真的很长", SEAT_WIDTH)) <= SEAT_WIDTH
    short, full = fitted({"r1": long, "r2": "a" * 29 + "b", "r3": "小明"})
    assert len(set(short.values())) == 3 and all(display_width(v) <= SEAT_WIDTH
                                                 for v in short.values())
    assert full[short["r1"]] == long and full[short["r2"]] == "a" * 29 + "b"
    assert full[short["r3"]] == "小明"
    # the seat card shows the short name, its tooltip the whole one
    report, owners = class_report()
    seated = [s["request_id"] for s in report["seats"] if s["request_id"]]
    owners[seated[0]] = {"user": long, "kind": "person"}
    labels = display_labels(report, owners)
    short, full = fitted(labels)
    page = seats_html(relabel(report, short), titles=full)
    assert f'title="{long}: ' in page and f">{short[seated[0]]}<" in page
    assert f">{long}<" not in page


def test_a_seat_just_left_stays_on_the_projector_answered():
    from app.components.classroom import HOLD_S, held_seats

    report, owners = class_report()
    seated = [s for s in report["seats"] if s["request_id"]]
    rid, idx = seated[0]["request_id"], seated[0]["index"]
    was = slim(report, received=100.0)
    now_rep = copy.deepcopy(report)
    now_rep["seats"][idx] = {**now_rep["seats"][idx], "request_id": None, "state": "empty"}
    now_rep["finished"] = [rid]
    history = [was, slim(now_rep, received=100.5)]
    held = held_seats(now_rep, history, owners, now=101.0)
    assert held["seats"][idx]["request_id"] == rid and held["seats"][idx]["state"] == "answered"
    assert "answered" in seats_html(relabel(held, display_labels(held, owners)))
    gone = held_seats(now_rep, history, owners, now=100.0 + HOLD_S + 1)
    assert gone["seats"][idx]["request_id"] is None
    # a simulated rider's seat is not held
    owners[rid] = {"user": "sim-1", "kind": "simulated"}
    assert held_seats(now_rep, history, owners, now=101.0)["seats"][idx]["request_id"] is None


def test_the_class_kv_pool_names_each_blocks_owner_and_its_size():
    from app.components.classroom import class_kv_html, fitted

    report, owners = class_report()
    seated = [s["request_id"] for s in report["seats"] if s["request_id"]]
    owners[seated[0]] = {"user": "小明同学的名字很长", "kind": "person"}
    labels = display_labels(report, owners)
    short, full = fitted(labels)
    shown = relabel(report, short)
    page = class_kv_html(shown["kv"], full)
    n = len(report["kv"]["block_tables"][seated[0]])
    assert page.count("小明同学的名字很长") >= n  # every block's tooltip
    assert "&lt;img src=x" in page and "<img src=x" not in page
    used = sum(1 for b in report["kv"]["blocks"] if b["owners"])
    assert f"{used} of {report['kv']['num_blocks']} blocks in use" in page


def test_the_components_speak_chinese(monkeypatch):
    monkeypatch.setattr("app.i18n.get_lang", lambda: "zh")
    report, owners = class_report()
    report["waiting"] = ["p1", "s1"]
    owners.update({"p1": {"user": "小明", "kind": "person"},
                   "s1": {"user": "sim-1", "kind": "simulated"}})
    page = door_html(report, owners, display_labels(report, owners))
    assert "门口等待：2" in page and "小明" in page and "1 个模拟用户" in page


def test_a_hidden_or_masked_name_is_so_in_every_projected_view(monkeypatch):
    """The class's masking (hidden phones' nicknames, the word list) applied once to who asked
    what: the seats' labels, the door, the students list and the questions all read it."""
    from app.components.classroom import (
        display_labels,
        door_html,
        mask_owners,
        mask_questions,
        student_rows,
        students_html,
    )

    monkeypatch.setattr("app.i18n.get_lang", lambda: "en")
    full = json.loads(FIXTURE.read_text())["continuous_paged_prefix"]
    history = [slim(r) for r in full]
    rids = sorted({s["request_id"] for r in history for s in r["seats"] if s["request_id"]})
    owners = {rids[0]: {"user": "小明", "kind": "person"},
              rids[1]: {"user": "badword99", "kind": "person"},
              rids[2]: {"user": "sim-1", "kind": "simulated"}}
    masking = {"hidden": ["小明"], "words": ["BADWORD"]}
    shown = mask_owners(owners, masking)
    assert shown[rids[0]]["user"] == "(hidden)" and shown[rids[1]]["user"] == "*" * 9
    assert shown[rids[2]] == owners[rids[2]] and mask_owners(owners, {}) is owners
    rep = next(r for r in full if {rids[0], rids[1]} & {s["request_id"] for s in r["seats"]})
    labels = display_labels({**rep, "owners": shown}, shown)
    page = (door_html({**rep, "waiting": [rids[0], rids[1]]}, shown, labels)
            + students_html(student_rows(history, shown)) + "".join(labels.values()))
    assert "小明" not in page and "badword99" not in page
    assert mask_questions([("小明", "q1"), ("ann", "q2")], masking) == [("(hidden)", "q1"),
                                                                        ("ann", "q2")]



def _timeline_script(path: str):
    """The Classroom page's students list and its nickname buttons over a recorded run: the
    student who waited at the door (r3) hidden by the teacher, another masked by the word
    list; a click fetches that request's timeline (built here from the same reports)."""
    import json
    import pathlib

    import streamlit as st

    from app.class_timeline import timeline_picker
    from app.components.classroom import mask_owners, student_rows
    from classroom.client import slim
    from engine.waits import Timeline

    full = json.loads(pathlib.Path(path).read_text())["continuous_paged_prefix"]
    owners = {"r3": {"user": "小明", "kind": "person"},
              "r1": {"user": "badword99", "kind": "person"},
              "r2": {"user": "ann", "kind": "person"}}
    shown = mask_owners(owners, {"hidden": ["小明"], "words": ["BADWORD"]})
    rows = student_rows([slim(r) for r in full], shown)

    def fetch(rid):
        st.session_state["fetched"] = [*st.session_state.get("fetched", []), rid]
        tl, t = Timeline(), 0.0
        for r in full:
            t += 1000 * r["wall_s"]
            tl.add_report(rid, r, t)
        return {"request_id": rid, "done": True, "timeline": tl.to_list()}

    timeline_picker(rows, fetch)


def test_a_click_on_a_nickname_opens_its_requests_timeline_and_a_hidden_name_stays_hidden(
        monkeypatch):
    from streamlit.testing.v1 import AppTest

    from app.class_timeline import KEY, md_escape

    at = AppTest.from_function(_timeline_script, args=(str(FIXTURE),), default_timeout=60)
    at.session_state["lang"] = "en"
    at.run()
    assert not at.exception
    pills = at.button_group(key=KEY)
    assert "小明" not in str(pills.options) and "badword99" not in str(pills.options)
    # as the buttons show them, markdown escaped: stars are a name, not a rule
    assert {md_escape("(hidden)"), md_escape("*" * 9), "ann"} <= set(pills.options), pills.options
    assert not at.get("html") and "fetched" not in at.session_state  # nothing picked yet
    pills.set_value("r3").run()  # a click on "(hidden)"
    assert not at.exception
    page = "".join(h.proto.body for h in at.get("html"))
    assert "(hidden)" in page and "step by step" in page and "小明" not in page
    for phase in ("queued", "prefill", "decode"):
        assert f'data-phase="{phase}"' in page, phase
    assert " × " in page and "steps 1–" in page and " ms" in page  # its reasons, steps, ms
    assert at.session_state["fetched"] == ["r3"]
    at.run()  # a finished request's timeline is read once
    assert at.session_state["fetched"] == ["r3"]
    monkeypatch.setattr("app.i18n.get_lang", lambda: "zh")
    at.run()
    page = "".join(h.proto.body for h in at.get("html"))
    assert "（已隐藏） 的请求，一步一步" in page and "第 7 步（1 步）" in page
    assert "毫秒" in page and "座位已满" in page
    assert "小明" not in page


def test_without_a_class_server_the_trace_is_empty_and_says_why():
    from classroom.client import ClassRoom

    room = ClassRoom()
    trace = json.loads(room.trace())
    assert trace["traceEvents"] == [] and "no class server" in trace["otherData"]["error"]
    assert room.timeline("class-1") is None
