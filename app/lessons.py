"""Lessons, quiz and glossary data for the ServeLab pages (chapter 6.4: three leaks, three fixes).

Pure Python, no streamlit: the pages draw what this module loads and validates.

- `PAGES` / `SWITCHES`: the app's page slugs (from app/pagelist.py) and the sidebar switches
  with their values.
- `demo_url(page, switches)`: "/<slug>?batching=...&kv_layout=...&spec=..." (the shell reads
  `st.query_params` with those names to set its switches).
- `load_lesson(slug, lang)`: `lessons/<lang>/<slug>.md` without its machine-readable try-it block;
  `lesson_try_it(slug, lang)`: that block, a fenced ```try-it JSON list of demo links.
- `load_quiz()` / `parse_quiz(data)`: `lessons/quiz.json` -> `Quiz`; `ValueError` on bad data.
- `load_glossary()` / `search_terms(terms, query)`: `lessons/glossary.json` -> `Term`s.
- `load_figures()` / `fill_figures(text, lang)` (from lessons/figures.py): `lessons/figures.json`,
  filled into the lessons, quiz and glossary as they load.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlencode

from app import pagelist
from app.i18n import LANGS
from engine.config import SWITCHES  # the sidebar's switches and their values, declared once
from lessons.figures import (  # noqa: F401  (re-exported: the lessons' one home of numbers)
    FIGURE_REF,
    check_figures,
    figure_names,
    figure_text,
    fill_figures,
    load_figures,
    source_text,
)

LESSONS_DIR = Path(__file__).resolve().parents[1] / "lessons"

# Page slugs in menu order, and those with a lesson file: both from the page table.
PAGES, LESSON_PAGES = pagelist.PAGES, pagelist.LESSON_PAGES


# Every lesson ends with a section under this heading, then the try-it block.
TRY_IT_HEADINGS = {"zh": "动手试试", "en": "Try it"}
QUIZ_SETS = ("chapter", "extra")
NUM_CHOICES = 4

_TRY_IT_BLOCK = re.compile(r"^```try-it[ \t]*\n(.*?)^```[ \t]*\n?", re.S | re.M)


def check_page(page: object, where: str = "page") -> str:
    """Return `page` if it is a known slug, else raise ValueError naming `where`."""
    if page not in PAGES:
        raise ValueError(f"{where}: unknown page {page!r}; pages are {', '.join(PAGES)}")
    return page  # type: ignore[return-value]


def check_switches(switches: object, where: str = "switches") -> dict[str, str]:
    """Return the switches in `SWITCHES` order if every name and value exists, else ValueError."""
    if not isinstance(switches, dict):
        raise ValueError(f"{where}: must be an object of switch -> value, got {switches!r}")
    for name, value in switches.items():
        if name not in SWITCHES:
            raise ValueError(f"{where}: unknown switch {name!r}; switches are {list(SWITCHES)}")
        if value not in SWITCHES[name]:
            raise ValueError(
                f"{where}: switch {name!r} has no value {value!r}; allowed: {SWITCHES[name]}"
            )
    return {name: switches[name] for name in SWITCHES if name in switches}


def demo_url(page: str, switches: dict[str, str] | None = None) -> str:
    """The app-relative URL that opens `page` with `switches` set, e.g. "/paging?kv_layout=paged"."""
    check_page(page)
    query = urlencode(check_switches(switches or {}))
    return f"/{page}?{query}" if query else f"/{page}"


@dataclass(frozen=True)
class DemoLink:
    """A page plus switch settings: where a lesson step or a quiz answer can be seen live."""

    page: str
    switches: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return demo_url(self.page, self.switches)

    @classmethod
    def parse(cls, data: object, where: str, default_page: str | None = None) -> DemoLink:
        if not isinstance(data, dict):
            raise ValueError(f"{where}: must be an object with 'page' and 'switches'")
        extra = set(data) - {"page", "switches"}
        if extra:
            raise ValueError(f"{where}: unexpected keys {sorted(extra)}")
        page = check_page(data.get("page", default_page), f"{where}.page")
        switches = check_switches(data.get("switches", {}), f"{where}.switches")
        return cls(page, switches)


# ---------------------------------------------------------------- lessons


def _lesson_text(slug: str, lang: str) -> str:
    if slug not in LESSON_PAGES:
        raise ValueError(f"no lesson for page {slug!r}; lessons exist for {LESSON_PAGES}")
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}; languages are {LANGS}")
    return (LESSONS_DIR / lang / f"{slug}.md").read_text(encoding="utf-8")


def _split_try_it(text: str, where: str) -> tuple[str, list[DemoLink]]:
    """Cut the try-it block off a lesson; check it closes the file and its steps are valid."""
    blocks = list(_TRY_IT_BLOCK.finditer(text))
    if len(blocks) != 1:
        raise ValueError(f"{where}: needs exactly one ```try-it block, found {len(blocks)}")
    block = blocks[0]
    if text[block.end() :].strip():
        raise ValueError(f"{where}: the ```try-it block must be the last thing in the lesson")
    try:
        steps = json.loads(block.group(1))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: try-it block is not valid JSON: {exc}") from exc
    if not isinstance(steps, list) or not steps:
        raise ValueError(f"{where}: try-it block must be a non-empty JSON list of steps")
    slug = Path(where).stem
    links = [DemoLink.parse(s, f"{where} try-it[{i}]", slug) for i, s in enumerate(steps)]
    return text[: block.start()].rstrip() + "\n", links


def load_lesson(slug: str, lang: str) -> str:
    """The lesson's markdown for `slug` in `lang`, without the machine-readable try-it block,
    its figures filled in from `lessons/figures.json`, each with its kind's badge."""
    where = f"{lang}/{slug}.md"
    return fill_figures(_split_try_it(_lesson_text(slug, lang), where)[0], lang, where,
                        tag="badge")


def lesson_try_it(slug: str, lang: str = "en") -> list[DemoLink]:
    """The lesson's try-it steps: each a page and the switch settings that show its point live."""
    return _split_try_it(_lesson_text(slug, lang), f"{lang}/{slug}.md")[1]


# ---------------------------------------------------------------- quiz


@dataclass(frozen=True)
class Text:
    """One string in every language of `LANGS`."""

    zh: str
    en: str

    def get(self, lang: str) -> str:
        """The text in `lang`, with any `{{figure:NAME}}` filled from lessons/figures.json."""
        text = self.en if lang == "en" else self.zh
        if "{{" in text:
            from lessons.figures import fill_figures

            text = fill_figures(text, lang, "text", tag="words")
        return text

    @classmethod
    def parse(cls, data: object, where: str) -> Text:
        if not isinstance(data, dict) or set(data) != set(LANGS):
            raise ValueError(f"{where}: must be an object with exactly the keys {list(LANGS)}")
        for lang in LANGS:
            if not isinstance(data[lang], str) or not data[lang].strip():
                raise ValueError(f"{where}.{lang}: must be a non-empty string")
        return cls(zh=data["zh"].strip(), en=data["en"].strip())


@dataclass(frozen=True)
class Question:
    """A multiple-choice question: four choices, one answer, why, and where to see it live."""

    id: str
    set: str  # "chapter" (the chapter's own self-test) or "extra" (ours)
    question: Text
    choices: tuple[Text, ...]
    answer: int  # index into choices
    explanation: Text
    demo: DemoLink
    # Per choice: why a wrong choice is wrong (the misconception it holds), or None.
    whys: tuple[Text | None, ...] = ()

    def why(self, choice: int) -> Text | None:
        return self.whys[choice] if choice < len(self.whys) else None


@dataclass(frozen=True)
class Quiz:
    questions: tuple[Question, ...]
    # The chapter's five self-test questions again, as open prompts for a class discussion.
    open_prompts: tuple[Text, ...] = ()

    @property
    def chapter(self) -> tuple[Question, ...]:
        return tuple(q for q in self.questions if q.set == "chapter")

    @property
    def extra(self) -> tuple[Question, ...]:
        return tuple(q for q in self.questions if q.set == "extra")

    def by_id(self, qid: str) -> Question:
        for q in self.questions:
            if q.id == qid:
                return q
        raise KeyError(qid)


def _parse_question(data: object, where: str) -> Question:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be an object")
    required = {"id", "set", "question", "choices", "explanation", "demo"}
    missing, extra = required - set(data), set(data) - required
    if missing or extra:
        raise ValueError(f"{where}: missing keys {sorted(missing)}, unexpected {sorted(extra)}")
    qid = data["id"]
    if not isinstance(qid, str) or not re.fullmatch(r"[a-z0-9-]+", qid):
        raise ValueError(f"{where}.id: must match [a-z0-9-]+, got {qid!r}")
    where = f"{where} ({qid})"
    if data["set"] not in QUIZ_SETS:
        raise ValueError(f"{where}.set: must be one of {QUIZ_SETS}, got {data['set']!r}")
    choices = data["choices"]
    if not isinstance(choices, list) or len(choices) != NUM_CHOICES:
        got = len(choices) if isinstance(choices, list) else type(choices).__name__
        raise ValueError(f"{where}.choices: must be a list of {NUM_CHOICES}, got {got}")
    texts, correct, whys = [], [], []
    for i, choice in enumerate(choices):
        cw = f"{where}.choices[{i}]"
        if not isinstance(choice, dict) or not isinstance(choice.get("correct", False), bool):
            raise ValueError(f"{cw}: must be an object with zh, en, optional correct: bool "
                             "and optional why: {zh, en}")
        if choice.get("correct", False):
            correct.append(i)
        whys.append(Text.parse(choice["why"], f"{cw}.why") if "why" in choice else None)
        texts.append(Text.parse({k: v for k, v in choice.items() if k not in ("correct", "why")},
                                cw))
    if len(correct) != 1:
        raise ValueError(f"{where}.choices: exactly one must be correct, found {len(correct)}")
    if whys[correct[0]] is not None:
        raise ValueError(f"{where}.choices[{correct[0]}].why: only a wrong choice says why it "
                         "is wrong")
    for lang in LANGS:
        if len({t.get(lang) for t in texts}) != NUM_CHOICES:
            raise ValueError(f"{where}.choices: the {lang} choices must all differ")
    return Question(
        id=qid,
        set=data["set"],
        question=Text.parse(data["question"], f"{where}.question"),
        choices=tuple(texts),
        answer=correct[0],
        explanation=Text.parse(data["explanation"], f"{where}.explanation"),
        demo=DemoLink.parse(data["demo"], f"{where}.demo"),
        whys=tuple(whys),
    )


def parse_quiz(data: object) -> Quiz:
    """Validate quiz data (the parsed JSON) and build a `Quiz`; ValueError says what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("questions"), list):
        raise ValueError("quiz: must be an object with a 'questions' list")
    data = _fill_texts(data, "quiz")
    questions = tuple(
        _parse_question(q, f"quiz.questions[{i}]") for i, q in enumerate(data["questions"])
    )
    ids = [q.id for q in questions]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"quiz: duplicate question ids {dupes}")
    for name in QUIZ_SETS:
        if not any(q.set == name for q in questions):
            raise ValueError(f"quiz: no question in set {name!r}")
    prompts = data.get("open_prompts", [])
    if not isinstance(prompts, list):
        raise ValueError("quiz.open_prompts: must be a list of {zh, en} texts")
    return Quiz(questions, tuple(Text.parse(p, f"quiz.open_prompts[{i}]")
                                 for i, p in enumerate(prompts)))


@lru_cache(maxsize=4)
def load_quiz(path: Path | None = None) -> Quiz:
    """Load and validate `lessons/quiz.json` (or `path`)."""
    path = path or LESSONS_DIR / "quiz.json"
    return parse_quiz(json.loads(path.read_text(encoding="utf-8")))


# ---------------------------------------------------------------- glossary


@dataclass(frozen=True)
class Term:
    """A glossary entry: the term and a one- or two-sentence definition in both languages."""

    id: str
    term: Text
    definition: Text
    page: str | None = None  # the lesson page that shows it, if any
    # Other names the same idea goes by (e.g. 推测解码 for 投机解码): found by search, and
    # the tests hold the lessons to the term itself.
    aliases: tuple[str, ...] = ()

    def matches(self, query: str) -> bool:
        q = query.strip().casefold()
        hay = " ".join((self.term.zh, self.term.en, self.definition.zh, self.definition.en,
                        *self.aliases))
        return not q or q in hay.casefold()


def parse_glossary(data: object) -> tuple[Term, ...]:
    """Validate glossary data (a JSON list of terms); ValueError says what is wrong."""
    if not isinstance(data, list) or not data:
        raise ValueError("glossary: must be a non-empty list of terms")
    data = _fill_texts(data, "glossary")
    terms = []
    for i, item in enumerate(data):
        where = f"glossary[{i}]"
        if not isinstance(item, dict) or not {"id", "term", "definition"} <= set(item):
            raise ValueError(f"{where}: needs id, term and definition")
        extra = set(item) - {"id", "term", "definition", "page", "aliases"}
        if extra:
            raise ValueError(f"{where}: unexpected keys {sorted(extra)}")
        page = item.get("page")
        if page is not None:
            check_page(page, f"{where}.page")
        aliases = item.get("aliases", {})
        if not isinstance(aliases, dict) or set(aliases) - set(LANGS) or not all(
                isinstance(a, list) and all(isinstance(x, str) and x.strip() for x in a)
                for a in aliases.values()):
            raise ValueError(f"{where}.aliases: must be an object of language -> list of names")
        terms.append(
            Term(
                id=str(item["id"]),
                term=Text.parse(item["term"], f"{where}.term"),
                definition=Text.parse(item["definition"], f"{where}.definition"),
                page=page,
                aliases=tuple(x for lang in LANGS for x in aliases.get(lang, [])),
            )
        )
    ids = [t.id for t in terms]
    if len(set(ids)) != len(ids):
        raise ValueError("glossary: duplicate term ids")
    return tuple(terms)


@lru_cache(maxsize=1)
def load_glossary() -> tuple[Term, ...]:
    """Load and validate `lessons/glossary.json`."""
    return parse_glossary(json.loads((LESSONS_DIR / "glossary.json").read_text(encoding="utf-8")))


def search_terms(terms: tuple[Term, ...], query: str) -> list[Term]:
    """The terms whose name or definition (either language) contains `query`, case-insensitive."""
    return [t for t in terms if t.matches(query)]


def _fill_texts(data: object, where: str) -> object:
    """A copy of quiz or glossary data with the figures filled in every {zh, en} text."""
    if isinstance(data, dict):
        if set(data) >= set(LANGS) and all(isinstance(data[k], str) for k in LANGS):
            return {k: fill_figures(v, k, where, tag="words") if k in LANGS
                    else _fill_texts(v, where)
                    for k, v in data.items()}
        return {k: _fill_texts(v, where) for k, v in data.items()}
    if isinstance(data, list):
        return [_fill_texts(v, where) for v in data]
    return data
