"""The class's votes: rounds of vote, discuss and revote, and the pre/post test. Pure Python.

No HTTP here: `classroom/vote_routes.py` puts these objects behind the class server's
routes, the tests drive them directly, and the teacher's app computes gains from what they
export (`classroom/gains.py`). What they read of the course (the self-test, the pre/post
test's pairs, the misconceptions) comes in as data, a `Lessons`, loaded by whoever starts the
server (`Lessons.load()` reads the `lessons` package's files with importlib.resources).

What must hold:
- A phone is known by a pseudonymous id this module issues when the page joins (the page keeps
  it in localStorage, so a reload keeps it). Nothing a phone reads (`phone_view`,
  `test_view`) holds another phone's ballot, count or nickname.
- A ballot can change until its round locks (by the teacher or its deadline). A refused vote
  (`VoteError`) changes no count. Each refusal has a message in zh and en.
- No points for speed, no leaderboard: the time a ballot was cast is never kept.
- One open round at a time. A revote is round 2 of the same question; the reveal shows both
  rounds' histograms and the shift of the phones that voted in both.
- Hand counts (a show of hands) stand in for phones' ballots: histograms, suggestion and the
  reveal read `Round.counts()`, whichever of the two it holds.
- Pre/post test: two parallel forms, A and B, item i of one the twin of item i of the other.
  Phones alternate between group 0 (A first, B after) and group 1 (B first), in join order,
  so the class is counterbalanced. Both forms are held out of what the class sees between the
  tests: no self-test item is a test item, and a round opened on a test item anyway (its id or
  its question's text) is marked `on_test_item`, in the teacher's state, the export and the
  record.
- With a record (`Classroom.load`, `classroom/record.py`), every change is committed to it
  before the method that makes it returns: a join, ballot or test answer the route then
  acknowledges is on disk. One the disk refuses is refused (`not_saved`) and not counted.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import secrets
import sqlite3
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import NamedTuple

from classroom.record import CLASS_FILE_FORMAT, READS_CLASS_FILES, ClassFileError, ClassRecord

LANGS = ("zh", "en")
KINDS = ("prediction", "selftest", "test")

# The share right at lock that decides the suggested next move (peer instruction's rule of
# thumb): too few right to discuss usefully, enough to learn from each other, or most know it.
EXPLAIN_BELOW, REVEAL_ABOVE = 0.35, 0.70
MAX_ROUND_S = 3600.0
# the defaults of Classroom(flood_votes, flood_window_s): ballots one phone may send in a
# window; then refused
FLOOD_VOTES, FLOOD_WINDOW_S = 20, 10.0
MAX_NICK, MAX_WORDS = 32, 200

SUGGESTIONS = {
    "explain": {"zh": "答对的不到三分之一多：先讲解这个概念，再问一次。",
                "en": "Few are right: explain the idea first, then ask again."},
    "discuss": {"zh": "意见分歧：请和邻座讨论，说服对方，然后再投一次。",
                "en": "The class is split: discuss with a neighbour, then revote."},
    "reveal": {"zh": "大多数已经答对：揭晓答案，讲讲错的选项为什么错。",
               "en": "Most are right: reveal, and say why the other choices are wrong."},
    "measure": {"zh": "答案由引擎测出：运行演示，再揭晓测得的值。",
                "en": "The engine measures the answer: run the demo, then reveal the measured value."},
}

# A round opened on a pre/post test item (through the API: the app's picker offers none)
ON_TEST_ITEM = {
    "zh": "这一轮用的是前后测的题：学生在后测前就见到了它（揭晓后还见到了答案），这道题的"
          "前后测对比因此不再可信。导出的数据已把这一轮标为「用了测验题」。",
    "en": "This round shows a pre/post test item: the class sees it (and, at the reveal, its "
          "answer) before the post-test, so that item no longer measures what was learned. "
          "The export marks this round as on a test item."}

_ERRORS = {
    "unknown_phone": (404, "这部手机还没加入课堂：请刷新页面。",
                      "This phone has not joined the class: reload the page."),
    "wrong_class": (409, "这一轮属于另一个课堂：请扫描投影上的二维码。",
                    "This round belongs to another class: scan the code on the projector."),
    "no_round": (409, "现在没有开放的投票。", "No vote is open right now."),
    "closed": (409, "这一轮已经结束，不能再投或改票。",
               "This round is closed: votes can no longer be cast or changed."),
    "stale_round": (409, "这一轮已经结束，老师开了新的一轮：请刷新。",
                    "That round is over and a new one is open: refresh."),
    "unknown_choice": (400, "没有这个选项：请从列出的选项里选一个。",
                       "No such choice: pick one of the choices shown."),
    "flood": (429, "投得太快了：请稍等几秒再改。",
              "Too many votes too fast: wait a few seconds before changing it."),
    "no_test": (409, "现在没有进行中的测验。", "No test is open right now."),
    "unknown_item": (400, "测验里没有这道题。", "This test has no such item."),
    "bad_counts": (400, "手动计数要为每个选项填一个 0 到 10000 的整数。",
                   "Hand counts need one whole number from 0 to 10000 for each choice."),
    "bad_nickname": (400, "昵称太长或含有控制字符。",
                     "The nickname is too long or holds control characters."),
    "not_saved": (503, "课堂记录写不进磁盘，这一票没有记下：请告诉老师。",
                  "The class record cannot be written to disk, so this was not kept: tell "
                  "the teacher."),
}


class VoteError(Exception):
    """A refused request: an HTTP status, a code, and a message in each language."""

    def __init__(self, code: str, detail: str = "", status: int | None = None):
        st, zh, en = _ERRORS.get(code, (400, detail, detail))
        self.status = status or st
        self.code = code
        self.text = {"zh": zh + (f"（{detail}）" if detail and code in _ERRORS else ""),
                     "en": en + (f" ({detail})" if detail and code in _ERRORS else "")}
        super().__init__(self.text["en"])

    def message(self, lang: str) -> str:
        return self.text.get(lang, self.text["en"])


def pick_lang(requested: str | None, accept_language: str | None = None) -> str:
    """'zh' or 'en': an explicit choice first, else the first of Accept-Language we speak."""
    if requested in LANGS:
        return requested
    for part in (accept_language or "").split(","):
        tag = part.split(";")[0].strip().lower()
        if tag.startswith("zh"):
            return "zh"
        if tag.startswith("en"):
            return "en"
    return "en"


def _text(obj, where: str) -> dict:
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) and obj[k].strip()
                                            for k in LANGS):
        raise ValueError(f"{where}: needs non-empty 'zh' and 'en' strings")
    return {k: obj[k] for k in LANGS}


@dataclass
class Question:
    """One question as phones and projector show it, in both languages."""

    qid: str
    kind: str
    text: dict
    choices: list[dict]
    correct: int | None = None  # None: a prediction whose answer the engine measures later
    why: list[dict | None] = field(default_factory=list)
    explanation: dict | None = None
    misconceptions: list[str | None] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict) -> Question:
        """Validate a question a teacher sends; ValueError naming the field."""
        if not isinstance(d, dict):
            raise ValueError("question: must be an object")
        qid = d.get("id")
        if not isinstance(qid, str) or not 0 < len(qid) <= 64:
            raise ValueError("question.id: a string of 1 to 64 characters")
        kind = d.get("kind", "selftest")
        if kind not in KINDS:
            raise ValueError(f"question.kind: one of {KINDS}")
        raw = d.get("choices")
        if not isinstance(raw, list) or not 2 <= len(raw) <= 8:
            raise ValueError("question.choices: a list of 2 to 8 choices")
        choices = [_text(c, f"question.choices.{i}") for i, c in enumerate(raw)]
        correct = d.get("correct")
        if correct is not None and (not isinstance(correct, int) or isinstance(correct, bool)
                                    or not 0 <= correct < len(choices)):
            raise ValueError("question.correct: the index of a choice, or null")
        why = [(_text(c["why"], f"question.choices.{i}.why") if isinstance(c, dict)
                and c.get("why") else None) for i, c in enumerate(raw)]
        mis = [(c.get("misconception") if isinstance(c, dict) else None) for c in raw]
        expl = _text(d["explanation"], "question.explanation") if d.get("explanation") else None
        return cls(qid, kind, _text(d.get("question"), "question.question"), choices, correct,
                   why, expl, mis)

    @classmethod
    def from_saved(cls, d: dict) -> Question:
        """A question as `asdict` saved it (a round of a record or a class file), checked."""
        q = cls(d["qid"], d["kind"], _text(d["text"], "text"),
                [_text(c, "choice") for c in d["choices"]], d["correct"],
                [None if w is None else _text(w, "why") for w in d["why"]],
                None if d["explanation"] is None else _text(d["explanation"], "explanation"),
                list(d["misconceptions"]))
        if q.kind not in KINDS or not isinstance(q.qid, str) or (
                q.correct is not None and not 0 <= q.correct < len(q.choices)):
            raise ValueError(f"question {q.qid!r}: bad kind, id or correct choice")
        return q

    def for_phone(self, lang: str) -> dict:
        return {"id": self.qid, "kind": self.kind, "text": self.text[lang],
                "choices": [c[lang] for c in self.choices]}


def mask_name(name: str, hidden, words) -> str | None:
    """A nickname as a projector may show it: None when it is hidden (`hidden`: the hidden
    phones' nicknames), stars when it holds a word of the list (any case), else itself. Every
    place that projects a student's name passes it through here."""
    if not name:
        return name
    if name in hidden:
        return None
    low = name.lower()
    if any(w and w.lower() in low for w in words):
        return "*" * len(name)
    return name


def suggest(share_right: float | None) -> str:
    """The next move at lock: 'explain', 'discuss' or 'reveal' ('measure' with no answer yet)."""
    if share_right is None:
        return "measure"
    if share_right < EXPLAIN_BELOW:
        return "explain"
    if share_right <= REVEAL_ABOVE:
        return "discuss"
    return "reveal"


@dataclass
class Round:
    """One vote on one question: number 1, or 2 for the revote after a discussion."""

    rid: str
    question: Question
    number: int
    deadline: float
    state: str = "open"  # open -> locked -> revealed
    ballots: dict[str, int] = field(default_factory=dict)  # phone id -> choice
    hand: list[int] | None = None  # counts typed by the teacher, instead of ballots
    previous: Round | None = None  # round 1, for a revote
    hidden: bool = False  # the question is hidden from the projector
    measured: str | None = None  # a prediction's value as the engine measured it, at reveal
    on_test_item: str | None = None  # the pre/post test item it shows (pair:form), if any

    def counts(self) -> list[int]:
        if self.hand is not None:
            return list(self.hand)
        out = [0] * len(self.question.choices)
        for c in self.ballots.values():
            out[c] += 1
        return out

    def voters(self) -> int:
        return sum(self.counts())

    def share_right(self) -> float | None:
        n, c = self.voters(), self.question.correct
        if c is None or n == 0:
            return None
        return self.counts()[c] / n

    def shift(self) -> dict | None:
        """Phones that voted in both rounds: wrong->right, right->wrong, stayed right/wrong."""
        prev, c = self.previous, self.question.correct
        if prev is None or c is None or self.hand is not None or prev.hand is not None:
            return None
        both = set(prev.ballots) & set(self.ballots)
        out = {"wrong_to_right": 0, "right_to_wrong": 0, "stayed_right": 0,
               "stayed_wrong": 0, "matched": len(both)}
        for p in both:
            a, b = prev.ballots[p] == c, self.ballots[p] == c
            key = ("stayed_right" if a and b else "right_to_wrong" if a else
                   "wrong_to_right" if b else "stayed_wrong")
            out[key] += 1
        return out


@dataclass
class Phone:
    pid: str
    group: int  # 0: form A first; 1: form B first
    nickname: str = ""
    lang: str | None = None  # the language it joined in
    recent: deque = field(default_factory=deque)  # its last ballots' times (flood_votes kept)


@dataclass
class TestForm:
    """The two parallel forms: `pairs[i]` = (item of form A, its twin in form B)."""

    pairs: list[tuple[Question, Question]]
    minutes: int = 3

    def form(self, name: str) -> list[Question]:
        return [p[0 if name == "A" else 1] for p in self.pairs]

    def items(self) -> list[Question]:
        return [q for pair in self.pairs for q in pair]

    def holds(self, question: Question) -> str | None:
        """The id ("pair:A" or "pair:B") of the test item `question` shows, by its id or by
        its question's text in either language (a copy sent under another id), else None."""
        texts = {" ".join(question.text[lang].split()) for lang in LANGS}
        for q in self.items():
            if q.qid == question.qid or texts & {" ".join(q.text[lang].split())
                                                 for lang in LANGS}:
                return q.qid
        return None

    @property
    def fingerprint(self) -> str:
        """A short hash of both forms' items (ids, texts, choices, keys): a class's test
        answers (its record's, or a JSON class file's) are read only against the forms they
        were given on."""
        data = [[q.qid, q.text, q.choices, q.correct] for q in self.items()]
        blob = json.dumps(data, ensure_ascii=False, sort_keys=True).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class Lessons:
    """What the votes read of the course, as loaded data: `quiz` (lessons/quiz.json: the
    self-test a round may open), `pretest` (pretest.json: the test's pairs, both forms' items
    written out, none of them a self-test item) and `misconceptions` (misconceptions.json:
    what each wrong choice holds)."""

    quiz: dict
    pretest: dict
    misconceptions: dict

    @classmethod
    def load(cls) -> Lessons:
        """The course as packaged: the `lessons` package's files (importlib.resources), so an
        installed wheel has them and nothing reads a checkout by relative path."""
        from importlib.resources import files

        def read(name: str) -> dict:
            return json.loads(files("lessons").joinpath(name).read_text("utf-8"))

        return cls(read("quiz.json"), read("pretest.json"), read("misconceptions.json"))

    @property
    def questions(self) -> dict[str, dict]:
        """The self-test's questions by id."""
        return {q["id"]: q for q in self.quiz["questions"]}

    def item_names(self) -> dict[int, dict]:
        """Each pre/post test pair's idea ({zh, en}), by its index."""
        return {i: p["idea"] for i, p in enumerate(self.pretest["pairs"])}


@cache
def packaged_lessons() -> Lessons:
    """`Lessons.load()` once: the default of the helpers below when no `Lessons` is given."""
    return Lessons.load()


def load_misconceptions(lessons: Lessons | None = None) -> dict[str, dict]:
    data = (lessons or packaged_lessons()).misconceptions
    return {m["id"]: {"zh": m["zh"], "en": m["en"]} for m in data["misconceptions"]}


def quiz_question(q: dict, kind: str = "selftest", qid: str | None = None,
                  misconceptions: list | None = None) -> Question:
    """A question of lessons/quiz.json (its own shape) as a round's Question, its figures
    filled in (a phone shows "about 3.36", never "{{figure:alpha_08_k4}}")."""
    q = _filled(q)
    ch = q["choices"]
    correct = next(i for i, c in enumerate(ch) if c.get("correct"))
    mis = misconceptions or [None] * len(ch)
    return Question.from_dict({
        "id": qid or q["id"], "kind": kind, "question": q["question"], "correct": correct,
        "explanation": q.get("explanation"),
        "choices": [{**c, "misconception": m} for c, m in zip(ch, mis)]})


def _filled(node):
    """`node` (a quiz question's JSON) with every zh or en text's figures filled, each with
    its kind in words (a phone shows plain text)."""
    from lessons.figures import fill_figures

    if isinstance(node, dict):
        return {k: (fill_figures(v, k, tag="words") if k in ("zh", "en") and isinstance(v, str)
                    else _filled(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_filled(v) for v in node]
    return node


# lessons/pretest.json's format: 2 writes both forms' items out (question, choices, key,
# each wrong choice's misconception). Format 1 took form A's items from the self-test
# (quiz.json) by id, so the class saw them answered between the tests; it is refused.
PRETEST_FORMAT = 2


def _test_item(raw: dict, qid: str, known: dict) -> Question:
    """One form's item of a pair, its figures filled in, checked: exactly one right choice,
    every wrong choice a known misconception, the right one none."""
    raw = _filled(raw)
    choices = raw.get("choices") if isinstance(raw, dict) else None
    if not isinstance(choices, list) or sum(bool(c.get("correct")) for c in choices) != 1:
        raise ValueError(f"{qid}: needs its choices, exactly one of them correct")
    q = Question.from_dict({
        "id": qid, "kind": "test", "question": raw.get("question"), "choices": choices,
        "correct": next(i for i, c in enumerate(choices) if c.get("correct"))})
    for i, m in enumerate(q.misconceptions):
        if (m is None) != (i == q.correct) or (m is not None and m not in known):
            raise ValueError(f"{qid}: choice {i} needs a known misconception "
                             f"(and the right choice none), got {m!r}")
    return q


def load_test_forms(lessons: Lessons | None = None) -> TestForm:
    """lessons/pretest.json: each pair's form A item and its form B twin, both written out
    there (format 2); ValueError naming the file's format when it is another."""
    lessons = lessons or packaged_lessons()
    data = lessons.pretest
    version = data.get("version") if isinstance(data, dict) else None
    if version != PRETEST_FORMAT:
        raise ValueError(
            f"lessons/pretest.json: format {version!r}, this course reads format "
            f"{PRETEST_FORMAT} (each pair's items of form A and form B written out; format 1 "
            f"took form A from the self-test, which the class sees answered)")
    known = load_misconceptions(lessons)
    quiz = {" ".join(q["question"][lang].split()) for q in _filled(lessons.quiz["questions"])
            for lang in LANGS}
    pairs = []
    for p in data["pairs"]:
        a, b = (_test_item(p[f], f"{p['id']}:{f}", known) for f in ("A", "B"))
        for q in (a, b):
            if {" ".join(q.text[lang].split()) for lang in LANGS} & quiz:
                raise ValueError(f"{q.qid}: is a self-test question (quiz.json); a test item "
                                 f"is held out of the self-test")
        pairs.append((a, b))
    return TestForm(pairs, data.get("minutes", 3))


class TestTables(NamedTuple):
    """What `classroom.gains.class_gains` reads of a class's tests (its keyword arguments)."""

    pre: dict  # student -> item -> right (a blank is not right)
    post: dict
    tags: dict  # (phase, student, item) -> the misconception the answer fell into, or None
    offers: dict  # (phase, student, item) -> the misconceptions that item of its form offers
    blanks: frozenset  # the (phase, student, item) answers left blank
    forms: dict = {}  # (phase, student) -> the form ("A" or "B") it took


@dataclass
class TestPhase:
    phase: str  # "pre" or "post"
    open: bool = True
    answers: dict[str, dict[int, int]] = field(default_factory=dict)  # phone -> pair -> choice
    hand: dict[int, dict[str, list[int]]] = field(default_factory=dict)  # pair -> form -> counts


def _clean_nick(nick: str) -> str:
    if not isinstance(nick, str) or len(nick) > MAX_NICK or any(
            ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0 for ch in nick):
        raise VoteError("bad_nickname")
    return nick.strip()


def _read_json(path) -> dict:
    """A JSON class file (the format before the record): its data, or ClassFileError."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ClassFileError(path, f"cannot be read ({exc})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ClassFileError(path, f"is not whole JSON (truncated or damaged: {exc})") from None


class Classroom:
    """One class's phones, rounds and tests. Not thread-safe: one event loop drives it.
    `Classroom.load` opens (or creates) its record on disk (`classroom/record.py`), which every
    change is committed to before the method that makes it returns; without one (`record`
    None) nothing is kept."""

    def __init__(self, class_id: str | None = None, forms: TestForm | None = None,
                 clock=time.monotonic, flood_votes: int = FLOOD_VOTES,
                 flood_window_s: float = FLOOD_WINDOW_S):
        self.class_id = class_id or secrets.token_urlsafe(6)
        self.clock = clock
        self.flood_votes, self.flood_window_s = flood_votes, flood_window_s
        self.phones: dict[str, Phone] = {}
        self.rounds: list[Round] = []
        self.current: Round | None = None
        self.forms = forms
        self.tests: dict[str, TestPhase] = {}
        self.open_test: str | None = None
        self.hidden_nicks: set[str] = set()  # phone ids whose nickname the projector hides
        self.words: list[str] = []
        # the salt of the pseudonymous ids (`handle`): the CSV's and the teacher page's, never a
        # phone's bearer id, and not linkable across classes
        self.salt = secrets.token_hex(8)
        # what the class server signs its phones' tokens with (`ServerState.phone_secret`)
        # and the join code it asks for: kept with the class, so a restarted server accepts
        # every phone's token and the code on the projector (classroom/serve.py)
        self.phone_secret = secrets.token_bytes(32)
        self.join_code: str | None = None
        self.version = 0  # bumped on every change a projector draws
        self.listeners: list = []  # callables run after every change (the router's wake-up)
        self.record: ClassRecord | None = None  # `load` opens it; None: nothing is kept
        self.migrated_from: str | None = None  # the JSON class file `load` read, if any
        self.record_error: str | None = None  # the last write the disk refused, for the log

    # --- bookkeeping ------------------------------------------------------------------------
    def _changed(self) -> None:
        self.version += 1
        for fn in list(self.listeners):
            fn()

    def _write(self, what: str, *args, **kwargs) -> None:
        """Commit one change to the record (`ClassRecord.<what>(...)`) before the caller
        acknowledges it. A disk that refuses it refuses the request (VoteError 'not_saved',
        503): nothing a phone is told was kept is missing from the record."""
        if self.record is None:
            return
        try:
            getattr(self.record, what)(*args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            self.record_error = f"class record {self.record.path}: cannot be written ({exc})"
            raise VoteError("not_saved") from None

    def _save_rounds(self, *rounds: Round) -> None:
        """Rounds whose state, deadline, hand counts or question changed (and the current
        round), into the record; their ballots go in one by one (`vote`)."""
        if self.record is not None:
            self._write("rounds", [(self.rounds.index(r) + 1, self._round_data(r))
                                   for r in rounds],
                        None if self.current is None else self.current.rid)

    def _test_items(self) -> int | None:
        return None if self.forms is None else len(self.forms.pairs)

    def _test_forms(self) -> str | None:
        """The fingerprint of the test forms this class's answers are taken on."""
        return None if self.forms is None else self.forms.fingerprint

    # --- the class's data: its record on disk, or a JSON class file of before ------------------
    def _round_data(self, r: Round) -> dict:
        return {"rid": r.rid, "number": r.number, "state": r.state,
                "question": asdict(r.question),
                "seconds_left": max(0.0, r.deadline - self.clock()),
                "ballots": dict(r.ballots),
                "hand": None if r.hand is None else list(r.hand),
                "previous": None if r.previous is None else r.previous.rid,
                "hidden": r.hidden, "measured": r.measured, "on_test_item": r.on_test_item}

    @staticmethod
    def _phone_data(p: Phone) -> dict:
        return {"id": p.pid, "group": p.group, "nickname": p.nickname, "lang": p.lang}

    def snapshot(self) -> dict:
        """The class as JSON-ready data: phones (id, nickname, language, form group), rounds
        (question, state, ballots, hand counts, the revote's first round, the test item it
        showed), the tests' answers and hand counts, the test forms they are taken on
        (`test_forms`), hidden names, the word list, the salt, the phones' signing secret
        and the join code. Not the flood counters (a restart forgives). An open round keeps
        the seconds it has left (the clock is this process's). `ClassRecord.write_all`
        writes it; `ClassRecord.read` gives it back; `restore` loads it."""
        tests = {}
        for ph, t in self.tests.items():
            tests[ph] = {"open": t.open,
                         "answers": {pid: {str(i): c for i, c in a.items()}
                                     for pid, a in t.answers.items()},
                         "hand": {str(i): {f: list(c) for f, c in by.items()}
                                  for i, by in t.hand.items()}}
        cur = self.current
        return {"format": CLASS_FILE_FORMAT, "class": self.class_id, "version": self.version,
                "phones": [self._phone_data(p) for p in self.phones.values()],
                "rounds": [self._round_data(r) for r in self.rounds],
                "current": None if cur is None else cur.rid,
                "tests": tests, "open_test": self.open_test, "test_items": self._test_items(),
                "test_forms": self._test_forms(),
                "hidden_nicks": sorted(self.hidden_nicks), "words": list(self.words),
                "salt": self.salt, "phone_secret": self.phone_secret.hex(),
                "join_code": self.join_code}

    def restore(self, data: dict) -> None:
        """Fill this (new, empty) class from `snapshot()`'s data (a record's, or a JSON class
        file's), checked as a whole. ValueError, KeyError or TypeError on data that is not a
        class (`load` turns them into ClassFileError). Format 1 (before `on_test_item` and
        `test_forms`) loads without test answers; with them it is refused, as are answers
        taken on test forms other than this course's."""
        if not isinstance(data, dict) or data.get("format") not in READS_CLASS_FILES:
            raise ValueError(f"not a class of format "
                             f"{' or '.join(map(str, READS_CLASS_FILES))}")
        now = self.clock()
        self.class_id = str(data["class"])
        self.version = int(data["version"])
        phones = {}
        for p in data["phones"]:
            if not isinstance(p["id"], str) or p["group"] not in (0, 1):
                raise ValueError("a phone needs a string id and a group 0 or 1")
            lang = p.get("lang")
            if lang not in (None, *LANGS):
                raise ValueError(f"a phone's language {lang!r} is not one of {LANGS}")
            phones[p["id"]] = Phone(p["id"], p["group"], str(p["nickname"]), lang,
                                    deque(maxlen=self.flood_votes))
        by_rid: dict[str, Round] = {}
        rounds = []
        for d in data["rounds"]:
            q = Question.from_saved(d["question"])
            if d["state"] not in ("open", "locked", "revealed"):
                raise ValueError(f"round {d['rid']!r}: unknown state {d['state']!r}")
            ballots = {str(pid): int(c) for pid, c in d["ballots"].items()}
            if any(pid not in phones or not 0 <= c < len(q.choices)
                   for pid, c in ballots.items()):
                raise ValueError(f"round {d['rid']!r}: a ballot of an unknown phone or choice")
            prev = d["previous"]
            if prev is not None and prev not in by_rid:
                raise ValueError(f"round {d['rid']!r}: its first round {prev!r} is missing")
            hand = None if d["hand"] is None else [int(c) for c in d["hand"]]
            r = Round(str(d["rid"]), q, int(d["number"]), now + float(d["seconds_left"]),
                      d["state"], ballots, hand, by_rid.get(prev), bool(d["hidden"]),
                      d["measured"], d.get("on_test_item"))
            by_rid[r.rid] = r
            rounds.append(r)
        if data["current"] is not None and data["current"] not in by_rid:
            raise ValueError(f"the current round {data['current']!r} is missing")
        n = None if self.forms is None else len(self.forms.pairs)
        if data["tests"] and data["test_items"] != n:
            raise ValueError(f"its tests have {data['test_items']} items, this course's {n}")
        if data["tests"] and data["format"] == 1:
            raise ValueError("its pre/post test was given on the old forms (format 1, a JSON "
                             "class file's or a layout-1 record's: form A was the self-test's "
                             "items); scored against this "
                             "course's forms its answers would mean other questions. Export its "
                             "CSV with the version that wrote it, or start a new class")
        mine = self._test_forms()
        if data["tests"] and data["format"] > 1 and data["test_forms"] != mine:
            raise ValueError(f"its pre/post test was given on other test forms "
                             f"({data['test_forms']}, this course's {mine}): its answers would "
                             f"be scored against other questions")
        tests = {}
        for ph, d in data["tests"].items():
            if ph not in ("pre", "post"):
                raise ValueError(f"unknown test phase {ph!r}")
            answers = {str(pid): {int(i): int(c) for i, c in a.items()}
                       for pid, a in d["answers"].items()}
            if any(pid not in phones for pid in answers):
                raise ValueError(f"the {ph}-test holds an unknown phone's answers")
            hand = {int(i): {str(f): [int(c) for c in cs] for f, cs in by.items()}
                    for i, by in d["hand"].items()}
            tests[ph] = TestPhase(ph, bool(d["open"]), answers, hand)
        if data["open_test"] not in (None, *tests):
            raise ValueError(f"the open test {data['open_test']!r} is missing")
        self.phones, self.rounds, self.tests = phones, rounds, tests
        self.current = by_rid.get(data["current"])
        self.open_test = data["open_test"]
        self.hidden_nicks = {str(p) for p in data["hidden_nicks"]}
        self.words = [str(w) for w in data["words"]]
        self.salt = str(data.get("salt") or self.salt)  # (a file from before the handles)
        if data.get("phone_secret") is not None:  # (a JSON class file has none)
            secret = bytes.fromhex(data["phone_secret"])
            if len(secret) < 16:
                raise ValueError("the phones' signing secret is too short")
            self.phone_secret = secret
        code = data.get("join_code")
        if code is not None and (not isinstance(code, str) or not code):
            raise ValueError("the join code is not a string")
        self.join_code = code

    @classmethod
    def load(cls, path, forms: TestForm | None = None, legacy=None, **kwargs) -> Classroom:
        """The class kept in the record at `path` (`classroom/record.py`), open for its
        changes. Nothing there: a new, empty class, its record made now; or, when `legacy`
        names a JSON class file (the format before the record), that class, read into the new
        record once (the JSON file is left as it is; `migrated_from` names it). A record of
        the layout before (`ClassRecord.upgrade`) is brought to this one once its class loads.
        ClassFileError, naming the file and what is wrong with it, when it cannot be read or
        does not hold a whole class this course can load: the caller decides (the class
        server refuses to start, classroom/serve.py)."""
        path = os.fspath(path)
        room = cls(forms=forms, **kwargs)
        record = ClassRecord.open(path)
        try:
            if not record.new:
                room._restore_from(path, record.read)
            elif legacy is not None and os.path.exists(legacy):
                room._restore_from(os.fspath(legacy), lambda: _read_json(legacy))
                room.migrated_from = os.fspath(legacy)
            try:
                # a layout-1 record, its class loaded or none in it yet: to this layout
                record.upgrade(room._test_forms())
                if record.new:
                    record.write_all(room.snapshot())
            except sqlite3.Error as exc:
                raise ClassFileError(path, f"cannot be written ({exc})") from None
        except BaseException:
            record.close()
            raise
        room.record = record
        return room

    def _restore_from(self, path: str, read) -> None:
        try:
            self.restore(read())
        except ClassFileError:
            raise
        except sqlite3.DatabaseError as exc:
            raise ClassFileError(path, f"is damaged ({exc})") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ClassFileError(path, f"does not hold a class this course can load "
                                       f"({what})") from None

    def join(self, pid: str | None = None, nickname: str = "", lang: str | None = None
             ) -> Phone:
        """The phone's id: the one it kept if this class knows it, else a new one. In the
        record before it returns (the phone keeps the id it is given)."""
        nickname = _clean_nick(nickname)
        lang = lang if lang in LANGS else None
        if pid and pid in self.phones:
            phone = self.phones[pid]
            nick, lang = nickname or phone.nickname, lang or phone.lang
            if (nick, lang) != (phone.nickname, phone.lang):
                self._write("phone", {**self._phone_data(phone), "nickname": nick,
                                      "lang": lang})
                phone.nickname, phone.lang = nick, lang
            return phone
        pid = secrets.token_urlsafe(12)
        phone = Phone(pid, len(self.phones) % 2, nickname, lang, deque(maxlen=self.flood_votes))
        self._write("phone", self._phone_data(phone))
        self.phones[pid] = phone
        self._changed()
        return phone

    def _phone(self, pid: str, class_id: str | None) -> Phone:
        if class_id is not None and class_id != self.class_id:
            raise VoteError("wrong_class")
        phone = self.phones.get(pid or "")
        if phone is None:
            raise VoteError("unknown_phone")
        return phone

    def _flood(self, phone: Phone) -> None:
        now = self.clock()
        if (len(phone.recent) == self.flood_votes
                and now - phone.recent[0] < self.flood_window_s):
            raise VoteError("flood")
        phone.recent.append(now)

    def _expire(self) -> None:
        r = self.current
        if r is not None and r.state == "open" and self.clock() >= r.deadline:
            r.state = "locked"
            self._save_rounds(r)
            self._changed()

    # --- rounds -----------------------------------------------------------------------------
    def open_round(self, question: Question, seconds: float = 60.0) -> Round:
        if not 1 <= seconds <= MAX_ROUND_S:
            raise ValueError(f"seconds: between 1 and {MAX_ROUND_S:.0f}")
        before = self.current
        if before is not None and before.state == "open":
            before.state = "locked"
        r = Round(f"{self.class_id}-{len(self.rounds) + 1}", question, 1,
                  self.clock() + seconds,
                  on_test_item=None if self.forms is None else self.forms.holds(question))
        self.rounds.append(r)
        self.current = r
        self._save_rounds(*([before] if before is not None else []), r)
        self._changed()
        return r

    def _round(self, rid: str | None) -> Round:
        if rid is None:
            if self.current is None:
                raise VoteError("no_round")
            return self.current
        for r in self.rounds:
            if r.rid == rid:
                return r
        raise VoteError("no_round", rid)

    def lock(self, rid: str | None = None) -> Round:
        r = self._round(rid)
        if r.state == "open":
            r.state = "locked"
            self._save_rounds(r)
            self._changed()
        return r

    def extend(self, seconds: float, rid: str | None = None) -> Round:
        self._expire()
        r = self._round(rid)
        if r.state != "open":
            raise VoteError("closed")
        if not 0 < seconds <= MAX_ROUND_S:
            raise ValueError(f"seconds: between 0 and {MAX_ROUND_S:.0f}")
        r.deadline = max(r.deadline, self.clock()) + seconds
        self._save_rounds(r)
        self._changed()
        return r

    def revote(self, seconds: float = 60.0, rid: str | None = None) -> Round:
        """Round 2 of the same question; the phones' first ballots stay with round 1."""
        first = self.lock(rid)
        if first.number != 1:
            raise ValueError("a revote follows a first round")
        r = Round(f"{first.rid}r", first.question, 2, self.clock() + seconds, previous=first,
                  hidden=first.hidden, on_test_item=first.on_test_item)
        self.rounds.append(r)
        self.current = r
        self._save_rounds(r)
        self._changed()
        return r

    def reveal(self, correct: int | None = None, rid: str | None = None,
               measured: str | None = None) -> Round:
        """Lock and reveal; `correct` sets a prediction's answer (the measured range) and
        `measured` the value the engine measured, as text."""
        r = self.lock(rid)
        if measured is not None:
            if not isinstance(measured, str) or len(measured) > 40:
                raise ValueError("measured: a short text (40 characters at most)")
            r.measured = measured
        if correct is not None:
            if not 0 <= correct < len(r.question.choices):
                raise ValueError("correct: the index of a choice")
            r.question.correct = correct
        r.state = "revealed"
        if r.previous is not None:
            r.previous.state = "revealed"
        self._save_rounds(*([r.previous] if r.previous is not None else []), r)
        self._changed()
        return r

    def hand_count(self, counts: list[int], rid: str | None = None) -> Round:
        r = self._round(rid)
        if (not isinstance(counts, list) or len(counts) != len(r.question.choices)
                or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 10000
                           for c in counts)):
            raise VoteError("bad_counts")
        r.hand = list(counts)
        if r.state == "open":
            r.state = "locked"
        self._save_rounds(r)
        self._changed()
        return r

    def vote(self, pid: str, rid: str, choice: int, class_id: str | None = None) -> Round:
        phone = self._phone(pid, class_id)
        self._expire()
        r = self.current
        if r is None:
            raise VoteError("no_round")
        if rid != r.rid:
            if any(x.rid == rid for x in self.rounds):
                raise VoteError("stale_round")
            raise VoteError("wrong_class" if "-" in str(rid) and not str(rid).startswith(
                self.class_id + "-") else "no_round")
        if r.state != "open" or r.hand is not None:
            raise VoteError("closed")
        if not isinstance(choice, int) or isinstance(choice, bool) or not (
                0 <= choice < len(r.question.choices)):
            raise VoteError("unknown_choice", str(choice)[:20])
        self._flood(phone)
        if r.ballots.get(pid) != choice:
            self._write("ballot", r.rid, pid, choice)  # on disk before the phone hears of it
            r.ballots[pid] = choice
            self._changed()
        return r

    # --- what each screen reads ---------------------------------------------------------------
    def phone_view(self, pid: str, lang: str) -> dict:
        """The open round for one phone: the question, its own ballot, never anyone else's."""
        self._phone(pid, None)
        self._expire()
        r = self.current
        out: dict = {"class": self.class_id, "lang": lang, "round": None,
                     "test": self.open_test}
        if r is None:
            return out
        q = r.question
        view = {"id": r.rid, "number": r.number, "state": r.state,
                "question": q.for_phone(lang), "mine": r.ballots.get(pid),
                "seconds_left": max(0.0, round(r.deadline - self.clock(), 1))
                if r.state == "open" else 0.0}
        if r.state == "revealed" and q.correct is not None:
            view["correct"] = q.correct
            view["measured"] = r.measured
            w = q.why[r.ballots[pid]] if pid in r.ballots and r.ballots[pid] < len(q.why) else None
            view["why"] = w[lang] if w else None
            view["explanation"] = q.explanation[lang] if q.explanation else None
        out["round"] = view
        return out

    def display_name(self, pid: str) -> str:
        """A nickname as the projector may show it: hidden or masked by the word list."""
        phone = self.phones.get(pid)
        if phone is None or pid in self.hidden_nicks or not phone.nickname:
            return ""
        return mask_name(phone.nickname, (), self.words) or ""

    def handle(self, pid: str) -> str:
        """A phone's pseudonymous id: a salted hash of its bearer id (which lets it vote), so
        the CSV and the teacher's page name a student without holding the key to their
        phone."""
        return hashlib.sha256((self.salt + pid).encode()).hexdigest()[:12]

    def masking(self) -> dict:
        """What every projected name passes through (`mask_name`): the nicknames of the
        hidden phones and the word list."""
        return {"hidden": sorted({self.phones[p].nickname for p in self.hidden_nicks
                                  if p in self.phones and self.phones[p].nickname}),
                "words": list(self.words)}

    def names(self) -> list[dict]:
        """The teacher's list of named phones: its handle, the name as projected (masked by
        the word list; a hidden one still listed, so it can be shown again), hidden or not."""
        return [{"handle": self.handle(p), "name": mask_name(ph.nickname, (), self.words),
                 "hidden": p in self.hidden_nicks}
                for p, ph in self.phones.items() if ph.nickname]

    def set_hidden(self, handle: str, hidden: bool) -> None:
        pid = next((p for p in self.phones if self.handle(p) == handle), None)
        if pid is None:
            raise ValueError("handle: no such phone")
        new = self.hidden_nicks | {pid} if hidden else self.hidden_nicks - {pid}
        self._write("meta", hidden_nicks=sorted(new))
        self.hidden_nicks = new
        self._changed()

    def hide_question(self, hidden: bool) -> None:
        """Hide the current round's question from the projector, or show it again."""
        r = self.current
        if r is None:
            raise VoteError("no_round")
        r.hidden = bool(hidden)
        self._save_rounds(r)
        self._changed()

    def set_join_code(self, code: str) -> None:
        """The join code the class server asks for, kept for its restarts."""
        if not isinstance(code, str) or not code:
            raise ValueError("join code: a non-empty string")
        self._write("meta", join_code=code)
        self.join_code = code

    def set_words(self, words: list[str]) -> None:
        """The word list every projected name passes through (`mask_name`)."""
        if not isinstance(words, list) or len(words) > MAX_WORDS or not all(
                isinstance(w, str) and 0 < len(w.strip()) <= 40 for w in words):
            raise ValueError(f"words: a list of up to {MAX_WORDS} words of 1 to 40 characters")
        words = [w.strip() for w in words]
        self._write("meta", words=words)
        self.words = words
        self._changed()

    def projector(self, lang: str) -> dict:
        """How many have voted while open (not how); histograms from lock; reveal with shift."""
        self._expire()
        r = self.current
        out: dict = {"class": self.class_id, "version": self.version, "phones": len(self.phones),
                     "round": None, "test": self.test_status()}
        if r is None:
            return out
        q = r.question
        view = {"id": r.rid, "number": r.number, "state": r.state, "kind": q.kind,
                "qid": q.qid, "hidden": r.hidden, "on_test_item": r.on_test_item,
                "question": None if r.hidden else q.text[lang],
                "choices": [c[lang] for c in q.choices], "voted": r.voters(),
                "hand": r.hand is not None,
                "seconds_left": max(0.0, round(r.deadline - self.clock(), 1))
                if r.state == "open" else 0.0}
        if r.on_test_item:  # the teacher's warning, in the view the teacher's page draws
            view["test_item_warning"] = ON_TEST_ITEM[lang]
        if r.state != "open":
            share = r.share_right()
            view["counts"] = r.counts()
            view["share_right"] = share
            move = suggest(share)
            view["suggestion"] = move
            view["suggestion_text"] = SUGGESTIONS[move][lang]
            if r.previous is not None:
                view["previous_counts"] = r.previous.counts()
        if r.state == "revealed":
            view["correct"] = q.correct
            view["measured"] = r.measured
            view["shift"] = r.shift()
            view["why"] = [w[lang] if w else None for w in q.why]
            view["explanation"] = q.explanation[lang] if q.explanation else None
        out["round"] = view
        return out

    # --- the pre/post test ----------------------------------------------------------------
    def form_of(self, pid: str, phase: str) -> str:
        g = self.phones[pid].group
        return "A" if (g == 0) == (phase == "pre") else "B"

    def start_test(self, phase: str) -> TestPhase:
        if phase not in ("pre", "post"):
            raise ValueError("phase: 'pre' or 'post'")
        if self.forms is None:
            raise ValueError("this class has no test forms")
        if phase == "pre" and "post" in self.tests:
            # the pre-test is the baseline: reopened after the post-test began, students who
            # saw the lesson could change their "before" answers
            raise ValueError("the post-test has started: the pre-test cannot be reopened")
        self._write("test", phase, True, phase, self._test_items(), self._test_forms())
        t = self.tests.setdefault(phase, TestPhase(phase))
        t.open = True
        self.open_test = phase
        self._changed()
        return t

    def stop_test(self) -> None:
        if self.open_test is not None:
            self._write("test", self.open_test, False, None, self._test_items(),
                        self._test_forms())
            self.tests[self.open_test].open = False
            self.open_test = None
            self._changed()

    def test_view(self, pid: str, lang: str) -> dict:
        """This phone's form of the open test, its own answers, nothing of anyone else's."""
        self._phone(pid, None)
        if self.open_test is None:
            raise VoteError("no_test")
        t = self.tests[self.open_test]
        form = self.form_of(pid, t.phase)
        mine = t.answers.get(pid, {})
        return {"phase": t.phase, "form": form, "minutes": self.forms.minutes,
                "items": [{"index": i, **q.for_phone(lang), "mine": mine.get(i)}
                          for i, q in enumerate(self.forms.form(form))]}

    def answer_test(self, pid: str, item: int, choice: int, class_id: str | None = None) -> None:
        phone = self._phone(pid, class_id)
        if self.open_test is None:
            raise VoteError("no_test")
        t = self.tests[self.open_test]
        items = self.forms.form(self.form_of(pid, t.phase))
        if not isinstance(item, int) or isinstance(item, bool) or not 0 <= item < len(items):
            raise VoteError("unknown_item")
        if not isinstance(choice, int) or isinstance(choice, bool) or not (
                0 <= choice < len(items[item].choices)):
            raise VoteError("unknown_choice", str(choice)[:20])
        self._flood(phone)
        self._write("answer", t.phase, pid, item, choice)  # on disk before the phone hears
        t.answers.setdefault(pid, {})[item] = choice
        self._changed()

    def test_status(self) -> dict:
        return {"open": self.open_test,
                "answered": {ph: len(t.answers) for ph, t in self.tests.items()}}

    def test_hand_count(self, phase: str, item: int, form: str, counts: list[int]) -> None:
        if phase not in ("pre", "post") or form not in ("A", "B") or self.forms is None:
            raise ValueError("phase 'pre'/'post', form 'A'/'B'")
        if not 0 <= item < len(self.forms.pairs):
            raise ValueError("item: an index of the test")
        n = len(self.forms.form(form)[item].choices)
        if len(counts) != n or not all(isinstance(c, int) and c >= 0 for c in counts):
            raise ValueError(f"counts: {n} whole numbers")
        self._write("test_hand", phase, item, form, list(counts), self._test_items(),
                    self._test_forms())
        self.tests.setdefault(phase, TestPhase(phase, open=False)).hand.setdefault(
            item, {})[form] = list(counts)
        self._changed()

    # --- export -----------------------------------------------------------------------------
    def records(self) -> list[dict]:
        """One row a student an item: rounds' ballots and both tests' answers, pseudonymous.
        A round's rows name the test item it showed, if it showed one (`on_test_item`).
        A test's item a student left blank (of a test it answered) has its row too, `blank` 1,
        no choice, `correct` 0: the gains count it wrong, so the CSV agrees with them."""
        rows = []
        for r in self.rounds:
            q = r.question
            for pid, c in r.ballots.items():
                rows.append({"student": pid, "source": f"round{r.number}", "item": q.qid,
                             "form": "", "choice": c,
                             "correct": "" if q.correct is None else int(c == q.correct),
                             "misconception": (q.misconceptions[c] if c < len(q.misconceptions)
                                               else None) or "", "blank": 0,
                             "on_test_item": r.on_test_item or ""})
        for phase, t in self.tests.items():
            for pid, ans in t.answers.items():
                form = self.form_of(pid, phase)
                items = self.forms.form(form)
                for i, q in enumerate(items):
                    c = ans.get(i)
                    rows.append({"student": pid, "source": phase, "item": self.forms.pairs[i][0]
                                 .qid.split(":")[0], "form": form,
                                 "choice": "" if c is None else c,
                                 "correct": int(c == q.correct),
                                 "misconception": "" if c is None else q.misconceptions[c] or "",
                                 "blank": int(c is None), "on_test_item": ""})
        return rows

    def export_csv(self, with_nicknames: bool = False) -> str:
        """CSV of `records()`, each student by a pseudonymous id (`handle`); the nickname
        column only in the teacher's export."""
        cols = ["student"] + (["nickname"] if with_nicknames else []) + [
            "source", "item", "form", "choice", "correct", "misconception", "blank",
            "on_test_item"]
        buf = io.StringIO()
        w = csv.DictWriter(buf, cols, extrasaction="ignore")
        w.writeheader()
        for row in self.records():
            pid = row["student"]
            if with_nicknames:
                row["nickname"] = self.phones[pid].nickname
            row["student"] = self.handle(pid)
            w.writerow(row)
        return buf.getvalue()

    def test_tables(self) -> TestTables:
        """For gains: student -> item -> right, the misconception each answer fell into, the
        misconceptions each student's item offers (its form's, the shares' denominator), the
        answers left blank and the form each student took in each test (the per-form and
        per-order means). A student is in a test once it answered one of its items."""
        out: dict[str, dict] = {"pre": {}, "post": {}}
        tags: dict[tuple, str | None] = {}
        offers: dict[tuple, frozenset] = {}
        forms: dict[tuple, str] = {}
        if self.forms is None:
            return TestTables(out["pre"], out["post"], tags, offers, frozenset(), forms)
        n = len(self.forms.pairs)
        for phase, t in self.tests.items():
            for pid, ans in t.answers.items():
                forms[(phase, pid)] = form = self.form_of(pid, phase)
                items = self.forms.form(form)
                out[phase][pid] = {i: (i in ans and ans[i] == items[i].correct) for i in range(n)}
                for i in range(n):
                    tags[(phase, pid, i)] = items[i].misconceptions[ans[i]] if i in ans else None
                    offers[(phase, pid, i)] = frozenset(m for m in items[i].misconceptions if m)
        blanks = frozenset((ph, pid, i) for ph, t in self.tests.items() for pid, ans in
                           t.answers.items() for i in range(n) if i not in ans)
        return TestTables(out["pre"], out["post"], tags, offers, blanks, forms)
