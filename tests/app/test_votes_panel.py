"""The teacher's side of the class votes: the projector's HTML (escaped, counts hidden while
open, both rounds side by side at the reveal, drawn fast) and the pages' "open as a phone
round" buttons and gains section against a real votes router over HTTP (no engine needed:
the router is served alone by uvicorn on 127.0.0.1)."""

from __future__ import annotations

import pathlib
import sys
import threading
import time

import pytest
from streamlit.testing.v1 import AppTest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app import votes_panel  # noqa: E402
from app.components.votes import STRINGS, count_html, gains_html, reveal_html  # noqa: E402
from classroom.vote_routes import gains_report, votes_router  # noqa: E402
from classroom.votes import Classroom, Question, load_test_forms  # noqa: E402
from tests.conftest import free_port  # noqa: E402

ADMIN = "teacher-key"
Q = {"id": "q", "kind": "selftest", "correct": 1,
     "question": {"zh": "<script>x</script>题", "en": "<script>x</script>Q"},
     "choices": [{"zh": f"<b>选{i}</b>", "en": f"<b>c{i}</b>",
                  "why": {"zh": "因为", "en": "because"}} for i in range(4)]}


def forty_voted(room: Classroom) -> Classroom:
    ph = [room.join(nickname=f"s{i}").pid for i in range(40)]
    r = room.open_round(Question.from_dict(Q), 120)
    for i, p in enumerate(ph):
        room.vote(p, r.rid, 1 if i % 10 < 5 else i % 4)
    return room


def test_projector_html_counts_hidden_while_open_escaped_and_both_rounds():
    room = forty_voted(Classroom("c"))
    for lang in ("zh", "en"):
        html = count_html(room.projector(lang), lang)
        assert "<script>" not in html and "&lt;script&gt;" in html and "<b>" not in html
        assert "data-voted='40'" in html
        assert reveal_html(room.projector(lang), lang) == ""  # no histogram while open
    room.lock()
    for lang in ("en", "zh"):  # at the lock: the next move only, no bar, count or share
        locked = reveal_html(room.projector(lang), lang).split("</style>")[-1]
        assert STRINGS["next"][lang] in locked
        assert "%" not in locked and "vt-bar" not in locked and "vt-h" not in locked
        assert STRINGS["round1"][lang] not in locked and "✓" not in locked
    r2 = room.revote(60)
    for i, p in enumerate(room.phones):
        room.vote(p, r2.rid, 1 if i % 10 < 8 else 0)
    room.lock()
    assert "vt-bar" not in reveal_html(room.projector("en"), "en").split("</style>")[-1]
    room.reveal()
    html = reveal_html(room.projector("zh"), "zh")
    assert "第一次投票" in html and "讨论后再投" in html and "✓ 正确" in html and "错→对" in html
    assert "<script>" not in html
    assert "已揭晓" in count_html(room.projector("zh"), "zh")


def test_the_shares_on_the_bars_add_up_to_100():
    from app.components.votes import shares

    assert shares([1, 1, 1]) == [34, 33, 33] and sum(shares([2, 1, 1, 3])) == 100
    assert shares([0, 0]) == [0, 0] and shares([5, 0]) == [100, 0]
    assert all(set(v) == {"zh", "en"} and all(v.values()) for v in STRINGS.values())


def test_gains_html_from_a_class():
    ticks = iter(range(10**6))
    room = Classroom("c", forms=load_test_forms(), clock=lambda: float(next(ticks)))
    ph = [room.join().pid for _ in range(8)]
    for phase, right in (("pre", lambda s, i: (s + i) % 3 == 0), ("post", lambda s, i: s % 4)):
        room.start_test(phase)
        for s, p in enumerate(ph):
            items = room.forms.form(room.form_of(p, phase))
            for i, q in enumerate(items):
                room.answer_test(p, i, q.correct if right(s, i) else (q.correct + 1) % 4)
        room.stop_test()
    for lang in ("zh", "en"):
        rep = gains_report(room, lang)
        html = gains_html(rep, lang)
        assert rep["result"]["matched"] == 8 and rep["sentence"][lang] in html
        assert ("归一化增益" if lang == "zh" else "normalized gain") in html


@pytest.fixture(scope="module")
def router_server():
    import uvicorn
    from fastapi import FastAPI

    from engine.server.limits import Limits
    from engine.server.metrics import ServerMetrics
    from engine.server.state import ServerSettings

    app = FastAPI()
    router = votes_router()
    app.include_router(router)
    # the class server's own key check: teacher routes need the admin key
    app.add_middleware(Limits, settings=ServerSettings(api_key="join", admin_key=ADMIN),
                       metrics=ServerMetrics("m"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    end = time.monotonic() + 20
    while not server.started and time.monotonic() < end:
        time.sleep(0.02)
    votes_panel.attach(f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {ADMIN}"})
    yield router.classroom
    votes_panel.attach(None)
    server.should_exit = True
    th.join(20)


def test_quiz_page_opens_a_phone_round(router_server):
    at = AppTest.from_file(str(ROOT / "app/pages/quiz.py"), default_timeout=60)
    at.session_state["lang"] = "en"
    at.run()
    at.button(key="vote_open_quiz_ch2").click()
    at.run()
    assert not at.exception and not at.error
    room = router_server
    assert room.current is not None and room.current.question.qid == "ch2"
    assert room.current.question.correct == 2 and room.current.question.why[0]


@pytest.mark.slow  # through app/main.py: the shell sets up the engine's session
def test_plan_page_opens_a_prediction_round(router_server):
    from app.classplan import STOPS

    stop = next(s for s in STOPS if s.prediction is not None)
    at = AppTest.from_file(str(ROOT / "app/main.py"), default_timeout=120)
    at.session_state["lang"] = "zh"
    at.run()
    at.switch_page("pages/plan.py").run()
    at.button(key=f"vote_open_plan_{stop.id}").click()
    at.run()
    assert not at.exception
    q = router_server.current.question
    assert q.qid == stop.id and q.kind == "prediction" and q.correct is None
    assert q.text["zh"] == stop.prediction.question.zh


def _projector_script():
    from app.votes_panel import projector

    projector()


def test_projector_panel_runs_a_round_and_reveals_it(router_server):
    room = router_server
    ph = [room.join(nickname=f"s{i}").pid for i in range(39)] + [
        room.join(nickname="badword7").pid]
    room.join(nickname="**b**")  # joins, does not vote: a name Markdown would read as bold
    r = room.open_round(Question.from_dict(Q), 120)
    for i, p in enumerate(ph):
        room.vote(p, r.rid, 1 if i % 10 < 4 else 0)
    at = AppTest.from_function(_projector_script, default_timeout=60)
    at.session_state["lang"] = "en"
    at.run()
    page = "".join(h.proto.body for h in at.get("html"))
    assert "data-voted='40'" in page and "First vote" not in page  # how many, not how
    at.session_state["vote_words"] = "BADWORD"
    at.button(key="vote_words_save").click().run()
    assert room.words == ["BADWORD"] and "badword7" not in str(at.button)
    labels = [b.label for b in at.button if b.key and b.key.startswith("vote_nick_")]
    assert "\\*\\*b\\*\\*" in labels, labels  # shown as typed, not bold
    at.button(key="vote_nick_0").click().run()
    assert ph[0] in room.hidden_nicks
    assert at.button(key="vote_nick_0").label == "show s0"  # a second click shows it again
    at.button(key="vote_nick_0").click().run()
    assert ph[0] not in room.hidden_nicks
    at.button(key="vote_nick_0").click().run()
    at.button(key="vote_hide_q").click().run()  # one click hides the question
    page = "".join(h.proto.body for h in at.get("html"))
    assert room.current.hidden and "question hidden" in page and "&lt;script&gt;" not in page
    at.button(key="vote_hide_q").click().run()
    assert not room.current.hidden
    at.button(key="vote_lock").click().run()
    page = "".join(h.proto.body for h in at.get("html"))
    # the lock: the next move on the projector, no histogram and no share right
    assert "First vote" not in page and "discuss with a neighbour" in page
    assert "% right" not in page and "For the teacher" not in "".join(
        c.value for c in at.caption)
    at.toggle(key="vote_show_share").set_value(True).run()  # the teacher asks for it
    assert any(c.value == "For the teacher: 40% right" for c in at.caption)
    assert "40% right" not in "".join(h.proto.body for h in at.get("html"))
    at.toggle(key="vote_show_share").set_value(False).run()
    at.button(key="vote_revote").click().run()
    r2 = room.current
    assert r2.number == 2 and r2.state == "open"
    for i, p in enumerate(ph):
        room.vote(p, r2.rid, 1 if i % 10 < 8 else 0)
    at.button(key="vote_lock").click().run()
    at.button(key="vote_reveal").click().run()
    page = "".join(h.proto.body for h in at.get("html"))
    assert "First vote" in page and "After discussion" in page and "wrong→right 16" in page
    # the fragment redraws the revealed round and says how long a draw took (its speed is a
    # figure, not a test's to judge on a shared machine: a number is drawn, each time)
    for _ in range(4):
        at.run()
        drawn = next(c.value for c in at.caption if c.value.startswith("drawn in"))
        assert float(drawn.split()[2]) >= 0
    # a class without phones: counts typed by hand drive a new round's histogram
    room.open_round(Question.from_dict(Q), 60)
    at.session_state["vote_hand"] = "3, 12, 4, 1"
    at.run()
    at.button(key="vote_hand_save").click().run()
    assert room.current.hand == [3, 12, 4, 1], room.current.hand


def _projector_with(measured):
    from app.votes_panel import projector

    projector(measured)


def test_a_prediction_round_reveals_the_measured_range_and_value(router_server):
    from app.classplan import STOPS
    from app.votes_panel import prediction_payload

    stop = next(s for s in STOPS if s.prediction is not None)
    room = router_server
    room.open_round(Question.from_dict(prediction_payload(stop)), 60)
    pid = room.join().pid
    room.vote(pid, room.current.rid, 0)
    room.lock()
    value = stop.prediction.bounds[0] + 0.5  # a value in the second range
    at = AppTest.from_function(_projector_with, args=({stop.id: (value, 1)},),
                               default_timeout=60)
    at.session_state["lang"] = "zh"
    at.run()
    page = "".join(h.proto.body for h in at.get("html"))
    assert "运行演示" in page  # no answer before the engine measured it
    at.button(key="vote_reveal").click().run()
    assert room.current.question.correct == 1
    shown = stop.prediction.value_fmt.format(value)
    page = "".join(h.proto.body for h in at.get("html"))
    assert f"引擎测得：{shown}" in page and room.phone_view(pid, "en")["round"]["measured"] == shown


def _fresh(room: Classroom) -> Classroom:
    """The shared server's class with no rounds and no tests (its phones stay)."""
    room.rounds.clear()
    room.current, room.open_test = None, None
    room.tests.clear()
    return room


def _gains_script():
    from app.votes_panel import gains_section

    gains_section()


def test_the_csv_exports_once_the_pre_test_has_answers_and_gains_say_who_counts(
        router_server):
    """The CSV is there as soon as the pre-test has answers (no gains yet); after the
    post-test the gains say how many students matched, were left out and left blanks."""
    room = _fresh(router_server)
    at = AppTest.from_function(_gains_script, default_timeout=60)
    at.session_state["lang"] = "zh"
    at.run()
    assert not at.exception and not at.download_button  # nothing to export yet
    ph = [room.join().pid for _ in range(3)]
    room.start_test("pre")
    for p in ph:
        room.answer_test(p, 0, 1)  # one item each: six blanks each
    room.stop_test()
    at.run()
    assert not at.exception
    assert [b.key for b in at.download_button] == ["vote_csv"]  # no summary without gains
    assert any("做完后测" in c.value for c in at.caption)
    room.start_test("post")
    for p in ph[:2]:  # the third took the pre-test only
        room.answer_test(p, 0, 1)
        room.answer_test(p, 1, 1)
    room.stop_test()
    for lang, line in (("zh", "匹配的学生 2 人；未计入 1 人（只做了前测或后测中的一次）；"
                              "留空未答 22 处（按答错计）"),
                       ("en", "Matched students: 2; left out: 1 (took only one test); "
                              "blank answers: 22 (counted as wrong)")):
        at.session_state["lang"] = lang
        at.run()
        assert not at.exception
        page = "".join(h.proto.body for h in at.get("html"))
        assert line in page
        assert {b.key for b in at.download_button} == {"vote_csv", "vote_summary"}


def _labels(at: AppTest) -> list[str]:
    return [str(o) for o in at.selectbox(key="vote_pick").options]


def test_the_round_picker_never_offers_or_defaults_to_a_test_item(router_server):
    """Both forms of the pre/post test are held out of the rounds: the picker offers the
    self-test's items (none of which is a test item) and no test item's question, in either
    language, and starts on the self-test's first item."""
    from app.lessons import load_quiz

    _fresh(router_server)
    forms = load_test_forms()
    ids = [q.id for q in load_quiz().questions]
    assert votes_panel.round_choices() == ids  # no self-test item is a test item
    for lang in ("zh", "en"):
        at = AppTest.from_function(_projector_script, default_timeout=60)
        at.session_state["lang"] = lang
        at.run()
        assert not at.exception
        assert at.selectbox(key="vote_pick").value == ids[0]
        shown = set(_labels(at))
        assert len(shown) == len(ids)
        assert not {q.text[lang] for q in forms.items()} & shown
        assert not at.warning  # no round on a test item: nothing to warn of


def test_the_picker_holds_back_an_item_a_test_item_copies(router_server, monkeypatch):
    """Were a test item the copy of a self-test item (its question's text, under another id),
    the picker leaves that item out and defaults to the first one left; with every item a
    test item it offers nothing and its button is off."""
    from app.lessons import load_quiz
    from classroom.votes import TestForm, packaged_lessons, quiz_question

    _fresh(router_server)
    quiz = packaged_lessons().quiz["questions"]

    def copies(qs):
        items = [quiz_question(q, "test", f"{q['id']}-copy:A") for q in qs]
        return TestForm([(a, a) for a in items])

    monkeypatch.setattr(votes_panel, "test_forms", lambda: copies(quiz[:2]))
    ids = [q.id for q in load_quiz().questions]
    assert votes_panel.round_choices() == ids[2:]
    at = AppTest.from_function(_projector_script, default_timeout=60)
    at.session_state["lang"] = "en"
    at.run()
    assert at.selectbox(key="vote_pick").value == ids[2]
    monkeypatch.setattr(votes_panel, "test_forms", lambda: copies(quiz))
    at = AppTest.from_function(_projector_script, default_timeout=60)
    at.session_state["lang"] = "en"
    at.run()
    assert not at.exception
    assert at.selectbox(key="vote_pick").value is None
    assert at.button(key="vote_open_pick").disabled


def test_a_round_opened_on_a_test_item_is_marked_and_warned_of(router_server):
    """Through the API (the picker offers none): a round on a test item, by its id or by its
    question's text under another id, is marked `on_test_item` in the teacher's state, the
    CSV and the revote, and the panel shows the server's warning in the page's language."""
    import csv
    import io

    import httpx

    room = _fresh(router_server)
    pid = room.join().pid
    forms = room.forms
    item = forms.form("A")[0]
    url = votes_panel._SERVER["url"] + "/v1/servelab/votes/open"
    payload = {"id": "renamed", "kind": "selftest", "correct": item.correct,
               "question": item.text, "choices": item.choices}
    r = httpx.post(url, json={"question": payload, "seconds": 60}, params={"lang": "zh"},
                   headers=votes_panel._SERVER["headers"], timeout=5)
    assert r.status_code == 200, r.text
    view = r.json()["round"]
    assert view["on_test_item"] == item.qid == room.current.on_test_item
    assert "前后测" in view["test_item_warning"]
    room.vote(pid, room.current.rid, 0)
    for lang, words in (("zh", "前后测的题"), ("en", "pre/post test item")):
        at = AppTest.from_function(_projector_script, default_timeout=60)
        at.session_state["lang"] = lang
        at.run()
        assert any(words in w.value for w in at.warning), at.warning
    assert room.revote(30).on_test_item == item.qid
    rows = list(csv.DictReader(io.StringIO(room.export_csv())))
    assert [r["on_test_item"] for r in rows if r["source"] == "round1"] == [item.qid]
    room.open_round(Question.from_dict(Q), 60)  # a question off the test: no mark, no warning
    assert room.current.on_test_item is None
    at = AppTest.from_function(_projector_script, default_timeout=60)
    at.session_state["lang"] = "en"
    at.run()
    assert not at.warning
