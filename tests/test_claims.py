"""Every claim true in both languages: the glossary defines each term once, the lessons' numbers
live once in lessons/figures.json with their sources, and a few facts the lessons once got wrong
are pinned to the code and the arithmetic that make them true."""

import json
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.i18n import LANGS, STRINGS  # noqa: E402
from app.lessons import (  # noqa: E402
    FIGURE_REF,
    LESSON_PAGES,
    LESSONS_DIR,
    check_figures,
    figure_names,
    figure_text,
    fill_figures,
    load_figures,
    load_glossary,
    load_lesson,
    load_quiz,
    parse_glossary,
    search_terms,
)


def raw_lesson(slug: str, lang: str) -> str:
    return (LESSONS_DIR / lang / f"{slug}.md").read_text(encoding="utf-8")


def raw_texts() -> dict[str, str]:
    """Every file or string a student or teacher reads, before figures are filled in."""
    texts = {f"{lang}/{slug}.md": raw_lesson(slug, lang) for slug in LESSON_PAGES for lang in LANGS}
    for name in ("quiz.json", "glossary.json", "notes/zh.md", "notes/en.md"):
        texts[name] = (LESSONS_DIR / name).read_text(encoding="utf-8")
    texts["pretest.json"] = (LESSONS_DIR / "pretest.json").read_text(encoding="utf-8")
    for key, entry in STRINGS.items():
        for lang in LANGS:
            texts[f"i18n {key} {lang}"] = entry[lang]
    for i, text in enumerate(_class_plan_texts()):  # the stops' and the summary's words
        for lang in LANGS:
            texts[f"class plan {i} {lang}"] = getattr(text, lang)
    return texts


def _class_plan_texts() -> list:
    """Every Text the class plan holds (its stops, their predictions, the summary), raw."""
    import dataclasses

    from app.classplan import STOPS, SUMMARY
    from app.lessons import Text

    found: list = []

    def walk(x) -> None:
        if isinstance(x, Text):
            found.append(x)
        elif dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)

    walk(list(STOPS))
    walk([text for text, _ in SUMMARY])
    return found


def zh_texts() -> dict[str, str]:
    return {name: text for name, text in raw_texts().items()
            if name.startswith("zh/") or name.endswith(" zh") or name in (
                "quiz.json", "pretest.json", "glossary.json", "notes/zh.md")}


def glossary_by_id() -> dict:
    return {t.id: t for t in load_glossary()}


def _base(name: str) -> str:
    """A term's name without its parenthetical: "TTFT (time to first token)" -> "TTFT"."""
    return re.split(r"\s*[（(]", name)[0].strip()


# ---------------------------------------------------------------- glossary: one entry per idea


def test_each_term_is_defined_once_in_each_language():
    terms = load_glossary()
    for lang in LANGS:
        names = [_base(t.term.get(lang)).casefold() for t in terms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        assert not dupes, f"{lang}: terms defined more than once: {dupes}"
        defs = [t.definition.get(lang) for t in terms]
        assert len(set(defs)) == len(defs), f"{lang}: two terms share one definition"
    every_name = {_base(t.term.get(lang)).casefold() for t in terms for lang in LANGS}
    for t in terms:
        for alias in t.aliases:
            assert alias.casefold() not in every_name, f"alias {alias!r} of {t.id} is a term"


@pytest.mark.parametrize("acronym", ["TTFT", "TPOT", "ITL", "SLO"])
def test_each_metric_the_lessons_name_has_exactly_one_entry(acronym):
    used = any(re.search(rf"\b{acronym}\b", raw_lesson(s, lang))
               for s in LESSON_PAGES for lang in LANGS)
    assert used, f"no lesson names {acronym}; drop it from this list"
    owners = [t.id for t in load_glossary() if re.search(rf"\b{acronym}\b", t.term.en)]
    assert len(owners) == 1, f"{acronym} is the term of {owners}"


def test_every_term_with_a_page_is_used_on_that_page_in_both_languages():
    """A term tied to a lesson page appears there under its own name, in zh and in en."""
    missing = []
    for t in load_glossary():
        if t.page not in LESSON_PAGES:
            continue
        for lang in LANGS:
            names = {_base(t.term.get(lang))} | {
                m for m in re.findall(r"[（(]([^）)]+)[）)]", t.term.get(lang))}
            text = load_lesson(t.page, lang).casefold()
            if not any(n.casefold() in text for n in names):
                missing.append(f"{t.id} ({lang}, {t.page})")
    assert not missing, f"terms not used on their page: {missing}"


def test_aliases_are_found_by_search_and_not_used_by_the_lessons():
    """推测解码 is a name some books use for 投机解码: search finds the one entry, and the
    app's own texts keep to the glossary's term."""
    hits = search_terms(load_glossary(), "推测解码")
    assert [t.id for t in hits] == ["speculative-decoding"]
    aliases = {a for t in load_glossary() for a in t.aliases if re.search(r"[\u4e00-\u9fff]", a)}
    for name, text in zh_texts().items():
        if name == "glossary.json":
            continue
        for alias in aliases:
            assert alias not in text, f"{name} says {alias}, the glossary's term is another"


@pytest.mark.parametrize("wrong, right", [
    ("首 token 时间", "首 token 延迟"),  # TTFT: one Chinese name
    ("奖励 token", "额外 token"),  # the bonus token is no RL reward
    ("多了四倍多", "4.75 倍"),  # 4 -> 19 is 4.75 times as many, 3.75 times more
])
def test_chinese_uses_one_word_per_idea(wrong, right):
    for name, text in zh_texts().items():
        assert wrong not in text, f"{name} says {wrong!r}; write {right!r}"


def test_a_bad_alias_is_refused():
    good = [{"id": "x", "term": {"zh": "甲", "en": "a"}, "definition": {"zh": "乙", "en": "b"}}]
    assert parse_glossary(good)
    for aliases in ({"fr": ["x"]}, {"zh": "推测解码"}, {"zh": [""]}):
        with pytest.raises(ValueError, match="aliases"):
            parse_glossary([dict(good[0], aliases=aliases)])


# ---------------------------------------------------------------- figures: once, with sources


def test_figures_load_and_every_figure_names_a_source():
    data = load_figures()
    assert data["figures"], "figures.json lists no figure"
    for name, fig in data["figures"].items():
        src = data["sources"][fig["source"]]
        if src["kind"] == "measured":
            assert src["command"].startswith("python -m "), name
            assert all(src["machine"][lang].strip() for lang in LANGS), name
        elif src["kind"] == "computed":
            assert fig["formula"].strip(), name
        else:
            assert src["cite"].strip(), name
        for lang in LANGS:
            assert figure_text(name, lang)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["figures"]["verify_4"].update(source="nowhere"), "no known source"),
    (lambda d: d["figures"]["q4_1_bits"].pop("formula"), "formula"),
    (lambda d: d["sources"]["spec-bench"]["machine"].pop("zh"), "machine"),
    (lambda d: d["sources"]["spec-bench"].pop("command"), "command"),
    (lambda d: d["figures"]["verify_4"].update(value="1.52"), "value"),
])
def test_a_figure_without_its_source_fails(mutate, message):
    data = json.loads((LESSONS_DIR / "figures.json").read_text(encoding="utf-8"))
    mutate(data)
    with pytest.raises(ValueError, match=message):
        check_figures(data)


def test_no_placeholder_names_an_unknown_figure():
    known = set(load_figures()["figures"])
    sources = set(load_figures()["sources"])
    for name, text in raw_texts().items():
        for m in FIGURE_REF.finditer(text):
            pool = known if m.group(1) == "figure" else sources
            assert m.group(2) in pool, f"{name}: unknown {m.group(1)} {m.group(2)!r}"
    with pytest.raises(ValueError, match="nowhere"):
        fill_figures("{{figure:nowhere}}", "en", "a test")
    for slug in LESSON_PAGES:
        for lang in LANGS:
            assert "{{" not in load_lesson(slug, lang), f"{lang}/{slug}.md left a placeholder"
    quiz = load_quiz()
    for q in quiz.questions:
        for text in (q.question, q.explanation, *q.choices, *(w for w in q.whys if w)):
            assert "{{" not in text.zh and "{{" not in text.en, q.id


def test_every_figure_is_used_somewhere():
    used = set().union(*(figure_names(t) for t in raw_texts().values()))
    unused = sorted(set(load_figures()["figures"]) - used)
    assert not unused, f"figures no text reads: {unused}"


def test_every_figure_a_reader_sees_says_its_kind():
    """Each figure on a page carries its kind: in the lessons and the teacher's notes a small
    badge (cited, recorded, computed; zh and en), in every other text (the class plan, the
    quiz and the test, UI strings, what a phone shows) the word in brackets."""
    from app.lessons import Text, load_lesson
    from lessons.figures import KIND_WORDS, fill_figures

    words = {w for kind in KIND_WORDS.values() for w in kind.values()}
    badge = re.compile(r":gray-badge\[([^\]]+)\]")
    for lang in LANGS:
        for slug in LESSON_PAGES:
            raw, shown = raw_lesson(slug, lang), load_lesson(slug, lang)
            tags = badge.findall(shown)
            assert len(tags) == raw.count("{{figure:") and set(tags) <= words, (slug, lang)
        notes = (LESSONS_DIR / "notes" / f"{lang}.md").read_text(encoding="utf-8")
        filled = fill_figures(notes, lang, tag="badge")
        assert "{{" not in filled and len(badge.findall(filled)) == notes.count("{{figure:")
    text = Text(zh="论文的 {{figure:paper_useful_kv}}", en="the paper's {{figure:paper_useful_kv}}")
    assert text.get("zh").endswith("（引用）") and text.get("en").endswith(" (cited)")
    assert fill_figures("{{figure:fp16_7b_weights}}", "en", tag="words").endswith("(computed)")
    assert fill_figures("{{figure:gguf_step_mb}}", "zh", tag="words").endswith("（记录）")


# A number with a unit of measure, written into a text rather than quoted from figures.json
# (not a factor in a formula: "2 × parameters", "k + 1 倍")
UNIT_NUMBER = re.compile(
    r"(?<![\w.{:])(?<![+×÷*/]\s)\d+(?:[.,]\d+)*\s*(?:%|x\b|倍|ms\b|毫秒|GB\b|MB\b|KiB\b|"
    r"MiB\b|GiB\b|TB/s|GB/s|tok/s|TFLOPS?)")
# the listed constants: goals and definitions, not findings (the speculation page's targets of
# 1.5x and 2x a draft is built for; p99, the 99th percentile)
LISTED_CONSTANTS = {"1.5x", "2x", "1.5 倍", "2 倍", "99%"}


def _prediction_ranges() -> set[str]:
    """A prediction's choices are its ranges' bounds ("1.3x to 2.5x"): set by the plan, the
    bins a measure falls in, not findings."""
    from app.classplan import STOPS

    return {getattr(c, lang) for s in STOPS if s.prediction is not None
            for c in s.prediction.choices for lang in LANGS}


def test_no_text_states_a_measure_that_is_not_a_figure():
    """A number with a unit (a share, a speed-up, a time, a size, a rate) in a lesson, note,
    item, plan text or UI string is a figure, with its kind and source, unless it is a listed
    constant; a placeholder ({n}) or code is not a number here."""
    found, ranges = [], _prediction_ranges()
    for where, text in raw_texts().items():
        if text in ranges:
            continue
        text = re.sub(r"\{\{(figure|source):[^}]+\}\}|`[^`]*`|\{[a-z_]+(:[^}]*)?\}", "", text)
        found += [f"{where}: {m}" for m in UNIT_NUMBER.findall(text)
                  if m.strip() not in LISTED_CONSTANTS]
    assert not found, found


@pytest.mark.parametrize("slug", LESSON_PAGES)
def test_zh_and_en_lessons_quote_the_same_figures(slug):
    assert figure_names(raw_lesson(slug, "zh")) == figure_names(raw_lesson(slug, "en"))


def test_zh_and_en_quiz_glossary_and_strings_quote_the_same_figures():
    def pairs(obj):
        if isinstance(obj, dict):
            if set(LANGS) <= set(obj) and all(isinstance(obj[k], str) for k in LANGS):
                yield obj
            for v in obj.values():
                yield from pairs(v)
        elif isinstance(obj, list):
            for v in obj:
                yield from pairs(v)

    for name in ("quiz.json", "pretest.json", "glossary.json", "misconceptions.json"):
        for pair in pairs(json.loads((LESSONS_DIR / name).read_text(encoding="utf-8"))):
            assert figure_names(pair["zh"]) == figure_names(pair["en"]), (name, pair["en"][:60])
    for key, entry in STRINGS.items():
        assert figure_names(entry["zh"]) == figure_names(entry["en"]), key


def _distinctive(text: str) -> bool:
    return len(text) >= 4 and ("." in text or "–" in text)


def test_no_text_keeps_its_own_copy_of_a_figure():
    """A figure is written once, in figures.json: a text that spells out 1.52x or 20.4–38.2%
    itself would not follow when the figure is remeasured."""
    copies = []
    for name in load_figures()["figures"]:
        for lang in LANGS:
            shown = figure_text(name, lang)
            if not _distinctive(shown):
                continue
            pattern = re.compile(rf"(?<![\d.]){re.escape(shown)}(?![\d])")
            copies += [f"{where}: {shown}" for where, text in raw_texts().items()
                       if pattern.search(text)]
    assert not copies, f"figures copied instead of referenced: {copies[:8]}"


def _json_value(data, path: str):
    """Follow "a.0.b" or a list filter "k=v,k2=v2" (the one element whose fields match)."""
    for part in path.split("."):
        if isinstance(data, list) and "=" in part:
            want = dict(kv.split("=", 1) for kv in part.split(","))
            (data,) = [x for x in data if all(str(x.get(k)) == v for k, v in want.items())]
        elif isinstance(data, list):
            data = data[int(part)]
        else:
            data = data[part]
    return data


def test_measured_figures_match_their_recorded_runs():
    """Each figure read from a benchmark file equals that file's value at the stated decimals,
    and the machine it names has the instruction sets the file recorded."""
    data = load_figures()
    checked = 0
    for name, fig in data["figures"].items():
        src = data["sources"][fig["source"]]
        if "json" not in fig and "json_ratio" not in fig:
            continue
        recorded = json.loads((ROOT / src["file"]).read_text(encoding="utf-8"))
        if "json_ratio" in fig:  # one recorded value over another (a share of a speed-up)
            top, bottom = fig["json_ratio"]
            got = _json_value(recorded, top) / _json_value(recorded, bottom)
        else:
            got = _json_value(recorded, fig["json"]) * fig.get("scale", 1)  # e.g. s -> ms
        assert round(got, fig["decimals"]) == pytest.approx(fig["value"]), (name, got)
        checked += 1
    assert checked >= 10
    for name, src in data["sources"].items():
        if src["kind"] != "measured" or "file" not in src:
            continue
        assert (ROOT / src["file"]).exists(), f"{name}: {src['file']} is missing"
        flags = (json.loads((ROOT / src["file"]).read_text(encoding="utf-8"))
                 .get("machine", {}).get("cpu", {}).get("flags"))
        if flags:
            for flag in flags:
                assert flag in src["machine"]["en"], f"{name}: the file records {flag}"
            if not any("amx" in f for f in flags):
                assert "no AMX" in src["machine"]["en"] and "没有 AMX" in src["machine"]["zh"]


def test_the_acceptance_bounds_follow_from_the_recorded_costs():
    from benchmarks.spec_bench import needed_acceptance

    data = load_figures()
    figs = data["figures"]
    run = json.loads((ROOT / data["sources"]["spec-bench"]["file"]).read_text(encoding="utf-8"))
    cost, head = run["forward_cost"], run["draft_step"]["eagle"]["vs_target"]
    assert needed_acceptance(cost, head, 1.5) == figs["spec_need_15"]["value"]
    assert needed_acceptance(cost, head, 2.0) == figs["spec_need_2"]["value"]
    flat = [{"tokens": 1, "vs_one_token": 1.0}, {"tokens": 16, "vs_one_token": 1.0}]
    assert needed_acceptance(flat, head, 1.5) == figs["gpu_need_15"]["value"]
    assert needed_acceptance(flat, head, 2.0) == figs["gpu_need_2"]["value"]


# ---------------------------------------------------------------- pinned facts


def test_q4_1_bits_come_from_the_engines_block_size():
    from engine.model.gguf import BLOCK_BYTES

    figs = load_figures()["figures"]
    assert figs["q4_1_bits"]["value"] == BLOCK_BYTES["q4_1"] * 8 / 32 == 5.0
    assert figs["q4_0_bits"]["value"] == 18 * 8 / 32 == 4.5  # ggml's Q4_0: fp16 scale + 16 bytes
    assert figs["q8_0_bits"]["value"] == BLOCK_BYTES["q8_0"] * 8 / 32 == 8.5  # the embedding's
    for lang in LANGS:
        text = load_lesson("beyond", lang)
        assert "Q4_1" in text and f"{figure_text('q4_1_bits', lang)}" in text


def test_the_arithmetic_figures_are_right():
    figs = {k: v["value"] for k, v in load_figures()["figures"].items()}
    assert figs["bus_useful"] == round(100 * (10 + 50 + 200 + 1000) / (4 * 1000), 1)
    per_request = -(-200 // 16) * 16  # 200 tokens in 16-slot blocks
    assert figs["hall_contiguous_fit"] == 4096 // 1024
    assert figs["hall_paged_fit"] == 4096 // per_request
    assert figs["hall_ratio"] == figs["hall_paged_fit"] / figs["hall_contiguous_fit"]
    assert figs["hall_more"] == figs["hall_ratio"] - 1
    assert figs["alpha_08_k4"] == round((1 - 0.8 ** 5) / 0.2, 2)
    # k = 4 verifies 5 tokens: the cost between the recorded 4 and 8
    assert figs["verify_5"] == round(figs["verify_4"] + (figs["verify_8"] - figs["verify_4"]) / 4, 1)
    assert figs["alpha_03_k4"] == round((1 - 0.3 ** 5) / 0.7, 2)
    assert figs["smollm2_kv_per_token"] == 2 * 30 * 3 * 64 * 2 / 1024
    assert figs["llama2_kv_per_token"] == 2 * 32 * 32 * 128 * 2 / 2 ** 20
    assert figs["chapter_waste"] <= 100 - max(figs["paper_useful_kv"])


def test_tpot_and_itl_are_two_metrics():
    g = glossary_by_id()
    for lang in LANGS:
        tpot, itl = g["tpot"].definition.get(lang), g["itl"].definition.get(lang)
        assert tpot != itl
        assert "ITL" in tpot  # it says how they differ ...
    assert not re.search(r"also called ITL|也叫 ITL", g["tpot"].definition.en + g["tpot"].definition.zh)
    # ... and ITL under speculation is one round, draft + verify, in the glossary and the gauge
    assert "draft + verify" in g["itl"].definition.en and "起草 + 验证" in g["itl"].definition.zh
    assert "draft + verify" in STRINGS["gauge.itl.help"]["en"]
    assert "起草 + 验证" in STRINGS["gauge.itl.help"]["zh"]
    assert "one step" not in STRINGS["gauge.itl.help"]["en"]


def test_prefix_keys_chain_the_parent_as_the_engine_does():
    from engine.kv.paged import block_hash

    same = [1, 2, 3, 4]
    assert block_hash(block_hash(None, [7, 7]), same) != block_hash(block_hash(None, [8, 8]), same)
    g = glossary_by_id()["prefix-caching"].definition
    assert "parent" in g.en and "前一块" in g.zh
    for lang, words in (("en", "parent"), ("zh", "前一块")):
        for slug in ("paging", "beyond"):
            assert words in load_lesson(slug, lang), f"{lang}/{slug}.md"
    assert not re.search(r"by (its )?contents?\b", "".join(
        load_lesson(s, "en") for s in ("paging", "beyond")))
    quiz = load_quiz().by_id("prefix-sharing").explanation
    assert "parent" in quiz.en and "前一块" in quiz.zh


def test_the_tour_bus_is_the_schedulers():
    """The engine's static batch boards whoever waits once every seat is empty (it does not
    wait for a full bus); the glossary and the lesson say so, in both languages."""
    from engine.config import EngineConfig, SamplingParams
    from engine.kv import PagedAllocator
    from engine.request import Request
    from engine.scheduler import Scheduler

    cfg = EngineConfig(batching="static", kv_layout="paged", max_num_seqs=4, block_size=4,
                       max_model_len=32)
    sched = Scheduler(cfg, PagedAllocator(64, 4, False), eos_ids=set())
    riders = [Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=2 + 3 * i)) for i in range(2)]
    for r in riders:
        sched.add(r)
    out = sched.schedule()
    assert out.admitted == ["r0", "r1"], "two riders leave without waiting for four seats"
    late = Request("late", [1, 2, 3], SamplingParams(max_tokens=2))
    sched.add(late)
    boarded_before_all_off = False
    for _ in range(50):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        if "late" in out.admitted:
            boarded_before_all_off = any(r.status.name != "FINISHED" for r in riders)
            break
        # every computed row ends its prompt or decodes, so each gets one token
        sched.update_from_output(out, {s.req.request_id: [5] for s in out.scheduled
                                       if not s.idle}, now=0.0)
    assert late.status.name != "WAITING", "the late rider boards the next bus"
    assert not boarded_before_all_off, "nobody boards until everyone has got off"
    for text in (load_lesson("batching", "en"), glossary_by_id()["static-batching"].definition.en):
        assert "whoever is waiting" in text
        assert "every seat is taken" not in text
    for text in (load_lesson("batching", "zh"), glossary_by_id()["static-batching"].definition.zh):
        assert "坐满才出发" not in text


def test_gpu_premises_are_labelled_where_they_are_stated():
    """'Verifying k tokens costs about one step' holds on a GPU at small batch, not on this
    CPU: the pages that say it, say where it holds."""
    for lang, gpu in (("en", "GPU"), ("zh", "GPU")):
        assert gpu in STRINGS["spec.fwd_header"][lang]
        quiz = load_quiz()
        bonus = quiz.by_id("bonus-token")
        assert gpu in bonus.why(1).get(lang)
        assert gpu in quiz.by_id("lone-request").explanation.get(lang)
    en = load_lesson("batching", "en")
    (para,) = [p for p in en.split("\n\n") if "32 requests" in p]
    assert "short" in para and "GPU" in para


def test_losslessness_is_claimed_as_it_holds():
    for lang, greedy_words, dist in (("en", "greedy", "distribution"), ("zh", "贪心", "分布")):
        caption = STRINGS["spec.adaptive_caption"][lang]
        assert greedy_words in caption and dist in caption
    assert "batch" in STRINGS["spec.adaptive_caption"]["en"]
    for lang, words in (("en", ("batch-invariant", "fp32")), ("zh", ("批次不变", "fp32"))):
        notes = (LESSONS_DIR / "notes" / f"{lang}.md").read_text(encoding="utf-8")
        assert all(w in notes for w in words), lang
        assert all(w in load_lesson("speculation", lang) for w in words), lang


def test_the_chapters_five_questions_are_open_prompts_too():
    quiz = load_quiz()
    assert len(quiz.open_prompts) == len(quiz.chapter) == 5
    for lang, heading in (("en", "### Open discussion"), ("zh", "### 开放讨论")):
        notes = (LESSONS_DIR / "notes" / f"{lang}.md").read_text(encoding="utf-8")
        section = notes.split(heading, 1)[1]
        assert len(re.findall(r"^\d\. ", section, re.M)) == 5


def test_figures_module_speaks_the_apps_languages():
    import lessons.figures

    assert lessons.figures.LANGS == LANGS
    assert lessons.figures.LESSONS_DIR == LESSONS_DIR
