"""The votes core and the gains, without HTTP: rounds, refusals, test forms, measures."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from app.lessons import LESSONS_DIR
from classroom.gains import class_gains, cohen_dz, hake_g, hand_gains, revisit_sentence
from classroom.votes import (
    FLOOD_VOTES,
    Classroom,
    Question,
    VoteError,
    load_misconceptions,
    load_test_forms,
    pick_lang,
    suggest,
)

Q = {"id": "q1", "kind": "selftest", "correct": 2,
     "question": {"zh": "题目", "en": "Question"},
     "choices": [{"zh": f"选项{i}", "en": f"choice {i}", "why": {"zh": "因为", "en": "because"}}
                 for i in range(4)]}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_suggestion_thresholds():
    assert [suggest(x) for x in (0.0, 0.34, 0.35, 0.7, 0.71, None)] == [
        "explain", "explain", "discuss", "discuss", "reveal", "measure"]


def test_round_vote_change_lock_revote_shift():
    clock = Clock()
    c = Classroom("cls", clock=clock)
    ph = [c.join().pid for _ in range(10)]
    r = c.open_round(Question.from_dict(Q), seconds=30)
    for i, p in enumerate(ph):
        c.vote(p, r.rid, 2 if i < 3 else 0)  # 3 of 10 right
    c.vote(ph[9], r.rid, 1)  # a change of mind: still one ballot
    assert r.counts() == [6, 1, 3, 0] and r.voters() == 10
    # the projector shows how many, not how, while open
    view = c.projector("en")["round"]
    assert view["voted"] == 10 and "counts" not in view
    c.lock()
    with pytest.raises(VoteError) as e:
        c.vote(ph[0], r.rid, 1)
    assert e.value.code == "closed" and r.counts() == [6, 1, 3, 0]
    assert c.projector("en")["round"]["suggestion"] == "explain"
    r2 = c.revote(30)
    with pytest.raises(VoteError) as e:  # the first round's id no longer takes votes
        c.vote(ph[0], r.rid, 2)
    assert e.value.code == "stale_round"
    for i, p in enumerate(ph):
        c.vote(p, r2.rid, 2 if i in (1, 2, 3, 4, 5, 6) else 0)  # ph0 right->wrong, 4 gain
    c.reveal()
    v = c.projector("zh")["round"]
    assert v["previous_counts"] == [6, 1, 3, 0] and v["counts"] == [4, 0, 6, 0]
    assert v["shift"] == {"wrong_to_right": 4, "right_to_wrong": 1, "stayed_right": 2,
                          "stayed_wrong": 3, "matched": 10}
    # a phone reads only its own ballot
    pv = c.phone_view(ph[0], "zh")
    assert pv["round"]["mine"] == 0 and pv["round"]["correct"] == 2
    assert "counts" not in json.dumps(pv) and ph[1] not in json.dumps(pv)


def test_deadline_extend_and_refusals():
    clock = Clock()
    c = Classroom("cls", clock=clock)
    p = c.join().pid
    r = c.open_round(Question.from_dict(Q), seconds=10)
    clock.t = 9
    c.extend(20)
    clock.t = 25
    c.vote(p, r.rid, 1)
    for bad, code in ((7, "unknown_choice"), ("1", "unknown_choice"), (True, "unknown_choice")):
        with pytest.raises(VoteError) as e:
            c.vote(p, r.rid, bad)
        assert e.value.code == code and e.value.status == 400
        assert "选项" in e.value.message("zh") and "choice" in e.value.message("en")
    with pytest.raises(VoteError) as e:
        c.vote(p, r.rid, 1, class_id="other")
    assert e.value.code == "wrong_class"
    with pytest.raises(VoteError) as e:
        c.vote(p, "other-1", 1)
    assert e.value.code == "wrong_class"
    with pytest.raises(VoteError) as e:
        c.vote("nobody", r.rid, 1)
    assert e.value.code == "unknown_phone"
    refused = 0
    for i in range(30):  # a flood from one phone: refused, counts unchanged
        try:
            c.vote(p, r.rid, i % 2)
        except VoteError as err:
            assert err.code == "flood" and err.status == 429
            refused += 1
    assert refused == 30 - FLOOD_VOTES + 1 and r.voters() == 1
    clock.t = 40  # past the deadline: the round locks itself
    with pytest.raises(VoteError) as e:
        c.vote(p, r.rid, 0)
    assert e.value.code == "closed"


def test_hand_counts_drive_suggestion_and_reveal():
    c = Classroom("cls")
    c.open_round(Question.from_dict(Q))
    c.hand_count([2, 3, 10, 1])
    v = c.projector("en")["round"]
    assert v["counts"] == [2, 3, 10, 1] and v["suggestion"] == "discuss"
    c.revote()
    c.hand_count([0, 1, 14, 1])
    c.reveal()
    v = c.projector("en")["round"]
    assert v["previous_counts"] == [2, 3, 10, 1] and v["suggestion"] == "reveal"
    assert v["shift"] is None  # no matching from a show of hands
    with pytest.raises(VoteError) as e:
        c.hand_count([1, 2])
    assert e.value.code == "bad_counts" and "0 到 10000" in e.value.message("zh")


def test_prediction_reveal_sets_measured_range():
    q = dict(Q, kind="prediction", correct=None)
    c = Classroom("cls")
    p = c.join().pid
    r = c.open_round(Question.from_dict(q))
    c.vote(p, r.rid, 3)
    c.lock()
    assert c.projector("en")["round"]["suggestion"] == "measure"
    c.reveal(correct=3, measured="2.41")
    assert c.projector("en")["round"]["correct"] == 3
    assert c.projector("en")["round"]["measured"] == "2.41"
    assert c.phone_view(p, "zh")["round"]["measured"] == "2.41"


def test_nickname_masking_and_hiding():
    c = Classroom("cls")
    a = c.join(nickname="小明").pid
    b = c.join(nickname="badword99").pid
    c.words = ["BADWORD"]
    assert c.display_name(a) == "小明" and c.display_name(b) == "*" * 9
    c.hidden_nicks.add(a)
    assert c.display_name(a) == ""
    assert c.join(pid=a).pid == a  # a reload keeps the id
    with pytest.raises(VoteError):
        c.join(nickname="x\x00")


def test_one_name_hidden_and_shown_by_handle_everywhere_it_is_projected():
    """A phone's nickname (set on join, as the page sends the one it asks with) is listed for
    the teacher by a salted handle, never its bearer id; hiding it by handle hides it in the
    masking every projected view reads, a second click shows it again, and a name the word
    list masks can still be hidden (by handle, not by its stars)."""
    from classroom.votes import mask_name

    c = Classroom("cls")
    a = c.join(nickname="小明").pid
    b = c.join(nickname="badword99").pid
    c.words = ["BADWORD"]
    names = {n["name"]: n for n in c.names()}
    assert set(names) == {"小明", "*" * 9} and not any(n["hidden"] for n in names.values())
    assert {n["handle"] for n in names.values()} == {c.handle(a), c.handle(b)}
    assert not {n["handle"] for n in names.values()} & {a, b}
    c.set_hidden(c.handle(b), True)  # the masked one, hidden by its handle
    c.set_hidden(c.handle(a), True)
    m = c.masking()
    assert m == {"hidden": ["badword99", "小明"], "words": ["BADWORD"]}
    assert mask_name("小明", m["hidden"], m["words"]) is None
    assert mask_name("ann", m["hidden"], m["words"]) == "ann"
    assert mask_name("xbadWordx", (), m["words"]) == "*" * 9
    c.set_hidden(c.handle(a), False)  # shown again
    assert c.masking()["hidden"] == ["badword99"] and c.display_name(a) == "小明"
    with pytest.raises(ValueError, match="handle"):
        c.set_hidden("nope", True)
    # the handles survive the class's record (the CSV's ids stay the same after a restart)
    d = Classroom("cls")
    d.restore(c.snapshot())
    assert d.handle(a) == c.handle(a)


def test_lang_pick():
    assert pick_lang(None, "zh-CN,zh;q=0.9,en;q=0.8") == "zh"
    assert pick_lang(None, "en-US,en;q=0.9") == "en"
    assert pick_lang("zh", "en-US") == "zh"
    assert pick_lang(None, None) == "en"


_NUM = re.compile(r"\d[\d,.]*")


def test_forms_are_parallel_twins_that_differ():
    forms = load_test_forms()
    known = load_misconceptions()
    assert 6 <= len(forms.pairs) <= 8
    for a, b in forms.pairs:
        assert a.qid.split(":")[0] == b.qid.split(":")[0]
        for lang in ("zh", "en"):
            assert a.text[lang] != b.text[lang]
            assert {c[lang] for c in a.choices}.isdisjoint({c[lang] for c in b.choices})
            na = set(_NUM.findall(a.text[lang] + "".join(c[lang] for c in a.choices)))
            nb = set(_NUM.findall(b.text[lang] + "".join(c[lang] for c in b.choices)))
            if na or nb:
                assert na != nb, (a.qid, lang, na)
        # the twin's right answer sits elsewhere: a class that remembers "B" from the pre-test
        # gains nothing on the post-test
        assert a.correct != b.correct, (a.qid, a.correct)
        for q in (a, b):  # every wrong choice names a known misconception
            assert all((m in known) == (i != q.correct) for i, m in enumerate(q.misconceptions))
    for m in ("batch-speeds-one", "spec-changes-answer", "paging-shrinks-weights"):
        assert m in known and known[m]["zh"] and known[m]["en"]
    data = json.loads((LESSONS_DIR / "pretest.json").read_text("utf-8"))
    assert all(p["idea"]["zh"] and p["idea"]["en"] for p in data["pairs"])


def test_counterbalanced_forms():
    c = Classroom("cls", forms=load_test_forms())
    ph = [c.join().pid for _ in range(6)]
    firsts = [c.form_of(p, "pre") for p in ph]
    assert firsts.count("A") == 3 and firsts.count("B") == 3
    assert all(c.form_of(p, "pre") != c.form_of(p, "post") for p in ph)


def test_gains_match_hand_computation():
    # three students, two items: scores pre 0/50/50, post 100/50/100 (%)
    pre = {"s1": {0: False, 1: False}, "s2": {0: True, 1: False}, "s3": {0: True, 1: False}}
    post = {"s1": {0: True, 1: True}, "s2": {0: False, 1: True}, "s3": {0: True, 1: True},
            "s4": {0: True, 1: True}}
    r = class_gains(pre, post)
    pre_pct, post_pct = (0 + 50 + 50) / 3, (100 + 50 + 100) / 3
    assert r["pre"] == pytest.approx(pre_pct) and r["post"] == pytest.approx(post_pct)
    assert r["g"] == pytest.approx((post_pct - pre_pct) / (100 - pre_pct))
    diffs = [100, 0, 50]
    m = sum(diffs) / 3
    sd = (sum((x - m) ** 2 for x in diffs) / 2) ** 0.5
    assert r["d"] == pytest.approx(m / sd)
    assert r["right_to_wrong"] == pytest.approx(1 / 2)  # s2 and s3 right on item 0; s2 lost it
    assert r["matched"] == 3 and r["unmatched"] == 1
    assert r["items"][1]["g"] == pytest.approx(1.0) and r["items"][0]["right_to_wrong"] == 0.5
    assert hake_g(100, 100) is None and cohen_dz([1.0]) is None and cohen_dz([2, 2]) is None
    h = hand_gains({0: (5, 20)}, {0: (15, 20)})
    assert h["g"] == pytest.approx((75 - 25) / 75) and h["d"] is None
    s = revisit_sentence(r, {0: {"zh": "甲", "en": "first"}, 1: {"zh": "乙", "en": "second"}}, {})
    assert "first" in s["en"] and "甲" in s["zh"]


def test_pre_post_by_hand_counts_give_g_without_d():
    from classroom.vote_routes import gains_report

    c = Classroom("cls", forms=load_test_forms())
    right_pre = right_post = 0
    for i in range(len(c.forms.pairs)):
        for form in ("A", "B"):
            q = c.forms.form(form)[i]
            pre, post = [1] * len(q.choices), [1] * len(q.choices)
            pre[q.correct], post[q.correct] = 5, 14  # of 8 and 17 answers
            right_pre += 5
            right_post += 14
            c.test_hand_count("pre", i, form, pre)
            c.test_hand_count("post", i, form, post)
    n_pre = n_post = 0
    for form in ("A", "B"):
        for q in c.forms.form(form):
            n_pre += 5 + len(q.choices) - 1
            n_post += 14 + len(q.choices) - 1
    rep = gains_report(c, "zh")
    a, b = 100 * right_pre / n_pre, 100 * right_post / n_post
    assert rep["source"] == "hand" and rep["result"]["pre"] == pytest.approx(a)
    assert rep["result"]["g"] == pytest.approx((b - a) / (100 - a))
    assert rep["result"]["d"] is None and rep["result"]["right_to_wrong"] is None
    assert rep["summary"].startswith("# 课堂学习收获")
    # each form's share right, from its own counts (right 5 of 8, 14 of 17 on every item)
    answers = {ph: sum(k + len(q.choices) - 1 for q in c.forms.form("A")) for ph, k in
           (("pre", 5), ("post", 14))}
    forms = rep["result"]["forms"]
    assert forms["A"]["pre"] == pytest.approx(100 * 5 * len(c.forms.pairs) / answers["pre"])
    assert forms["B"]["post"] == pytest.approx(100 * 14 * len(c.forms.pairs) / answers["post"])
    assert forms["A"]["n_pre"] is None and rep["result"]["orders"] == {}
    assert "| A 卷 | " in rep["summary"] and "| - |" in rep["summary"]


def test_the_flood_rule_is_a_setting_and_its_window_ends():
    """Classroom(flood_votes, flood_window_s), as ClassLimits sets them: the ballot past the
    limit inside the window is refused; once the window has passed the phone votes again."""
    clock = Clock()
    c = Classroom("cls", clock=clock, flood_votes=3, flood_window_s=5.0)
    p = c.join().pid
    r = c.open_round(Question.from_dict(Q), seconds=60)
    for i in range(3):
        c.vote(p, r.rid, i % 2)
    with pytest.raises(VoteError) as e:
        c.vote(p, r.rid, 0)
    assert e.value.code == "flood" and r.ballots[p] == 0  # the third ballot stands
    clock.t = 4.9
    with pytest.raises(VoteError):
        c.vote(p, r.rid, 1)
    clock.t = 5.1
    c.vote(p, r.rid, 1)
    assert r.ballots[p] == 1 and r.voters() == 1


def test_a_round_on_a_self_test_question_shows_its_figures_filled():
    """A self-test question whose text quotes a figure ({{figure:NAME}}, lessons/figures.json)
    reaches the phones with the number, in both languages, never the placeholder."""
    from classroom.votes import packaged_lessons, quiz_question
    from lessons.figures import figure_text

    quiz = packaged_lessons().questions
    quoting = [qid for qid, q in quiz.items() if "{{figure:" in json.dumps(q, ensure_ascii=False)]
    assert {"acceptance", "shelf-life"} <= set(quoting)
    for qid in quoting:
        shown = json.dumps(dataclasses.asdict(quiz_question(quiz[qid])), ensure_ascii=False)
        assert "{{" not in shown, qid
    # the post-test's twins (form B, pretest.json) quote figures too: filled the same way
    forms = load_test_forms()
    shown = json.dumps([dataclasses.asdict(b) for _, b in forms.pairs], ensure_ascii=False)
    assert "{{" not in shown and figure_text("chapter_waste", "zh") in shown
    acceptance = dataclasses.asdict(quiz_question(quiz["acceptance"]))
    for lang in ("zh", "en"):
        assert figure_text("alpha_08_k4", lang) in json.dumps(acceptance, ensure_ascii=False)
        assert "{{" not in json.dumps(quiz_question(quiz["acceptance"]).for_phone(lang))


def test_misconception_shares_count_the_answers_whose_form_could_catch_it():
    """By hand: two forms of two items; s1, s2 take A then B, s3, s4 B then A.
    Form A: item 0 offers {w, z}, item 1 {y, z, w}; form B: item 0 {w}, item 1 {x, y}.
    A share's denominator is the (student, item) answers whose own form's item offers the
    tag, whether anyone picked it there or not, blanks included."""
    offer = {"A": [{"w", "z"}, {"y", "z", "w"}], "B": [{"w"}, {"x", "y"}]}
    form = {("pre", "s1"): "A", ("pre", "s2"): "A", ("pre", "s3"): "B", ("pre", "s4"): "B",
            ("post", "s1"): "B", ("post", "s2"): "B", ("post", "s3"): "A", ("post", "s4"): "A"}
    picks = {  # (phase, student) -> item -> the misconception picked, "" right, None blank
        ("pre", "s1"): ["z", "y"], ("pre", "s2"): ["", None],
        ("pre", "s3"): ["w", "x"], ("pre", "s4"): ["", "x"],
        ("post", "s1"): ["", "x"], ("post", "s2"): ["", ""],
        ("post", "s3"): ["", ""], ("post", "s4"): ["z", ""]}
    tabs: dict = {"pre": {}, "post": {}}
    tags, offers = {}, {}
    for (ph, s), got in picks.items():
        tabs[ph][s] = {i: m == "" for i, m in enumerate(got)}
        for i, m in enumerate(got):
            tags[(ph, s, i)] = m or None
            offers[(ph, s, i)] = frozenset(offer[form[(ph, s)]][i])
    r = class_gains(tabs["pre"], tabs["post"], tags, offers)
    mis = r["misconceptions"]
    # x is on form B's item 1 only: both who took B before picked it (100%, not 2 of 4 = 50%);
    # one of the two who took B after did (50%, not 25%)
    assert mis["x"] == {"pre": 100.0, "post": 50.0, "n_pre": 2, "n_post": 2, "items": [1]}
    # w: A's two items and B's item 0, so before 2 x 2 + 2 x 1 = 6 answers could catch it,
    # though nobody picked it on item 1 (1 of 6, not 1 of 4)
    assert mis["w"]["n_pre"] == mis["w"]["n_post"] == 6 and mis["w"]["items"] == [0, 1]
    assert mis["w"]["pre"] == pytest.approx(100 / 6) and mis["w"]["post"] == 0.0
    # y on item 1 of both forms: s2's blank counts in the denominator
    assert (mis["y"]["pre"], mis["y"]["n_pre"], mis["y"]["post"]) == (25.0, 4, 0.0)
    # z on A's two items: 2 takers x 2 items each time
    assert (mis["z"]["pre"], mis["z"]["n_pre"], mis["z"]["post"], mis["z"]["n_post"]) == (
        25.0, 4, 25.0, 4)
    assert set(mis) == {"w", "x", "y", "z"}
    with pytest.raises(ValueError, match="offers"):
        class_gains(tabs["pre"], tabs["post"], tags)


def test_a_misconception_both_twins_offer_counts_both_forms_answers():
    """The real forms: paging-shrinks-weights is offered by item 1 (kv-throughput) of both
    forms (the twins offer the same misconceptions). On the pre-test the three phones on
    form B pick it and the three on form A are right: 3 of 6, each form's answers counted."""
    from classroom.vote_routes import gains_report

    c = Classroom("cls", forms=load_test_forms())
    ph = [c.join().pid for _ in range(6)]
    assert all("paging-shrinks-weights" in c.forms.form(f)[1].misconceptions for f in "AB")
    for phase in ("pre", "post"):
        c.start_test(phase)
        for p in ph:
            form = c.form_of(p, phase)
            for i, q in enumerate(c.forms.form(form)):
                wrong = phase == "pre" and form == "B" and i == 1
                c.answer_test(p, i, q.misconceptions.index("paging-shrinks-weights")
                              if wrong else q.correct)
        c.stop_test()
    rep = gains_report(c, "en")
    m = rep["result"]["misconceptions"]["paging-shrinks-weights"]
    assert m["pre"] == 50.0 and m["post"] == 0.0 and m["n_pre"] == m["n_post"] == 6
    name = rep["misconception_names"]["paging-shrinks-weights"]
    assert f"| {name} | 50% | 0% |" in rep["summary"]


def test_blank_answers_have_csv_rows_and_the_csv_agrees_with_the_gains():
    """Blanks count as wrong in the gains, so each has its CSV row (blank 1, no choice,
    correct 0); recomputing pre%, post%, matched, left out and blanks from the CSV alone
    gives the app's numbers."""
    import csv
    import io

    from classroom.gains import matched_line
    from classroom.vote_routes import gains_report

    c = Classroom("cls", forms=load_test_forms())
    ph = [c.join().pid for _ in range(6)]
    n = len(c.forms.pairs)
    skip = {("pre", 0): {2, 3}, ("pre", 1): {0}, ("post", 2): {6}}  # left blank
    for phase in ("pre", "post"):
        c.start_test(phase)
        for s, p in enumerate(ph):
            if phase == "post" and s == 5:
                continue  # took the pre-test only: left out
            items = c.forms.form(c.form_of(p, phase))
            for i, q in enumerate(items):
                if i not in skip.get((phase, s), ()):
                    c.answer_test(p, i, q.correct if (s + i) % 3 else (q.correct + 1) % 4)
        c.stop_test()
    rep = gains_report(c, "en")
    res = rep["result"]
    assert (res["matched"], res["unmatched"], res["blank"]) == (5, 1, 4)
    rows = [r for r in csv.DictReader(io.StringIO(c.export_csv()))
            if r["source"] in ("pre", "post")]
    blank = [r for r in rows if r["blank"] == "1"]
    assert len(rows) == (6 + 5) * n and len(blank) == 4
    assert all(r["choice"] == "" and r["correct"] == "0" and r["misconception"] == ""
               for r in blank)
    assert {r["student"] for r in blank} == {c.handle(ph[0]), c.handle(ph[1]), c.handle(ph[2])}
    assert not {r["student"] for r in rows} & set(c.phones)  # no bearer id in the CSV
    # the re-analysis: students in both tests, each one's score a share of its form's items
    took = {ph_: {r["student"] for r in rows if r["source"] == ph_} for ph_ in ("pre", "post")}
    both = took["pre"] & took["post"]
    score = {(ph_, s): 100 * sum(int(r["correct"]) for r in rows
                                 if r["source"] == ph_ and r["student"] == s) / n
             for ph_ in ("pre", "post") for s in both}
    for ph_ in ("pre", "post"):
        assert res[ph_] == pytest.approx(sum(score[(ph_, s)] for s in both) / len(both))
    assert len(both) == res["matched"] and len(took["pre"] ^ took["post"]) == res["unmatched"]
    assert sum(r["student"] in both for r in blank) == res["blank"]
    line = {"en": "Matched students: 5; left out: 1 (took only one test); "
                  "blank answers: 4 (counted as wrong)",
            "zh": "匹配的学生 5 人；未计入 1 人（只做了前测或后测中的一次）；留空未答 4 处（按答错计）"}
    for lang in ("zh", "en"):
        assert matched_line(res, lang) == line[lang]
        assert line[lang] in gains_report(c, lang)["summary"]


def test_hand_counts_with_nobody_counted_give_no_gain_not_zero():
    h = hand_gains({0: (0, 0)}, {0: (0, 0)})
    assert h["pre"] is None and h["post"] is None and h["g"] is None
    assert h["items"][0] == {"pre": None, "post": None, "g": None, "right_to_wrong": None}
    assert revisit_sentence(h, {}, {})["en"] == "No matched pre- and post-test yet."
    h = hand_gains({0: (5, 20)}, {0: (0, 0)})  # counted before, not after: still none
    assert h["pre"] == 25.0 and h["post"] is None and h["g"] is None


def test_the_pre_test_cannot_reopen_once_the_post_test_began():
    """The pre-test is the baseline: reopened after the post-test began, its answers could be
    changed by students who have seen the lesson."""
    c = Classroom("c", forms=load_test_forms())
    p = c.join().pid
    c.start_test("pre")
    c.answer_test(p, 0, 1)
    c.stop_test()
    c.start_test("pre")  # a pause and a restart before the post-test: allowed, answers kept
    assert c.tests["pre"].answers[p] == {0: 1}
    c.stop_test()
    c.start_test("post")
    c.stop_test()
    with pytest.raises(ValueError, match="post-test has started"):
        c.start_test("pre")
    assert c.open_test is None and c.tests["pre"].answers[p] == {0: 1}


def _item(qid: str, correct: int, tags: list) -> Question:
    return Question.from_dict({
        "id": qid, "kind": "test", "correct": correct,
        "question": {"zh": f"题 {qid}", "en": f"Item {qid}"},
        "choices": [{"zh": f"{qid} 选{i}", "en": f"{qid} c{i}", "misconception": m}
                    for i, m in enumerate(tags)]})


def test_per_form_and_per_order_means_and_a_one_form_tag_by_hand():
    """A hand-made class on hand-made forms of two items; "x" is offered by form B's item 1
    only. p0, p2 take A then B, p1, p3 B then A (join order); p4 takes the pre-test only.
    Scores (%), pre / post: p0 50 / 100, p1 50 / 50, p2 0 / 50, p3 50 / 100."""
    from classroom.gains import FORM_WORDS
    from classroom.vote_routes import gains_report
    from classroom.votes import Lessons, TestForm, packaged_lessons

    forms = TestForm([(_item("0:A", 0, [None, "w", "w", "z"]), _item("0:B", 2, ["w", "w", None, "z"])),
                      (_item("1:A", 1, ["y", None, "y", "y"]), _item("1:B", 3, ["x", "y", "y", None]))])
    c = Classroom("cls", forms=forms)
    p = [c.join().pid for _ in range(5)]
    assert [c.form_of(s, "pre") for s in p] == ["A", "B", "A", "B", "A"]
    picks = {"pre": [(0, 0), (2, 0), (1, 2), (0, 3), (0, 1)],  # (item 0, item 1) choices
             "post": [(2, 3), (0, 0), (2, 0), (0, 1)]}
    for phase, rows in picks.items():
        c.start_test(phase)
        for s, row in zip(p, rows):
            for i, choice in enumerate(row):
                c.answer_test(s, i, choice)
        c.stop_test()
    r = class_gains(**c.test_tables()._asdict())
    assert (r["matched"], r["unmatched"]) == (4, 1)
    assert (r["pre"], r["post"]) == (37.5, 75.0)
    assert r["forms"] == {"A": {"pre": 25.0, "n_pre": 2, "post": 75.0, "n_post": 2},
                          "B": {"pre": 50.0, "n_pre": 2, "post": 75.0, "n_post": 2}}
    assert r["orders"]["AB"] == {"n": 2, "pre": 25.0, "post": 75.0,
                                 "g": pytest.approx((75 - 25) / 75)}
    assert r["orders"]["BA"] == {"n": 2, "pre": 50.0, "post": 75.0, "g": 0.5}
    assert r["items"][0]["forms"] == {"A": {"pre": 50.0, "n_pre": 2, "post": 100.0, "n_post": 2},
                                      "B": {"pre": 50.0, "n_pre": 2, "post": 100.0, "n_post": 2}}
    assert r["items"][1]["forms"] == {"A": {"pre": 0.0, "n_pre": 2, "post": 50.0, "n_post": 2},
                                      "B": {"pre": 50.0, "n_pre": 2, "post": 50.0, "n_post": 2}}
    mis = r["misconceptions"]
    # x: only the two matched students who took form B could pick it, in each test (p1 did
    # before, p2 after): 1 of 2, not 1 of the 4 matched students' item 1
    assert (mis["x"]["pre"], mis["x"]["n_pre"], mis["x"]["post"], mis["x"]["n_post"]) == (
        50.0, 2, 50.0, 2)
    # y on item 1 of both forms: p0 and p2 before (2 of 4), p1 after (1 of 4)
    assert (mis["y"]["pre"], mis["y"]["n_pre"], mis["y"]["post"]) == (50.0, 4, 25.0)
    assert (mis["w"]["pre"], mis["w"]["post"]) == (50.0, 0.0) and "z" not in mis
    # the summary and the teacher's page read the same numbers, in zh and en
    real = packaged_lessons()
    lessons = Lessons(real.quiz, {"pairs": [{"idea": {"zh": "甲", "en": "one"}},
                                            {"idea": {"zh": "乙", "en": "two"}}]},
                      real.misconceptions)
    for lang, rows in (("zh", ["| A 卷 | 25% | 2 | 75% | 2 |", "| B 卷 | 50% | 2 | 75% | 2 |",
                               "| 先 A 卷后 B 卷 | 2 | 25% | 75% | 0.67 |",
                               "| 先 B 卷后 A 卷 | 2 | 50% | 75% | 0.50 |",
                               "A 0%/50% · B 50%/50%"]),
                       ("en", ["| Form A | 25% | 2 | 75% | 2 |", "| A then B | 2 | 25% | 75% | 0.67 |",
                               "| B then A | 2 | 50% | 75% | 0.50 |"])):
        summary = gains_report(c, lang, lessons)["summary"]
        assert all(row in summary for row in rows), summary
        assert FORM_WORDS[lang]["note"] in summary
    # without the forms (an older caller): no per-form or per-order means
    tabs = c.test_tables()._asdict()
    tabs.pop("forms")
    assert class_gains(**tabs)["forms"] == {} and class_gains(**tabs)["orders"] == {}
