"""The teacher's side of the class votes, in Streamlit: the projector panel and the buttons
that open a phone round from a class-plan prediction or a self-test item.

The class server keeps every vote (classroom/votes.py); this module only calls its
teacher routes (/v1/servelab/votes/..., with the teacher's admin key) and draws what they
return with app/components/votes.py. The Classroom page `attach`es its running server here
(one class per app process, like the Classroom page's own state), so the class plan and the
self-test pages can open a round on the same server.

The pre/post test's two forms (lessons/pretest.json) are held out of the rounds: the
Classroom page's picker offers the self-test's items only when they are not test items (none
is; an item whose id or question a test item shares would be left out), so it never offers or
defaults to one. A round opened on a test item anyway (through the API) comes back marked by
the class server (`on_test_item`, with its warning), and the panel shows that warning, in zh
or en, for as long as the round is current.
"""

from __future__ import annotations

import time

import httpx
import streamlit as st

from app.class_timeline import md_escape
from app.components.votes import count_html, gains_html, reveal_html
from app.i18n import get_lang
from classroom.votes import TestForm, load_test_forms, packaged_lessons, quiz_question

_SERVER = {"url": None, "headers": {}}
# a why round's answer (app/why_round.py), kept on this side until the reveal: qid -> index of
# the engine's reason
WHY_ANSWERS = "why_round_answers"

S = {
    "panel": {"zh": "课堂投票（手机）", "en": "Class vote (phones)"},
    "open": {"zh": "在手机上开一轮投票", "en": "Open as a phone round"},
    "opened": {"zh": "已在手机上开放：看课堂页的投影。", "en": "Open on the phones: see the Classroom page."},
    "no_class": {"zh": "先在课堂页启动课堂服务器，才能在手机上投票。",
                 "en": "Start the class server on the Classroom page to vote from phones."},
    "pick": {"zh": "自测题", "en": "Self-test item"},
    "seconds": {"zh": "时长（秒）", "en": "Time (s)"},
    "lock": {"zh": "锁定", "en": "Lock"},
    "extend": {"zh": "再给 30 秒", "en": "30 s more"},
    "revote": {"zh": "讨论后再投", "en": "Revote after discussion"},
    "reveal": {"zh": "揭晓", "en": "Reveal"},
    "share_toggle": {"zh": "锁定后在本屏显示答对比例（投影时请关闭）",
                     "en": "After the lock, show the share right on this screen (off while "
                           "projecting)"},
    "share_now": {"zh": "仅供老师：答对 {p}%", "en": "For the teacher: {p}% right"},
    "show_name": {"zh": "显示 {name}", "en": "show {name}"},
    "hide_q": {"zh": "从投影上隐藏题目", "en": "Hide the question from the projector"},
    "show_q": {"zh": "在投影上显示题目", "en": "Show the question on the projector"},
    "hand": {"zh": "手动计数（举手或纸条），用逗号分隔每个选项的人数",
             "en": "Counts by hand (show of hands or paper), one per choice, comma-separated"},
    "hand_save": {"zh": "记下手动计数", "en": "Use these counts"},
    "test": {"zh": "前测与后测", "en": "Pre-test and post-test"},
    "start_pre": {"zh": "开始前测", "en": "Start the pre-test"},
    "start_post": {"zh": "开始后测", "en": "Start the post-test"},
    "stop_test": {"zh": "结束测验", "en": "End the test"},
    "answered": {"zh": "已作答的手机：{a}", "en": "Phones that answered: {a}"},
    "words": {"zh": "屏蔽词（每行一个，中英文皆可）：含有这些词的昵称在投影上显示为 ***",
              "en": "Masked words (one a line, zh or en): nicknames holding one show as ***"},
    "words_save": {"zh": "保存屏蔽词", "en": "Save the word list"},
    "nicks": {"zh": "投影上的昵称（点一下在座位、KV 块、学生列表、问题和投票中隐藏，再点显示）",
              "en": "Nicknames on the projector (click to hide one in the seats, KV blocks, "
                    "students, questions and votes; click again to show it)"},
    "gains": {"zh": "课堂的学习收获", "en": "What the class gained"},
    "csv": {"zh": "导出 CSV（化名）", "en": "Export CSV (pseudonymous)"},
    "csv_nick": {"zh": "导出 CSV（含昵称，仅限教师）", "en": "Export CSV with nicknames (teacher only)"},
    "summary": {"zh": "导出一页总结", "en": "Export the one-page summary"},
    "no_gains_yet": {"zh": "现在已经可以导出作答记录（CSV）；做完后测，这里会显示全班的学习收获。",
                     "en": "The answers can be exported (CSV) now; after the post-test, the "
                           "class's gains show here."},
    "feel": {"zh": "学生的自我感受与学到了多少不是一回事，这里不显示为结果。",
             "en": "How students feel about a lesson is not what they learned; it is never shown as the result."},
    "error": {"zh": "课堂服务器拒绝了：{m}", "en": "The class server refused: {m}"},
    "drawn": {"zh": "重绘用时 {ms} 毫秒", "en": "drawn in {ms} ms"},
}


def tr(key: str, **fmt) -> str:
    text = S[key].get(get_lang()) or S[key]["en"]
    return text.format(**fmt) if fmt else text


def attach(url: str | None, headers: dict | None = None) -> None:
    """The Classroom page's running server (None when it stops)."""
    _SERVER["url"], _SERVER["headers"] = url, dict(headers or {})


def attached() -> bool:
    return _SERVER["url"] is not None


def call(method: str, op: str, timeout: float = 5.0, **body) -> dict | str | None:
    """A teacher route; a refusal is shown on the page and None returned."""
    url = f"{_SERVER['url']}/v1/servelab/votes/{op}"
    try:
        r = httpx.request(method, url, headers=dict(_SERVER["headers"],
                                                    **{"Accept-Language": get_lang()}),
                          params={"lang": get_lang()}, json=body if method == "POST" else None,
                          timeout=timeout)
    except httpx.HTTPError as exc:
        st.error(tr("error", m=type(exc).__name__))
        return None
    if r.status_code != 200:
        try:
            msg = r.json()["error"]["message"]
        except Exception:
            msg = f"HTTP {r.status_code}"
        st.error(tr("error", m=msg))
        return None
    return r.text if op.endswith(".csv") else r.json()


def quiz_payload(q) -> dict:
    """A self-test Question (app/lessons.py) as a round's question."""
    return {"id": q.id, "kind": "selftest", "correct": q.answer,
            "question": {"zh": q.question.zh, "en": q.question.en},
            "explanation": {"zh": q.explanation.zh, "en": q.explanation.en},
            "choices": [{"zh": c.zh, "en": c.en, **({"why": {"zh": q.why(i).zh, "en": q.why(i).en}}
                                                     if q.why(i) else {})}
                        for i, c in enumerate(q.choices)]}


def prediction_payload(stop) -> dict:
    """A class-plan stop's prediction: ranges, its answer measured later by the engine."""
    p = stop.prediction
    return {"id": stop.id, "kind": "prediction", "correct": None,
            "question": {"zh": p.question.zh, "en": p.question.en},
            "choices": [{"zh": c.zh, "en": c.en} for c in p.choices]}


def open_button(payload: dict, key: str, seconds: int = 90) -> None:
    """'Open as a phone round' under a question; a note when no class server runs."""
    if not attached():
        return
    st.button(tr("open"), key=f"vote_open_{key}", on_click=_open, args=(payload, seconds))


def test_forms() -> TestForm | None:
    """The pre/post test's forms as the class server loads them (None if they do not load:
    then the picker holds nothing back, and the server says what is wrong)."""
    try:
        return load_test_forms(packaged_lessons())
    except (ValueError, KeyError, TypeError):
        return None


def round_choices() -> list[str]:
    """The ids of the self-test items the round picker offers: every one that is not a test
    item (by id or question text, `TestForm.holds`), in the self-test's order."""
    lessons, forms = packaged_lessons(), test_forms()
    return [q["id"] for q in lessons.quiz["questions"]
            if forms is None or forms.holds(quiz_question(q)) is None]


def test_item_warning(state: dict | None) -> str | None:
    """The class server's warning for a current round on a pre/post test item, if any."""
    r = (state or {}).get("round") if isinstance(state, dict) else None
    return (r or {}).get("test_item_warning")


def open_round(payload: dict, seconds: int = 90) -> None:
    """Open a round on the attached class server now (a button's action, not its callback)."""
    _open(payload, seconds)


def _open(payload: dict, seconds: int) -> None:
    state = call("POST", "open", question=payload, seconds=seconds)
    if state is not None:
        st.toast(tr("opened"))
        if test_item_warning(state):
            st.warning(test_item_warning(state))


def projector(measured: dict | None = None) -> None:
    """The panel on the Classroom page: the open round, its controls, the tests, the gains.
    `measured` is the class plan's reveals: a stop's id -> (measured value, index of the
    range it fell in)."""
    if not attached():
        return
    lang = get_lang()
    st.subheader(tr("panel"))

    @st.fragment(run_every=0.5)
    def live():
        t0 = time.perf_counter()
        state = call("GET", "state", timeout=2.0)
        if not isinstance(state, dict):
            return
        r = state.get("round")
        if test_item_warning(state):  # a round opened on a test item (through the API)
            st.warning(test_item_warning(state))
        if r:
            st.html(count_html(state, lang) if r["state"] == "open" else
                    count_html(state, lang) + reveal_html(state, lang))
            a, b, c, d, e = st.columns(5)
            if r["state"] == "open":
                a.button(tr("lock"), key="vote_lock", on_click=call, args=("POST", "lock"))
                b.button(tr("extend"), key="vote_extend", on_click=call,
                         args=("POST", "extend"), kwargs={"seconds": 30})
            if r["state"] == "locked":
                if r["number"] == 1:
                    a.button(tr("revote"), key="vote_revote", on_click=call,
                             args=("POST", "revote"), kwargs={"seconds": 90})
                b.button(tr("reveal"), key="vote_reveal", on_click=call, args=("POST", "reveal"),
                         kwargs=_measured(r, measured))
            c.button(tr("show_q" if r.get("hidden") else "hide_q"), key="vote_hide_q",
                     on_click=call, args=("POST", "hide"), kwargs={"hidden": not r.get("hidden")})
            # the share right before the reveal: for the teacher's eyes, off the projector
            # unless asked for (a class that sees it before discussing drifts toward it)
            if r["state"] == "locked" and st.session_state.get("vote_show_share") \
                    and r.get("share_right") is not None:
                st.caption(tr("share_now", p=round(100 * r["share_right"])))
        st.toggle(tr("share_toggle"), key="vote_show_share")
        names = state.get("names") or []
        if names:  # one click hides a name everywhere it is projected; a second shows it
            st.caption(tr("nicks"))
            cols = st.columns(min(6, len(names)))
            for i, n in enumerate(names[:48]):
                name = md_escape(n["name"])  # a name of stars is no rule, `<b>` no tag
                label = tr("show_name", name=name) if n["hidden"] else name
                cols[i % len(cols)].button(label, key=f"vote_nick_{i}", on_click=call,
                                           args=("POST", "hide"),
                                           kwargs={"handle": n["handle"],
                                                   "hidden": not n["hidden"]})
        st.caption(tr("drawn", ms=f"{1000 * (time.perf_counter() - t0):.0f}"))

    live()
    from app.lessons import load_quiz

    quiz = load_quiz()
    qs = {q.id: q for q in quiz.questions}
    # the pre/post test's items are never offered (so never the default): the first item
    # offered is (none when every item were a test item)
    ids = [i for i in round_choices() if i in qs]
    a, b, c = st.columns([3, 1, 1])
    pick = a.selectbox(tr("pick"), ids, index=0 if ids else None,
                       format_func=lambda i: qs[i].question.get(lang), key="vote_pick")
    secs = b.number_input(tr("seconds"), 10, 600, 90, step=10, key="vote_secs")
    c.button(tr("open"), key="vote_open_pick", on_click=_open, disabled=pick is None,
             args=(quiz_payload(qs[pick]) if pick else None, int(secs)))
    state = call("GET", "state")
    with st.form("vote_hand_form"):
        st.text_input(tr("hand"), key="vote_hand")
        st.form_submit_button(tr("hand_save"), on_click=_hand, key="vote_hand_save")
    with st.expander(tr("test")):
        a, b, c = st.columns(3)
        a.button(tr("start_pre"), key="vote_pre", on_click=call, args=("POST", "test/start"),
                 kwargs={"phase": "pre"})
        b.button(tr("start_post"), key="vote_post", on_click=call,
                 args=("POST", "test/start"), kwargs={"phase": "post"})
        c.button(tr("stop_test"), key="vote_stop_test", on_click=call,
                 args=("POST", "test/stop"))
        if isinstance(state, dict):
            st.caption(tr("answered", a=state["test"]["answered"]))
        words = call("GET", "words")
        st.text_area(tr("words"), "\n".join((words or {}).get("words", [])), key="vote_words")
        st.button(tr("words_save"), key="vote_words_save", on_click=_words)
    gains_section()


def _measured(r: dict, measured: dict | None) -> dict:
    """A prediction's reveal: the range the engine landed in and its value, once measured;
    for a why round (app/why_round.py), the engine's reason kept on this side."""
    if r["kind"] == "prediction" and r["qid"] in st.session_state.get(WHY_ANSWERS, {}):
        index = st.session_state[WHY_ANSWERS][r["qid"]]
        return {"correct": index}
    if r["kind"] != "prediction" or r["qid"] not in (measured or {}):
        return {}
    from app.classplan import stop_by_id

    value, index = measured[r["qid"]]
    return {"correct": index, "measured": stop_by_id(r["qid"]).prediction.value_fmt.format(value)}


def _hand() -> None:
    raw = st.session_state.get("vote_hand", "")
    try:
        counts = [int(x) for x in raw.replace("，", ",").split(",") if x.strip()]
    except ValueError:
        counts = []  # the server names what it needs
    call("POST", "hand", counts=counts)


def _words() -> None:
    text = st.session_state.get("vote_words", "")
    call("POST", "words", words=[w.strip() for w in text.splitlines() if w.strip()])


def gains_section() -> None:
    """The class's gain after the post-test, and the exports: the CSV as soon as it holds a
    row (a pre-test's answer, a round's ballot), the one-page summary once there are gains."""
    if not attached():
        return
    lang = get_lang()
    report = call("GET", "gains")
    csv_text = call("GET", "export.csv")
    has_gains = isinstance(report, dict) and report["result"].get("pre") is not None
    has_rows = isinstance(csv_text, str) and len(csv_text.strip().splitlines()) > 1
    if not (has_gains or has_rows):
        return
    st.subheader(tr("gains"))
    if has_gains:
        st.html(gains_html(report, lang))
        st.caption(tr("feel"))
    else:
        st.caption(tr("no_gains_yet"))
    a, b, c = st.columns(3)
    if has_rows:
        a.download_button(tr("csv"), csv_text, "class-votes.csv", "text/csv", key="vote_csv")
    if has_gains:
        b.download_button(tr("summary"), report["summary"], "class-summary.md", "text/markdown",
                          key="vote_summary")
    if has_rows and c.toggle(tr("csv_nick"), key="vote_csv_nick_on"):
        r = httpx.get(f"{_SERVER['url']}/v1/servelab/votes/export.csv",
                      params={"nicknames": 1}, headers=_SERVER["headers"], timeout=5)
        if r.status_code == 200:
            c.download_button(tr("csv_nick"), r.text, "class-votes-teacher.csv", "text/csv",
                              key="vote_csv_nick")
