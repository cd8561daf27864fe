"""Quiz page: the chapter's five self-test questions, our extra set, the parallel post-test,
then the chapter's five as open discussion prompts (lessons/quiz.json, lessons/pretest.json).

Running scores ("N / 5" and "M / K"), one radio + submit per question, feedback with the
explanation and a link to the live page that shows the answer, a retry per question and a
"reset all". Progress lives in `st.session_state["quiz_answers"]` ({question id: chosen index})
for the browser session. Widget keys: quiz_<id>_choice, quiz_<id>_submit, quiz_<id>_retry.

Before and after class: the pre-class score counts the self-test items that lessons/pretest.json
pairs (form A); the post-class score counts their twins (form B: the same idea, other numbers
and choices, the right answer elsewhere), answered in their own section (keys
quiz_post_<pair>_choice, quiz_post_<pair>_submit), so the post-test is not the pre-test
again with its key already shown. The class server gives the same two forms to phones,
counterbalanced.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.components.lesson import demo_link, describe_switches  # noqa: E402
from app.i18n import get_lang, language_selector, t  # noqa: E402
from app.lessons import Question, load_quiz  # noqa: E402
from app.votes_panel import open_button, quiz_payload  # noqa: E402
from classroom.votes import (  # noqa: E402
    load_misconceptions,
    load_test_forms,
    packaged_lessons,
)

ANSWERS = "quiz_answers"
POST_ANSWERS = "quiz_post_answers"  # {pair index: chosen index} for the form-B twins


def _choice_key(q: Question) -> str:
    return f"quiz_{q.id}_choice"


def _submit(q: Question) -> None:
    choice = st.session_state.get(_choice_key(q))
    if choice is None:
        st.session_state["quiz_warn"] = q.id
    else:
        st.session_state[ANSWERS][q.id] = choice


def _retry(q: Question) -> None:
    st.session_state[ANSWERS].pop(q.id, None)
    st.session_state.pop(_choice_key(q), None)


def _reset_all() -> None:
    for qid in list(st.session_state[ANSWERS]):
        st.session_state.pop(f"quiz_{qid}_choice", None)
    st.session_state[ANSWERS] = {}


def score(questions: tuple[Question, ...]) -> int:
    answers = st.session_state[ANSWERS]
    return sum(answers.get(q.id) == q.answer for q in questions)


ATTEMPTS = "quiz_attempts"


def paired_quiz_ids() -> list[str]:
    """The self-test items the pre-class score counts: form A of lessons/pretest.json."""
    return [p["A"]["quiz"] for p in packaged_lessons().pretest["pairs"]]


def _save_attempt(name: str) -> None:
    if name == "pre":
        quiz = {q.id: q for q in load_quiz().questions}
        answers = st.session_state[ANSWERS]
        got = sum(answers.get(qid) == quiz[qid].answer for qid in paired_quiz_ids())
    else:
        twins = load_test_forms().form("B")
        answers = st.session_state.get(POST_ANSWERS, {})
        got = sum(answers.get(i) == q.correct for i, q in enumerate(twins))
    st.session_state.setdefault(ATTEMPTS, {})[name] = got


def attempts() -> None:
    """A pre-class score (the paired self-test items) and a post-class score (their parallel
    twins), saved by the student and compared."""
    saved = st.session_state.get(ATTEMPTS, {})
    total = len(paired_quiz_ids())
    a, b, c, d = st.columns([1, 1, 1, 1], vertical_alignment="bottom")
    a.button(t("quiz.save_pre"), key="quiz_save_pre", on_click=_save_attempt, args=("pre",),
             help=t("quiz.save_pre.help"))
    b.button(t("quiz.save_post"), key="quiz_save_post", on_click=_save_attempt,
             args=("post",), help=t("quiz.save_post.help"))
    pre, post = saved.get("pre"), saved.get("post")
    c.metric(t("quiz.pre"), "—" if pre is None else f"{pre} / {total}")
    delta = None if pre is None or post is None else post - pre
    d.metric(t("quiz.post"), "—" if post is None else f"{post} / {total}", delta=delta)


def _submit_post(i: int) -> None:
    choice = st.session_state.get(f"quiz_post_{i}_choice")
    if choice is not None:
        st.session_state.setdefault(POST_ANSWERS, {})[i] = choice


def post_test(lang: str) -> None:
    """The form-B twins: one radio + submit each; the verdict names the misconception behind
    a wrong choice."""
    st.subheader(t("quiz.post_set"))
    st.caption(t("quiz.post_intro"))
    answers = st.session_state.setdefault(POST_ANSWERS, {})
    names = load_misconceptions()
    for i, q in enumerate(load_test_forms().form("B")):
        with st.container(border=True):
            st.markdown(f"**{i + 1}. {q.text[lang]}**")
            chosen = answers.get(i)
            if chosen is None:
                st.radio(t("quiz.choose"), range(len(q.choices)), index=None,
                         format_func=lambda j, q=q: q.choices[j][lang],
                         key=f"quiz_post_{i}_choice", label_visibility="collapsed")
                st.button(t("quiz.submit"), key=f"quiz_post_{i}_submit", on_click=_submit_post,
                          args=(i,))
                continue
            for j, choice in enumerate(q.choices):
                mark = "✅" if j == q.correct else ("❌" if j == chosen else "▫️")
                note = f" — *{t('quiz.your_answer')}*" if j == chosen else ""
                st.markdown(f"{mark} {choice[lang]}{note}")
            if chosen == q.correct:
                st.success(t("quiz.correct"))
            else:
                why = names.get(q.misconceptions[chosen] or "", {}).get(lang, "")
                st.error(f"{t('quiz.incorrect')} {t('quiz.why_not')} {why}")


def draw_question(q: Question, number: int, lang: str) -> None:
    with st.container(border=True):
        st.markdown(f"**{number}. {q.question.get(lang)}**")
        open_button(quiz_payload(q), f"quiz_{q.id}")
        chosen = st.session_state[ANSWERS].get(q.id)
        if chosen is None:
            st.radio(
                t("quiz.choose"),
                range(len(q.choices)),
                index=None,
                format_func=lambda i: q.choices[i].get(lang),
                key=_choice_key(q),
                label_visibility="collapsed",
            )
            st.button(t("quiz.submit"), key=f"quiz_{q.id}_submit", on_click=_submit, args=(q,))
            if st.session_state.get("quiz_warn") == q.id:
                st.warning(t("quiz.pick_first"))
                st.session_state.pop("quiz_warn")
            return
        for i, choice in enumerate(q.choices):
            mark = "✅" if i == q.answer else ("❌" if i == chosen else "▫️")
            note = f" — *{t('quiz.your_answer')}*" if i == chosen else ""
            st.markdown(f"{mark} {choice.get(lang)}{note}")
        verdict = t("quiz.correct") if chosen == q.answer else t("quiz.incorrect")
        why = q.why(chosen)
        if why is not None:  # the misconception behind this wrong choice, first
            st.error(f"{verdict} {t('quiz.why_not')} {why.get(lang)}")
            st.info(q.explanation.get(lang))
        else:
            box = st.success if chosen == q.answer else st.error
            box(f"{verdict} {q.explanation.get(lang)}")
        label = f"{t('quiz.try_demo')} — {t(f'page.{q.demo.page}')}"
        if q.demo.switches:
            label += f": {describe_switches(q.demo.switches)}"
        demo_link(label, q.demo)
        st.button(t("quiz.retry"), key=f"quiz_{q.id}_retry", on_click=_retry, args=(q,))


def main() -> None:
    language_selector()
    lang = get_lang()
    quiz = load_quiz()
    st.session_state.setdefault(ANSWERS, {})

    st.title(t("page.quiz"))
    st.caption(t("plan.scale"))
    st.caption(t("quiz.intro"))
    left, right, reset = st.columns([2, 2, 1], vertical_alignment="bottom")
    chapter, extra = quiz.chapter, quiz.extra
    left.metric(t("quiz.score_chapter"), f"{score(chapter)} / {len(chapter)}")
    right.metric(t("quiz.score_extra"), f"{score(extra)} / {len(extra)}")
    reset.button(t("quiz.reset_all"), key="quiz_reset_all", on_click=_reset_all)
    attempts()

    st.subheader(t("quiz.chapter_set"))
    for n, q in enumerate(chapter, start=1):
        draw_question(q, n, lang)
    st.subheader(t("quiz.extra_set"))
    for n, q in enumerate(extra, start=len(chapter) + 1):
        draw_question(q, n, lang)
    post_test(lang)
    if quiz.open_prompts:
        st.subheader(t("quiz.open_set"))
        st.caption(t("quiz.open_intro"))
        st.markdown("\n".join(f"{n}. {p.get(lang)}" for n, p in enumerate(quiz.open_prompts, 1)))


main()
