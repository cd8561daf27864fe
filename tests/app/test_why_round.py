"""'Why is this request waiting?' as a phone round (app/why_round.py): built from a real
engine's step report, answered at the reveal by the reason the scheduler gave, and nothing
of the answer in the class before the reveal."""

from __future__ import annotations

import json

from app.i18n import STRINGS
from app.why_round import DOOR_CODES, head_wait, why_question
from classroom.votes import Classroom, Question
from engine import SamplingParams
from tests.conftest import PROMPTS


def _crowded_step(eng) -> dict:
    """A step of the servers' small engine (its 8 seats) with ten requests: eight board, the
    ninth waits for a seat, the tenth behind it (the step stream's dict)."""
    seats = eng.config.max_num_seqs
    rids = [eng.add_request(PROMPTS[i % len(PROMPTS)], SamplingParams(max_tokens=2))
            for i in range(seats + 2)]
    report = eng.step().to_dict()
    while eng.has_unfinished():
        eng.step()
    for rid in rids:  # the shared engine is left empty, as every test leaves it
        eng.forget(rid)
    assert not eng.requests
    return json.loads(json.dumps(report))  # as it crosses the step stream


def test_the_round_asks_about_the_head_and_the_engine_answers_it(engine):
    report = _crowded_step(engine)
    head = head_wait(report)
    assert head is not None and head[1]["code"] == "seats_full", report["waits"]
    assert report["waits"][report["waiting"][1]]["code"] == "queued_behind"
    asked = []
    payload, index = why_question(report, lambda rid: asked.append(rid) or "小明")
    assert asked == [head[0]]  # the head's own name, masked by the caller
    codes = [next(c for c in DOOR_CODES if STRINGS[f"wait.{c}"]["en"] == ch["en"])
             for ch in payload["choices"]]
    assert len(set(codes)) == 4 and codes[index] == "seats_full"
    assert codes == [c for c in DOOR_CODES if c in codes]  # a fixed order, not the answer's
    assert all(ch["zh"] == STRINGS[f"wait.{c}"]["zh"] for c, ch in zip(codes, payload["choices"]))
    assert f"第 {report['step']} 步" in payload["question"]["zh"] and "小明" in payload["question"]["zh"]
    # the class server is handed no answer: a prediction, `correct` None, no why
    assert payload["kind"] == "prediction" and payload["correct"] is None
    assert why_question(report, lambda rid: "小明")[0] == payload  # the same step, the same round

    room = Classroom()
    phones = [room.join(nickname=f"p{i}").pid for i in range(3)]
    r = room.open_round(Question.from_dict(payload), seconds=60)
    for pid, choice in zip(phones, (index, (index + 1) % 4, index)):
        room.vote(pid, r.rid, choice)
    room.lock()
    for lang in ("zh", "en"):
        before = json.dumps([room.projector(lang), room.phone_view(phones[0], lang)])
        assert '"correct"' not in before and '"why"' not in before, before
    room.reveal(correct=index)
    view = room.projector("zh")["round"]
    assert view["correct"] == index and view["choices"][index] == "座位已满"
    assert view["counts"][index] == 2


def test_no_round_without_a_request_waiting_for_its_own_reason():
    report = {"step": 3, "waiting": ["a"], "waits": {"a": {"code": "queued_behind",
                                                             "position": 1}}}
    assert head_wait(report) is None and why_question(report, str) is None
    assert why_question({"step": 1, "waiting": [], "waits": {}}, str) is None
