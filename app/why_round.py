"""'Why is this request waiting?' as a phone round, answered by the engine itself.

From the class server's newest step report (the Classroom page's live view), the request at
the head of the queue and the reason the scheduler gave it this step (engine/waits.py) become
a question for the phones: four reasons to choose from, the engine's among them. The round
opens as a prediction (`correct` None), so the class server holds no answer and no phone or
projector can show one before the reveal; the answer stays on the teacher's side
(`st.session_state[app.votes_panel.WHY_ANSWERS]`) and goes to the server only with the
reveal, as the index of the right choice (no measured text: the right choice is the engine's
reason, which every screen shows in its own language). The choices are the reasons' short
names (app/i18n.py `wait.<code>`), in zh and en; the other three are drawn from the reasons a
request at the door can have, the same for the same step.
"""

from __future__ import annotations

import random

from app.i18n import STRINGS

# a request at the door with a reason of its own (not "behind the head", not a running
# prompt's chunk): what the class chooses from
DOOR_CODES = ("seats_full", "token_budget", "kv_short", "kv_fragmented", "bus_running",
              "preempted")
CHOICES = 4

STRINGS.update({
    "why.ask": {"zh": "问全班：队首的请求为什么在等？",
                "en": "Ask the class: why is the request at the head of the queue waiting?"},
    "why.none": {"zh": "这一步门口没有自己有原因在等的请求。",
                 "en": "No request waits at the door for a reason of its own this step."},
    "why.question": {"zh": "第 {step} 步：门口排在最前面的请求（{who}）还没上车。为什么？",
                     "en": "Step {step}: the request first at the door ({who}) has not "
                           "boarded. Why?"},
})


def head_wait(report: dict) -> tuple[str, dict] | None:
    """The first request in the queue whose wait is its own (a DOOR_CODES code): (its id,
    its wait), or None."""
    waits = report.get("waits") or {}
    for rid in report.get("waiting") or []:
        w = waits.get(rid)
        if w and w.get("code") in DOOR_CODES:
            return rid, w
    return None


def why_question(report: dict, who_of) -> tuple[dict, int] | None:
    """The round's question for the step `report` (a dict as the step stream sends it) and the
    engine's answer, kept apart: (payload for the class server, index of its reason);
    None when no request at the door has a reason of its own. `who_of(request id)`: its name
    as the projector shows it (masked)."""
    head = head_wait(report)
    if head is None:
        return None
    rid, wait = head
    who = who_of(rid)
    step, code = int(report["step"]), wait["code"]
    others = [c for c in DOOR_CODES if c != code]
    drawn = random.Random(step).sample(others, CHOICES - 1)
    codes = [c for c in DOOR_CODES if c == code or c in drawn]  # in one fixed order
    index = codes.index(code)

    def text(key: str, lang: str, **fmt) -> str:
        return STRINGS[key][lang].format(**fmt)

    payload = {"id": f"why-{step}", "kind": "prediction", "correct": None,
               "question": {lang: text("why.question", lang, step=step, who=who)
                            for lang in ("zh", "en")},
               "choices": [{lang: STRINGS[f"wait.{c}"][lang] for lang in ("zh", "en")}
                           for c in codes]}
    return payload, index


def ask_button(report: dict | None, who_of, key: str = "why_ask") -> None:
    """The Classroom page's button: opens the round on the class server (app/votes_panel.py)
    and keeps the engine's answer here for the reveal. `who_of(request id)`: its masked name."""
    import streamlit as st

    from app.i18n import t
    from app.votes_panel import WHY_ANSWERS, attached, open_round

    if not attached() or report is None:
        return
    made = why_question(report, who_of)
    if made is None:
        st.caption(t("why.none"))
        return
    if st.button(t("why.ask"), key=key):
        payload, index = made
        st.session_state.setdefault(WHY_ANSWERS, {})[payload["id"]] = index
        open_round(payload)
