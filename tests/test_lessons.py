"""Lessons, quiz and glossary data (app/lessons.py, lessons/): complete, valid, our own words."""

import copy
import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.i18n import LANGS, STRINGS  # noqa: E402
from app.lessons import (  # noqa: E402
    LESSON_PAGES,
    LESSONS_DIR,
    PAGES,
    SWITCHES,
    TRY_IT_HEADINGS,
    demo_url,
    lesson_try_it,
    load_glossary,
    load_lesson,
    load_quiz,
    parse_glossary,
    parse_quiz,
    search_terms,
)
from app.pagelist import PAGE_TABLE  # noqa: E402
from lessons.figures import fill_figures  # noqa: E402

# the chapter sits in shared/ beside the repository (CI lays it there), else at /work/shared
CHAPTER = next((p for p in (ROOT.parent / "shared" / "reference" / "chapter-6.4-zh.txt",
                            pathlib.Path("/work/shared/reference/chapter-6.4-zh.txt"))
                if p.exists()), ROOT.parent / "shared" / "reference" / "chapter-6.4-zh.txt")
CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]+")
MAX_SHARED_RUN = 12  # no run of this many consecutive Chinese characters may come from the chapter


def quiz_data() -> dict:
    return json.loads((LESSONS_DIR / "quiz.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- pages, switches, urls


def test_pages_and_switches_are_the_apps():
    assert PAGES == tuple(p.slug for p in PAGE_TABLE)
    assert {"home", "batching", "paging", "speculation", "dashboard", "quiz"} <= set(PAGES)
    assert LESSON_PAGES == tuple(p.slug for p in PAGE_TABLE if p.lesson)
    assert SWITCHES == {  # engine/config.py's, in the order the chapter teaches them
        "batching": ("static", "continuous"),
        "kv_layout": ("contiguous", "paged"),
        "spec": ("off", "ngram", "draft", "eagle"),
    }


def test_demo_url_orders_switches_and_rejects_unknowns():
    url = demo_url("paging", {"spec": "off", "batching": "static", "kv_layout": "paged"})
    assert url == "/paging?batching=static&kv_layout=paged&spec=off"
    assert demo_url("quiz") == "/quiz"
    with pytest.raises(ValueError, match="unknown page"):
        demo_url("nowhere", {})
    with pytest.raises(ValueError, match="unknown switch"):
        demo_url("paging", {"turbo": "on"})
    with pytest.raises(ValueError, match="no value"):
        demo_url("paging", {"spec": "medusa"})


# ---------------------------------------------------------------- lessons


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("slug", LESSON_PAGES)
def test_every_lesson_exists_and_ends_with_try_it(slug, lang):
    text = load_lesson(slug, lang)
    assert text.startswith("# "), f"{lang}/{slug}.md should open with a title"
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings and headings[-1].strip() == TRY_IT_HEADINGS[lang], (
        f"{lang}/{slug}.md: the last section must be '{TRY_IT_HEADINGS[lang]}', got {headings[-1:]}"
    )
    assert "```try-it" not in text, "load_lesson must strip the machine-readable block"


@pytest.mark.parametrize("slug", LESSON_PAGES)
def test_try_it_names_existing_switches_and_matches_across_languages(slug):
    steps = {lang: lesson_try_it(slug, lang) for lang in LANGS}
    assert steps["zh"] == steps["en"], f"{slug}: zh and en try-it steps differ"
    for link in steps["en"]:
        assert link.page in PAGES
        assert link.switches, f"{slug}: a try-it step must set at least one switch"
        for name, value in link.switches.items():
            assert value in SWITCHES[name]
        assert link.url.startswith(f"/{link.page}?")


def test_a_bad_try_it_block_fails(tmp_path, monkeypatch):
    import app.lessons as lessons

    for lang in LANGS:
        (tmp_path / lang).mkdir()
        bad = '# T\n\n## x\n\n```try-it\n[{"switches": {"spec": "medusa"}}]\n```\n'
        (tmp_path / lang / "home.md").write_text(bad, encoding="utf-8")
    monkeypatch.setattr(lessons, "LESSONS_DIR", tmp_path)
    with pytest.raises(ValueError, match="medusa"):
        lessons.lesson_try_it("home", "zh")


def _chapter_ngrams(n: int) -> set[str]:
    text = CHAPTER.read_text(encoding="utf-8")
    return {run[i : i + n] for run in CJK_RUN.findall(text) for i in range(len(run) - n + 1)}


def _shared_runs(text: str, grams: set[str], n: int) -> list[str]:
    return [
        run[i : i + n]
        for run in CJK_RUN.findall(text)
        for i in range(len(run) - n + 1)
        if run[i : i + n] in grams
    ]


@pytest.mark.skipif(not CHAPTER.exists(), reason="the chapter text is not on this machine")
def test_chinese_text_does_not_copy_the_chapter():
    grams = _chapter_ngrams(MAX_SHARED_RUN)
    assert grams, "the chapter should contain long runs of Chinese"
    ours = {f"zh/{s}.md": (LESSONS_DIR / "zh" / f"{s}.md").read_text() for s in LESSON_PAGES}
    ours["quiz.json"] = (LESSONS_DIR / "quiz.json").read_text(encoding="utf-8")
    ours["pretest.json"] = (LESSONS_DIR / "pretest.json").read_text(encoding="utf-8")
    ours["glossary.json"] = (LESSONS_DIR / "glossary.json").read_text(encoding="utf-8")
    ours["notes/zh.md"] = (LESSONS_DIR / "notes" / "zh.md").read_text(encoding="utf-8")
    ours["app/classplan.py"] = (ROOT / "app" / "classplan.py").read_text(encoding="utf-8")
    for name, text in ours.items():
        copied = _shared_runs(text, grams, MAX_SHARED_RUN)
        assert not copied, f"{name} copies the chapter: {copied[:3]}"


@pytest.mark.parametrize("lang, greedy, typical, approx", [
    ("en", "greedy", "typical acceptance", "approximation"),
    ("zh", "贪心", "典型接受", "近似")])
def test_speculation_lesson_words_losslessness_as_it_holds(lang, greedy, typical, approx):
    """The lesson's claim: "nothing the target would not pick gets through" holds for greedy
    decoding only, and Medusa's typical acceptance is named as an approximation."""
    text = (LESSONS_DIR / lang / "speculation.md").read_text(encoding="utf-8")
    paragraphs = [p for p in text.split("\n\n") if typical in p]
    assert paragraphs and all(approx in p for p in paragraphs), "typical acceptance is lossy"
    never = "nothing it would not have picked" if lang == "en" else "它自己不会选的字"
    (paragraph,) = [p for p in text.split("\n\n") if never in p]
    assert greedy in paragraph.split(never)[0][-80:], "the claim is qualified as greedy-only"
    assert "p_target ≥ p_draft" in paragraph, "and sampling's looser rule is said next to it"


def test_the_copy_check_can_fail():
    grams = _chapter_ngrams(MAX_SHARED_RUN)
    chapter = CHAPTER.read_text(encoding="utf-8") if CHAPTER.exists() else ""
    longest = max(CJK_RUN.findall(chapter), key=len, default="")
    if len(longest) < MAX_SHARED_RUN:
        pytest.skip("the chapter text is not on this machine")
    assert _shared_runs("我们说：" + longest, grams, MAX_SHARED_RUN)


# ---------------------------------------------------------------- quiz


def test_quiz_validates_with_both_sets():
    quiz = load_quiz()
    assert [q.id for q in quiz.chapter] == ["ch1", "ch2", "ch3", "ch4", "ch5"]
    assert len(quiz.extra) >= 7
    for q in quiz.questions:
        assert len(q.choices) == 4 and 0 <= q.answer < 4
        for lang in LANGS:
            assert q.question.get(lang) and q.explanation.get(lang)
            assert all(c.get(lang) for c in q.choices)
        assert q.demo.page in PAGES
        assert all(v in SWITCHES[k] for k, v in q.demo.switches.items())


def test_chapter_questions_ask_what_the_chapter_asks():
    """Each of the chapter's five self-test questions is there, in our words."""
    quiz = load_quiz()
    must_mention = {
        "ch1": ["静态批处理"],
        "ch2": ["PagedAttention"],
        "ch3": ["KV", "吞吐"],
        "ch4": ["投机解码", "质量"],
        "ch5": ["几百", "投机解码"],
    }
    for qid, words in must_mention.items():
        text = quiz.by_id(qid).question.zh
        assert all(w in text for w in words), f"{qid}: {text}"
    assert "min(1, p_target/p_draft)" in quiz.by_id("ch4").explanation.en
    assert "compute-bound" in quiz.by_id("ch5").choices[quiz.by_id("ch5").answer].en


def _choices_without_why(quiz) -> list[str]:
    """Wrong choices with no why, and right answers with one, as 'qid choice i' strings."""
    return [
        f"{q.id} choice {i}"
        for q in quiz.questions
        for i in range(len(q.choices))
        if (q.why(i) is None) != (i == q.answer)
    ]


def _right_is_longest(quiz, lang: str) -> list[str]:
    """Ids of the questions whose right answer is at least as long as every wrong one."""
    return [
        q.id
        for q in quiz.questions
        if len(q.choices[q.answer].get(lang))
        >= max(len(c.get(lang)) for i, c in enumerate(q.choices) if i != q.answer)
    ]


def test_every_wrong_choice_explains_its_misconception():
    """Every wrong choice of every question says, in both languages,
    why it is wrong; the right answer needs none (the explanation covers it)."""
    quiz = load_quiz()
    assert not _choices_without_why(quiz)
    for q in quiz.questions:
        for i in range(len(q.choices)):
            if i != q.answer:
                for lang in LANGS:
                    assert q.why(i).get(lang).strip(), f"{q.id} choice {i}: empty {lang} why"
                    assert q.why(i).get(lang) != q.explanation.get(lang), f"{q.id} choice {i}"


def test_exactly_one_choice_is_correct_in_the_file():
    for q in quiz_data()["questions"]:
        flags = [c.get("correct", False) for c in q["choices"]]
        assert flags.count(True) == 1 and all(f in (True, False) for f in flags), q["id"]


@pytest.mark.parametrize("lang", LANGS)
def test_the_right_answer_is_not_told_by_its_length(lang):
    """Counting characters, the right answer is the longest choice in at most a third of the
    questions (ties count as longest), so a student cannot pass by picking the longest."""
    quiz = load_quiz()
    longest = _right_is_longest(quiz, lang)
    limit = len(quiz.questions) // 3
    assert len(longest) <= limit, f"{lang}: right answer longest in {longest} (limit {limit})"


def test_the_length_and_why_checks_can_fail():
    data = quiz_data()
    for q in data["questions"]:
        right = next(c for c in q["choices"] if c.get("correct"))
        right.update(zh=right["zh"] + "甲" * 60, en=right["en"] + " a" * 60)
    last = data["questions"][-1]
    wrong = next(i for i, c in enumerate(last["choices"]) if "why" in c)
    last["choices"][wrong].pop("why")
    broken = parse_quiz(data)
    for lang in LANGS:
        assert len(_right_is_longest(broken, lang)) == len(broken.questions)
    assert _choices_without_why(broken) == [f"{last['id']} choice {wrong}"]


# ---------------------------------------------------------------- the pre- and post-test

# A form's items whose key may be the strictly longest choice: 2 of 7, under half (3), so
# "pick the longest" scores below a blind guess's quarter plus luck on neither form.
MAX_KEY_LONGEST = 2
# An item's longest choice over its shortest (characters, figures filled in as the student
# reads them): 1.25, the longest at most a quarter longer. The chapter's own short choices
# differ by a few characters; past a quarter the odd one out shows at a glance on a phone
# (a 20-character line against a 26-character one); all 14 items hold it in zh and en.
MAX_LENGTH_RATIO = 1.25
# A pair's twins: the mean length of one form's choices over the other's, at most 1.3, so
# neither twin asks for noticeably more reading (in the 3 minutes the test has).
MAX_TWIN_RATIO = 1.3


def pretest_data() -> dict:
    return json.loads((LESSONS_DIR / "pretest.json").read_text(encoding="utf-8"))


def _test_forms(pretest: dict) -> dict[str, list[tuple[str, list[dict], int]]]:
    """lessons/pretest.json's two forms: for each item, (pair id, its four choices, the key's
    index); both forms' items are written out in the file (format 2)."""
    forms: dict[str, list] = {"A": [], "B": []}
    for pair in pretest["pairs"]:
        for form in ("A", "B"):
            choices = pair[form]["choices"]
            key = next(i for i, c in enumerate(choices) if c.get("correct"))
            forms[form].append((pair["id"], choices, key))
    return forms


def _length_tells(forms: dict) -> list[str]:
    """What lets a test-wise student guess by length, per form and language: the key strictly
    longest in more than MAX_KEY_LONGEST items, or a choice over MAX_LENGTH_RATIO times the
    shortest of its item (characters, figures filled in as the student reads them)."""
    tells = []
    for form, items in forms.items():
        for lang in LANGS:
            key_longest = []
            for pid, choices, key in items:
                lengths = [len(fill_figures(c[lang], lang)) for c in choices]
                if lengths[key] > max(n for i, n in enumerate(lengths) if i != key):
                    key_longest.append(pid)
                if max(lengths) > MAX_LENGTH_RATIO * min(lengths):
                    tells.append(f"{form} {lang} {pid}: lengths {lengths}")
            if len(key_longest) > MAX_KEY_LONGEST:
                tells.append(f"{form} {lang}: the key is the longest choice in {key_longest}")
    return tells


def _norm(text: str) -> str:
    return " ".join(fill_figures(text, "zh" if CJK_RUN.search(text) else "en").split())


def test_the_pre_post_test_is_two_written_out_forms_of_well_formed_twins():
    """Format 2: each pair's form A and form B item written out (no form taken from the
    self-test), each a question and four choices in zh and en, exactly one right, every wrong
    choice tagged with a misconception misconceptions.json names, the right one untagged; the
    twins offer the same misconceptions, and every misconception is offered by some pair."""
    data = pretest_data()
    known = [m["id"] for m in json.loads(
        (LESSONS_DIR / "misconceptions.json").read_text(encoding="utf-8"))["misconceptions"]]
    assert data["version"] == 2 and len(known) == len(set(known))
    offered = set()
    for pair in data["pairs"]:
        assert pair["id"] and all(pair["idea"][lang].strip() for lang in LANGS)
        tags = {}
        for form in ("A", "B"):
            item = pair[form]
            assert set(item) == {"question", "choices"}, (pair["id"], form, set(item))
            assert all(item["question"][lang].strip() for lang in LANGS)
            assert len(item["choices"]) == 4
            assert [c.get("correct", False) for c in item["choices"]].count(True) == 1
            for c in item["choices"]:
                assert all(c[lang].strip() for lang in LANGS), (pair["id"], form)
                assert ("misconception" in c) != bool(c.get("correct")), (pair["id"], form, c)
                assert c.get("misconception") is None or c["misconception"] in known, c
            tags[form] = sorted(c["misconception"] for c in item["choices"] if not c.get("correct"))
            offered |= set(tags[form])
        assert tags["A"] == tags["B"], (pair["id"], tags)
    assert offered == set(known), f"misconceptions no item offers: {set(known) - offered}"


def test_no_test_item_is_a_self_test_item():
    """Both forms are held out of the self-test: no item's question, and no choice, is one of
    quiz.json's (in either language, figures filled in)."""
    quiz = quiz_data()["questions"]
    questions = {_norm(q["question"][lang]) for q in quiz for lang in LANGS}
    choices = {_norm(c[lang]) for q in quiz for c in q["choices"] for lang in LANGS}
    for pair in pretest_data()["pairs"]:
        for form in ("A", "B"):
            item = pair[form]
            assert "quiz" not in item
            for lang in LANGS:
                assert _norm(item["question"][lang]) not in questions, (pair["id"], form, lang)
                same = [c[lang] for c in item["choices"] if _norm(c[lang]) in choices]
                assert not same, (pair["id"], form, same)


def test_a_misconception_tag_names_one_error():
    """The tags the review found overloaded are split: padding the prompts (static
    batching's waste) is offered by that idea's items only; reserved slots taken for padding
    by internal fragmentation's only."""
    where: dict[str, set] = {}
    for pair in pretest_data()["pairs"]:
        for form in ("A", "B"):
            for c in pair[form]["choices"]:
                if c.get("misconception"):
                    where.setdefault(c["misconception"], set()).add(pair["id"])
    assert where["padding-main-waste"] == {"static-waste"}
    assert where["reserved-is-padding"] == {"internal-frag"}


def test_the_prefix_twins_leave_a_partial_block():
    """prefix-blocks: in both forms the shared prompt does not fill its last block, so the
    "one shared half-full block" choice has its basis and the item is not bare division."""
    pair = next(p for p in pretest_data()["pairs"] if p["id"] == "prefix-blocks")
    for form in ("A", "B"):
        text = pair[form]["question"]["en"]
        tokens = int(re.search(r"(\d+)-token", text).group(1))
        block = int(re.search(r"holds (\d+) tokens", text).group(1))
        assert tokens % block, (form, tokens, block)


def test_the_pre_and_post_tests_keys_are_not_told_by_length():
    """Both forms feed the class's gain (Hake's g, d_z): in neither form, in neither language,
    may the right choice stand out by its length."""
    assert MAX_KEY_LONGEST <= len(pretest_data()["pairs"]) // 2
    tells = _length_tells(_test_forms(pretest_data()))
    assert not tells, "choices guessable by length:\n" + "\n".join(tells)


def test_twins_ask_for_about_the_same_reading():
    forms = _test_forms(pretest_data())
    for (pid, a, _), (_, b, _) in zip(forms["A"], forms["B"]):
        for lang in LANGS:
            la, lb = (sum(len(fill_figures(c[lang], lang)) for c in x) / 4 for x in (a, b))
            assert max(la, lb) <= MAX_TWIN_RATIO * min(la, lb), (pid, lang, la, lb)


def test_the_test_forms_length_check_can_fail():
    pretest = pretest_data()
    for pair in pretest["pairs"]:
        for form in ("A", "B"):
            key = next(c for c in pair[form]["choices"] if c.get("correct"))
            key.update(zh=key["zh"] + "甲" * 60, en=key["en"] + " a" * 60)
    tells = "\n".join(_length_tells(_test_forms(pretest)))
    for form in ("A", "B"):
        for lang in LANGS:
            assert f"{form} {lang}: the key is the longest choice in" in tells
            assert f"{form} {lang} static-waste: lengths" in tells


def test_the_quiz_uses_the_apps_chinese_terms():
    """One word per idea, as the chapter and the UI: 显存 not 'KV 内存', 验证 not 校验."""
    for name in ("quiz.json", "pretest.json", "misconceptions.json"):
        text = (LESSONS_DIR / name).read_text(encoding="utf-8")
        for wrong in ("KV 内存", "校验", "推测解码", "分页注意力机制"):
            assert wrong not in text, f"{name} says {wrong}"


def test_a_why_on_the_right_answer_is_refused():
    data = quiz_data()
    q = data["questions"][0]
    right = next(c for c in q["choices"] if c.get("correct"))
    right["why"] = {"zh": "甲", "en": "a"}
    with pytest.raises(ValueError, match="only a wrong choice says why"):
        parse_quiz(data)


def test_answers_are_not_all_in_one_position():
    answers = {q.answer for q in load_quiz().questions}
    assert len(answers) >= 3


def _break(mutate):
    data = copy.deepcopy(quiz_data())
    mutate(data)
    return data


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["questions"][0]["choices"].pop(), "list of 4"),
        (lambda d: d["questions"][0]["choices"][0].update(correct=True), "exactly one"),
        (lambda d: d["questions"][1]["choices"][2].pop("correct"), "exactly one"),
        (lambda d: d["questions"][2]["question"].pop("en"), "exactly the keys"),
        (lambda d: d["questions"][3]["explanation"].update(zh="  "), "non-empty"),
        (lambda d: d["questions"][4]["demo"].update(page="nowhere"), "unknown page"),
        (lambda d: d["questions"][4]["demo"]["switches"].update(spec="medusa"), "medusa"),
        (lambda d: d["questions"][5].update(set="bonus"), "set"),
        (lambda d: d["questions"][6].update(id=d["questions"][0]["id"]), "duplicate"),
        (lambda d: d.pop("questions"), "questions"),
    ],
)
def test_a_broken_quiz_fails_validation(mutate, message):
    with pytest.raises(ValueError, match=message):
        parse_quiz(_break(mutate))


# ---------------------------------------------------------------- glossary and strings


def test_glossary_has_the_chapters_terms_and_search_filters():
    terms = load_glossary()
    names = {t.term.zh for t in terms} | {t.term.en for t in terms}
    for needed in [
        "连续批处理",
        "静态批处理",
        "分页注意力",
        "投机解码",
        "预填充",
        "解码",
        "KV 缓存",
        "吞吐",
        "延迟",
        "页表",
        "块",
        "内部碎片",
        "外部碎片",
        "接受率",
        "草稿模型",
        "前缀缓存",
        "抢占",
        "分块预填充",
        "量化",
        "PD 分离",
        "内存带宽受限",
        "算力受限",
    ]:
        assert needed in names, f"glossary lacks {needed}"
    assert any("TTFT" in n for n in names) and any("TPOT" in n for n in names)
    assert len(search_terms(terms, "")) == len(terms)
    hits = search_terms(terms, "ttft")
    assert 0 < len(hits) < len(terms)
    assert search_terms(terms, "预填充") and not search_terms(terms, "zzz-no-such-term")
    with pytest.raises(ValueError):
        parse_glossary([{"id": "x", "term": {"zh": "甲"}, "definition": {"zh": "乙", "en": "b"}}])


def test_ui_strings_have_both_languages():
    for key, entry in STRINGS.items():
        assert set(entry) == set(LANGS), key
        assert all(entry[lang].strip() for lang in LANGS), key
    for slug in PAGES:
        assert f"page.{slug}" in STRINGS
    for name, values in SWITCHES.items():
        assert f"switch.{name}" in STRINGS
        assert all(f"switch.{name}.{v}" in STRINGS for v in values)
