"""A class voting on one class server: real phones (chromium, zh-CN and en-US) and lightweight
phones (httpx, doing what the students' page does), with the teacher's Classroom page open on
the projector, all on this machine (`benchmarks.classroom`'s `votes` scenario).

The teacher's page connects and a phone round from the self-test opens over the teacher's vote
route. Each chromium phone opens the students' page (its Ask button in the phone's language,
the round's choices drawn); each light phone gets its phone token, joins and polls the round
once a second, and some ask a question, so the engine works during the votes. Votes go one at
a time, each until the projector's count (`data-voted` on the teacher's page) shows it, then
the rest at once. What must hold: every phone joined and shown the round, every vote on the
projector (each within 10 s, all of them at the end, each counted once), every answer
finished, no page error, and the page said how long its redraws took. make test runs a class
of twelve; make test-soak the class of sixty, whose timings `python -m benchmarks.classroom
votes` writes as figures (a shared machine's load moves them: they are not asserted).
"""

from __future__ import annotations

import pytest

from benchmarks.classroom import run_votes

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("phones,real,asking,timed", [
    (12, 3, 4, 4), pytest.param(60, 5, 10, 10, marks=pytest.mark.soak)],
    ids=["twelve", "sixty"])
def test_a_class_of_phones_votes(tmp_path, chromium, phones, real, asking, timed):
    seen = run_votes(phones, tmp_path, browser_phones=real, asking=asking, timed_light=timed,
                     browser=chromium)
    assert seen["round_drawn"], "the projector showed no round"
    assert seen["light_joined"] == phones - real, seen["light_errors"][:3]
    assert not seen["light_errors"], seen["light_errors"][:3]
    for locale, label in seen["asked_labels"]:  # each real phone in its own language
        assert label == ("提问" if locale == "zh-CN" else "Ask"), (locale, label)
    assert seen["votes_missed"] == [], f"votes never reached the projector: {seen['votes_missed']}"
    assert seen["all_in_s"] is not None, f"the projector stopped at {seen['projector_count']}"
    assert seen["state"]["round"]["voted"] == phones, seen["state"]["round"]
    # every answer finished: the real phones show theirs, the light ones streamed to the end
    assert len(seen["phone_answers"]) == real and all(seen["phone_answers"])
    assert not seen["phone_errors"], seen["phone_errors"]
    assert len(seen["light_answers"]) == asking and all(
        a["type"] == "done" for a in seen["light_answers"]), seen["light_answers"]
    assert seen["page_exceptions"] == 0
    assert seen["redraw_live"], "the teacher's live view never said how long it took"
    assert seen["redraw_votes"], "the vote panel never said how long it took"
