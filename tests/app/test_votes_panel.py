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


def _form_a_ids() -> set[str]:
    """The self-test items on the pre/post test, read from lessons/pretest.json here."""
    from classroom.votes import packaged_lessons

    return {p["A"]["quiz"] for p in packaged_lessons().pretest["pairs"]}


def test_the_round_picker_marks_test_items_and_defaults_to_one_off_the_test(router_server):
    from app.lessons import load_quiz

    _fresh(router_server)
    tests = _form_a_ids()
    assert tests == {"ch1", "ch3", "ch4", "internal-frag", "prefix-sharing", "bonus-token",
                     "lone-request"}
    ids = [q.id for q in load_quiz().questions]
    first_free = next(i for i in ids if i not in tests)
    for lang, mark in (("zh", "（前后测题）"), ("en", "(pre/post item) ")):
        at = AppTest.from_function(_projector_script, default_timeout=60)
        at.session_state["lang"] = lang
        at.run()
        assert not at.exception
        box = at.selectbox(key="vote_pick")
        assert box.value == first_free == "ch2"  # not ch1, form A's first item
        labels = dict(zip(ids, box.options))
        assert all(labels[i].startswith(mark) == (i in tests) for i in ids), labels
        assert not at.warning  # no test given yet: nothing to warn of


def test_the_round_picker_preselects_nothing_when_every_item_is_on_the_test(
        router_server, monkeypatch):
    from app.lessons import load_quiz
    from classroom.votes import Lessons, packaged_lessons

    _fresh(router_server)
    real = packaged_lessons()
    every = {"pairs": [{"A": {"quiz": q.id}} for q in load_quiz().questions]}
    monkeypatch.setattr(votes_panel, "packaged_lessons",
                        lambda: Lessons(real.quiz, every, real.misconceptions), raising=False)
    at = AppTest.from_function(_projector_script, default_timeout=60)
    at.session_state["lang"] = "en"
    at.run()
    assert not at.exception
    assert at.selectbox(key="vote_pick").value is None
    assert at.button(key="vote_open_pick").disabled


def test_between_the_tests_a_round_on_a_test_item_is_warned_of(router_server):
    room = _fresh(router_server)
    pid = room.join().pid
    warn = {"zh": ("一半学生会在后测里遇到这道原题", "这道题的后测已被污染"),
            "en": ("A round on it now contaminates the post-test",
                   "the post-test is now contaminated on this item")}
    room.start_test("pre")
    room.answer_test(pid, 0, 1)
    room.stop_test()
    for lang, (before, after) in warn.items():
        at = AppTest.from_function(_projector_script, default_timeout=60)
        at.session_state["lang"] = lang
        at.run()
        at.selectbox(key="vote_pick").set_value("ch2").run()
        assert not at.warning  # an item off the test
        at.selectbox(key="vote_pick").set_value("ch1").run()
        assert [w.value for w in at.warning if before in w.value], at.warning
        at.button(key="vote_open_pick").click().run()
        assert room.current.question.qid == "ch1"
        assert any(after in w.value for w in at.warning), at.warning
        room.lock()
    assert votes_panel.between_tests(room.test_status())
    room.start_test("post")
    assert votes_panel.between_tests(room.test_status())  # while the post-test is open
    room.answer_test(pid, 0, 1)
    room.stop_test()
    assert not votes_panel.between_tests(room.test_status())
    at = AppTest.from_function(_projector_script, default_timeout=60)
    at.session_state["lang"] = "en"
    at.run()
    at.selectbox(key="vote_pick").set_value("ch1").run()
    at.button(key="vote_open_pick").click().run()
    assert room.current.question.qid == "ch1" and not at.warning  # after the post-test
    assert not votes_panel.between_tests({"open": None, "answered": {}})
