"""Quiz page: the chapter's five self-test questions, our extra set, then the chapter's five
as open discussion prompts (lessons/quiz.json).

Running scores ("N / 5" and "M / K"), one radio + submit per question, feedback with the
explanation and a link to the live page that shows the answer, a retry per question and a
"reset all". Progress lives in `st.session_state["quiz_answers"]` ({question id: chosen index})
for the browser session. Widget keys: quiz_<id>_choice, quiz_<id>_submit, quiz_<id>_retry.

The class's pre/post test (lessons/pretest.json, both forms) is not on this page: it is held
out of everything the class sees between the two tests, so no self-test item is a test item
and this page shows none of the test's questions or keys. The class server gives its two
forms to phones, counterbalanced.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app.components.lesson import demo_link, describe_switches  # noqa: E402
from app.i18n import get_lang, language_selector, t  # noqa: E402
from app.lessons import Question, load_quiz  # noqa: E402
from app.votes_panel import open_button, quiz_payload  # noqa: E402

ANSWERS = "quiz_answers"


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
    st.caption(t("quiz.tests_elsewhere"))

    st.subheader(t("quiz.chapter_set"))
    for n, q in enumerate(chapter, start=1):
        draw_question(q, n, lang)
    st.subheader(t("quiz.extra_set"))
    for n, q in enumerate(extra, start=len(chapter) + 1):
        draw_question(q, n, lang)
    if quiz.open_prompts:
        st.subheader(t("quiz.open_set"))
        st.caption(t("quiz.open_intro"))
        st.markdown("\n".join(f"{n}. {p.get(lang)}" for n, p in enumerate(quiz.open_prompts, 1)))


main()
