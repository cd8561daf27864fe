"""The quiz, glossary and beyond pages driven by streamlit's AppTest (no model, no browser)."""

import pathlib
import sys

import pytest
from streamlit.testing.v1 import AppTest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.lessons import load_quiz  # noqa: E402

QUIZ = str(ROOT / "app/pages/quiz.py")
GLOSSARY = str(ROOT / "app/pages/glossary.py")
BEYOND = str(ROOT / "app/pages/beyond.py")


def run(path: str, lang: str | None = "zh") -> AppTest:
    at = AppTest.from_file(path, default_timeout=30)
    if lang:
        at.session_state["lang"] = lang
    return at.run()


def answer(at: AppTest, qid: str, choice: int) -> AppTest:
    at.radio(key=f"quiz_{qid}_choice").set_value(choice)
    at.button(key=f"quiz_{qid}_submit").click()
    return at.run()


def scores(at: AppTest) -> list[str]:
    """The chapter and extra scores (the page's two metrics)."""
    return [m.value for m in at.metric][:2]


def test_quiz_starts_at_zero():
    at = run(QUIZ)
    assert not at.exception
    quiz = load_quiz()
    assert scores(at) == ["0 / 5", f"0 / {len(quiz.extra)}"]


def test_all_five_chapter_answers_right_shows_5_of_5():
    at = run(QUIZ)
    for q in load_quiz().chapter:
        at = answer(at, q.id, q.answer)
    assert not at.exception
    assert scores(at)[0] == "5 / 5"
    assert len(at.success) == 5


def test_a_wrong_answer_shows_the_explanation_and_demo_link_and_can_be_retried():
    at = run(QUIZ)
    q = load_quiz().by_id("ch4")
    wrong = (q.answer + 1) % 4
    at = answer(at, q.id, wrong)
    assert scores(at)[0] == "0 / 5"
    assert any(q.why(wrong).zh[:30] in e.value for e in at.error), "why this choice is wrong"
    assert any(q.explanation.zh[:30] in i.value for i in at.info)
    assert any(q.demo.url in m.value for m in at.markdown), "the demo link is missing"
    at.button(key=f"quiz_{q.id}_retry").click()
    at = at.run()
    assert not at.error
    assert at.radio(key=f"quiz_{q.id}_choice").value is None
    at = answer(at, q.id, q.answer)
    assert scores(at)[0] == "1 / 5"


def test_submit_without_a_choice_warns():
    at = run(QUIZ)
    at.button(key="quiz_ch1_submit").click()
    at = at.run()
    assert at.warning and scores(at)[0] == "0 / 5"


def test_reset_all_clears_progress():
    at = run(QUIZ)
    quiz = load_quiz()
    at = answer(at, "ch1", quiz.by_id("ch1").answer)
    extra = quiz.extra[0]
    at = answer(at, extra.id, extra.answer)
    assert scores(at) == ["1 / 5", f"1 / {len(quiz.extra)}"]
    at.button(key="quiz_reset_all").click()
    at = at.run()
    assert scores(at) == ["0 / 5", f"0 / {len(quiz.extra)}"]


def test_switching_language_changes_the_quiz_text():
    q = load_quiz().by_id("ch1")
    at = run(QUIZ, "zh")
    assert any(q.question.zh in m.value for m in at.markdown)
    at.session_state["lang"] = "en"
    at = at.run()
    texts = [m.value for m in at.markdown]
    assert any(q.question.en in v for v in texts)
    assert not any(q.question.zh in v for v in texts)
    assert at.title[0].value == "Self-test"


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_glossary_loads_and_search_filters(lang):
    at = run(GLOSSARY, lang)
    assert not at.exception
    full = at.caption[-1].value
    at.text_input(key="glossary_search").input("TTFT")
    at = at.run()
    filtered = at.caption[-1].value
    assert full != filtered
    assert "TTFT" in " ".join(m.value for m in at.markdown)
    assert "PagedAttention" not in " ".join(m.value for m in at.markdown)
    at.text_input(key="glossary_search").input("zzz-no-such-term")
    at = at.run()
    assert at.info, "an empty search result should say so"


def test_beyond_page_renders_its_lesson_and_try_it_links():
    at = run(BEYOND, "en")
    assert not at.exception
    text = " ".join(m.value for m in at.markdown)
    assert "shelf life" in text.lower()
    assert "/dashboard?batching=static&kv_layout=contiguous&spec=off" in text


def test_language_defaults_to_chinese_without_a_choice():
    at = run(QUIZ, lang=None)
    assert not at.exception
    assert at.session_state["lang"] == "zh"


def test_each_wrong_choice_explains_its_own_misconception():
    q = load_quiz().by_id("ch2")
    shown = set()
    for wrong in (i for i in range(4) if i != q.answer):
        at = answer(run(QUIZ, "en"), q.id, wrong)
        errors = " ".join(e.value for e in at.error)
        assert q.why(wrong).en in errors
        shown.add(errors)
    assert len(shown) == 3, "each wrong choice gets its own feedback"


def test_every_question_shows_the_why_of_a_wrong_choice():
    """Answer every question wrongly (a different wrong choice each time): each one shows the
    misconception behind the chosen option, not only the general explanation."""
    quiz = load_quiz()
    at = run(QUIZ, "en")
    for n, q in enumerate(quiz.questions):
        wrong = [i for i in range(4) if i != q.answer][n % 3]
        at = answer(at, q.id, wrong)
        assert not at.exception
        errors = " ".join(e.value for e in at.error)
        assert q.why(wrong).en in errors, f"{q.id}: the why of choice {wrong} is not shown"


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_self_test_page_shows_no_item_of_the_pre_post_test(lang):
    """Both forms of the class's pre/post test are held out of the Self-test page: none of
    their questions or choices is on it (it keeps its own items, quiz.json), and it says the
    test is taken on phones."""
    from classroom.votes import load_test_forms

    forms = load_test_forms()
    at = run(QUIZ, lang)
    assert not at.exception
    page = " ".join([x.value for x in at.markdown] + [x.value for x in at.caption]
                    + [o for r in at.radio for o in map(str, r.options)])
    for q in forms.items():
        assert q.text[lang] not in page, q.qid
        assert not [c[lang] for c in q.choices if c[lang] in page], q.qid
    assert ("手机上做" if lang == "zh" else "taken on phones") in page
    assert not [b.key for b in at.button if b.key and b.key.startswith(("quiz_save", "quiz_post"))]


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_chapters_five_questions_are_also_open_prompts(lang):
    """Below the scored items, the chapter's five self-test questions come back as open prompts
    for a class discussion, in the page's language."""
    prompts = load_quiz().open_prompts
    assert len(prompts) == 5
    at = run(QUIZ, lang)
    assert at.subheader[-1].value == ("讨论题：本章的五个问题，开放作答" if lang == "zh"
                                      else "For discussion: the chapter's five questions, "
                                           "open-ended")
    shown = at.markdown[-1].value
    for n, p in enumerate(prompts, 1):
        assert f"{n}. {p.get(lang)}" in shown
    other = "en" if lang == "zh" else "zh"
    assert prompts[0].get(other) not in shown
