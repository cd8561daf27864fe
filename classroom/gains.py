"""What the class gained between the pre-test and the post-test. Pure functions.

Inputs are the class's own answers: `pre` and `post` map a student's pseudonymous id to
{item index: right?}, one entry for every item of the form the student took (an item left
blank counts as not right). Or, for a class without phones, hand counts per item.

The measures (what the summary page and the CSV show):
- pre% and post%: the class's average score on the students matched across both tests (a
  student who took only one test is left out of every measure and counted in `unmatched`);
  `blank`: how many of the matched students' answers were left blank (each counted as wrong).
- Hake's normalized gain g = (post% - pre%) / (100% - pre%), on those class averages; None
  when pre% is 100 (nothing left to gain).
- Cohen's d for matched pairs, d_z = mean(post - pre) / SD(post - pre), SD with n - 1. This
  is the paired d (d_z), not the pooled-SD d of two independent groups; None with fewer than
  two matched students or when every student moved by the same amount.
- right-to-wrong rate: of the (student, item) pairs right on the pre-test, the share wrong
  on the post-test.
- per item: pre%, post%, g and right-to-wrong; and, given each student's forms, the item's
  pre% and post% on each form (`forms`: {"A": {"pre", "n_pre", "post", "n_post"}, "B": ...}).
- per form (given `forms`, who took which form in each test): each form's mean score on the
  pre-test, over the matched students who took it then, and on the post-test likewise, with
  those n. Counterbalanced halves are alike, so two forms far apart within one test tell of
  twins that are not parallel (one form harder), not of learning.
- per order: the matched students who took A then B ("AB") and those who took B then A
  ("BA"): n, their pre% and post%, and g on those. A gain in one order only tells of a form
  effect too.
- per misconception, for each test: the share of the matched students' answers that fell into
  it, out of the (student, item) answers whose item, on the form that student took, offers it
  as a choice (a blank answer to such an item counts, as not falling into it). Which form each
  student took decides which items could catch it: a misconception offered only by form B's
  item 1 is counted over the students who took form B, and an item that could catch it where
  nobody picked it still counts. None for a test where no answer could catch it. Listed for
  the misconceptions some matched answer fell into.
Hand counts give pre%, post% and g, and each form's share right (gains_report: no n, no
orders); d and right-to-wrong need matched students and are None.
"""

from __future__ import annotations

import math
from statistics import mean, stdev

REVISIT_G = 0.3  # an idea whose g stays below this (or that lost right answers) is flagged


def hake_g(pre_pct: float, post_pct: float) -> float | None:
    if pre_pct >= 100.0:
        return None
    return (post_pct - pre_pct) / (100.0 - pre_pct)


def cohen_dz(diffs: list[float]) -> float | None:
    """Mean difference over the SD of the differences (n - 1); None if undefined."""
    if len(diffs) < 2:
        return None
    sd = stdev(diffs)
    if sd == 0 or math.isnan(sd):
        return None
    return mean(diffs) / sd


def _pct(xs) -> float:
    xs = list(xs)
    return 100.0 * sum(xs) / len(xs) if xs else 0.0


def class_gains(pre: dict[str, dict[int, bool]], post: dict[str, dict[int, bool]],
                tags: dict | None = None, offers: dict | None = None,
                blanks: set | frozenset = frozenset(), forms: dict | None = None) -> dict:
    """All the measures above from matched students; `tags[(phase, student, item)]` names the
    misconception a wrong answer fell into (None for a right or blank answer) and
    `offers[(phase, student, item)]` the misconceptions that item of the student's form offers
    (the denominator of the per-misconception shares: needed with `tags`); `blanks` holds the
    (phase, student, item) answers left blank; `forms[(phase, student)]` the form ("A" or
    "B") the student took in that test (without it, no per-form or per-order means)."""
    if tags and offers is None:
        raise ValueError("offers: which misconceptions each student's item offers, with tags")
    matched = sorted(set(pre) & set(post))
    unmatched = len(set(pre) ^ set(post))
    items = sorted({i for s in matched for i in pre[s]} | {i for s in matched for i in post[s]})
    if not matched:
        return {"matched": 0, "unmatched": unmatched, "blank": 0, "pre": None, "post": None,
                "g": None, "d": None, "right_to_wrong": None, "items": {}, "misconceptions": {},
                "forms": {}, "orders": {}}
    score = {ph: {s: _pct(tab[s].get(i, False) for i in items) for s in matched}
             for ph, tab in (("pre", pre), ("post", post))}
    pre_pct, post_pct = mean(score["pre"].values()), mean(score["post"].values())
    was_right = [(s, i) for s in matched for i in items if pre[s].get(i, False)]
    r2w = (sum(not post[s].get(i, False) for s, i in was_right) / len(was_right)
           if was_right else None)
    per_item = {}
    for i in items:
        a = _pct(pre[s].get(i, False) for s in matched)
        b = _pct(post[s].get(i, False) for s in matched)
        right = [s for s in matched if pre[s].get(i, False)]
        per_item[i] = {"pre": a, "post": b, "g": hake_g(a, b),
                       "right_to_wrong": (sum(not post[s].get(i, False) for s in right)
                                          / len(right)) if right else None}
        if forms:
            per_item[i]["forms"] = _by_form(
                {ph: {s: tab[s].get(i, False) for s in matched}
                 for ph, tab in (("pre", pre), ("post", post))}, forms, pct=True)
    per_form = _by_form(score, forms) if forms else {}
    per_order = {}
    for order, (first, then) in (("AB", ("A", "B")), ("BA", ("B", "A"))):
        if not forms:
            break
        who = [s for s in matched if forms.get(("pre", s)) == first
               and forms.get(("post", s)) == then]
        a = mean(score["pre"][s] for s in who) if who else None
        b = mean(score["post"][s] for s in who) if who else None
        per_order[order] = {"n": len(who), "pre": a, "post": b,
                            "g": None if a is None else hake_g(a, b)}
    per_mis: dict[str, dict] = {}
    if tags:
        picked = {m for (ph, s, i), m in tags.items() if m and s in matched}
        for m in picked:
            v = {"pre": 0, "post": 0, "n_pre": 0, "n_post": 0, "items": set()}
            for ph in ("pre", "post"):
                for s in matched:
                    for i in items:
                        if m in (offers.get((ph, s, i)) or ()):
                            v["n_" + ph] += 1
                            v["items"].add(i)
                            v[ph] += tags.get((ph, s, i)) == m
            for ph in ("pre", "post"):
                v[ph] = 100.0 * v[ph] / v["n_" + ph] if v["n_" + ph] else None
            v["items"] = sorted(v["items"])
            per_mis[m] = v
    blank = sum(1 for ph, s, _ in blanks if s in pre and s in post)
    return {"matched": len(matched), "unmatched": unmatched, "blank": blank, "pre": pre_pct,
            "post": post_pct, "g": hake_g(pre_pct, post_pct),
            "d": cohen_dz([score["post"][s] - score["pre"][s] for s in matched]),
            "right_to_wrong": r2w, "items": per_item, "misconceptions": per_mis,
            "forms": per_form, "orders": per_order}


def _by_form(values: dict, forms: dict, pct: bool = False) -> dict:
    """{"A": {"pre", "n_pre", "post", "n_post"}, "B": ...}: the mean of `values[phase]`
    ({student: a score, or right?}) over the students who took that form in that test."""
    out = {}
    for f in ("A", "B"):
        v = {}
        for ph in ("pre", "post"):
            xs = [x for s, x in values[ph].items() if forms.get((ph, s)) == f]
            v["n_" + ph] = len(xs)
            v[ph] = None if not xs else (_pct(xs) if pct else mean(xs))
        out[f] = v
    return out


def hand_gains(pre_counts: dict[int, tuple[int, int]],
               post_counts: dict[int, tuple[int, int]]) -> dict:
    """From hand counts: item -> (right, answered), for each test. d and right-to-wrong need
    matched students, so they are None, and so is `blank` (a count has no blank answers)."""
    items = sorted(set(pre_counts) & set(post_counts))

    def pct(counts):  # None with nobody counted: no share, rather than a made-up 0%
        right = sum(counts[i][0] for i in items)
        n = sum(counts[i][1] for i in items)
        return 100.0 * right / n if n else None

    def gain(a, b):
        return None if a is None or b is None else hake_g(a, b)

    per_item = {}
    for i in items:
        a = 100.0 * pre_counts[i][0] / pre_counts[i][1] if pre_counts[i][1] else None
        b = 100.0 * post_counts[i][0] / post_counts[i][1] if post_counts[i][1] else None
        per_item[i] = {"pre": a, "post": b, "g": gain(a, b), "right_to_wrong": None}
    a, b = pct(pre_counts), pct(post_counts)
    return {"matched": 0, "unmatched": 0, "blank": None, "pre": a, "post": b, "g": gain(a, b),
            "d": None, "right_to_wrong": None, "items": per_item, "misconceptions": {},
            "forms": {}, "orders": {}}


def revisit_sentence(result: dict, item_names: dict[int, dict],
                     misconceptions: dict[str, dict]) -> dict:
    """One sentence per language: which ideas to revisit (low g or lost right answers)."""
    weak = [i for i, v in result.get("items", {}).items()
            if (v["g"] is not None and v["g"] < REVISIT_G)
            or (v["right_to_wrong"] or 0) > 0.2]
    stuck = sorted(((m, v) for m, v in result.get("misconceptions", {}).items()
                    if v["pre"] is not None and v["post"] is not None
                    and v["post"] >= v["pre"] and v["post"] > 0), key=lambda mv: -mv[1]["post"])
    if result.get("g") is None and not weak:
        return {"zh": "还没有可比较的前测和后测。", "en": "No matched pre- and post-test yet."}
    if not weak and not stuck:
        return {"zh": "每个概念都有进步：下节课可以往前走。",
                "en": "Every idea moved: the next class can move on."}
    out = {}
    for lang, sep, head, mhead in (("zh", "、", "建议再讲：", "；仍常见的误解："),
                                   ("en", ", ", "Revisit: ", "; misconceptions still common: ")):
        parts = sep.join(item_names[i][lang] for i in weak if i in item_names)
        ms = sep.join(misconceptions[m][lang] for m, _ in stuck[:3] if m in misconceptions)
        text = head + (parts or "-")
        if ms:
            text += mhead + ms
        out[lang] = text + ("。" if lang == "zh" else ".")
    return out


MATCHED = {"zh": "匹配的学生 {n} 人；未计入 {m} 人（只做了前测或后测中的一次）；"
                 "留空未答 {k} 处（按答错计）",
           "en": "Matched students: {n}; left out: {m} (took only one test); "
                 "blank answers: {k} (counted as wrong)"}


def matched_line(result: dict, lang: str) -> str:
    """Who the gains are computed on: matched, left out, blanks (zh or en); hand counts say so."""
    if result.get("blank") is None:
        return "（来自手动计数）" if lang == "zh" else "(from hand counts)"
    return MATCHED[lang].format(n=result["matched"], m=result["unmatched"],
                                k=result.get("blank", 0))


FORM_WORDS = {
    "zh": {"forms": "按试卷", "orders": "按顺序", "form": "试卷", "order": "顺序", "n": "人数",
           "A": "A 卷", "B": "B 卷", "AB": "先 A 卷后 B 卷", "BA": "先 B 卷后 A 卷",
           "note": "两半学生是随机分的：同一次测验里 A 卷和 B 卷的平均分差得多，说明这对孪生题"
                   "难度不一样，不是学到了什么；只在一种顺序里有进步也是同样的信号。"},
    "en": {"forms": "Per form", "orders": "Per order", "form": "Form", "order": "Order",
           "n": "n", "A": "Form A", "B": "Form B", "AB": "A then B", "BA": "B then A",
           "note": "The two halves are split at random: forms far apart within one test tell "
                   "of twins that are not equally hard, not of learning; so does a gain in "
                   "one order only."},
}


def form_tables(result: dict, lang: str) -> list[list[list[str]]]:
    """The per-form and per-order tables as rows of cells (a header row first), each form's
    pre- and post-test mean with its n, each order's n, pre, post and g; [] without them."""
    w = FORM_WORDS[lang]
    pre, post = ("前测", "后测") if lang == "zh" else ("Pre", "Post")

    def f(x, pct=False):
        return "-" if x is None else (f"{x:.0f}%" if pct else f"{x:.2f}")

    def n(x):  # hand counts have no students to count
        return "-" if x is None else str(x)

    out = []
    if result.get("forms"):
        rows = [[w["form"], pre, w["n"], post, w["n"]]]
        for k, v in result["forms"].items():
            rows.append([w[k], f(v["pre"], True), n(v["n_pre"]), f(v["post"], True),
                         n(v["n_post"])])
        out.append(rows)
    if result.get("orders"):
        rows = [[w["order"], w["n"], pre, post, "g"]]
        for k, v in result["orders"].items():
            rows.append([w[k], str(v["n"]), f(v["pre"], True), f(v["post"], True), f(v["g"])])
        out.append(rows)
    return out


def item_by_form(v: dict, lang: str) -> str:
    """An item's pre/post on each form, "A 40%/80% · B 50%/70%", or "-" without forms."""
    if not v.get("forms"):
        return "-"

    def f(x):
        return "-" if x is None else f"{x:.0f}%"

    return " · ".join(f"{k} {f(x['pre'])}/{f(x['post'])}" for k, x in v["forms"].items())


def summary_markdown(result: dict, sentence: dict, item_names: dict[int, dict],
                     misconceptions: dict[str, dict], lang: str) -> str:
    """The one-page summary (markdown) the teacher exports."""
    zh = lang == "zh"

    def f(x, pct=False):
        return "-" if x is None else (f"{x:.0f}%" if pct else f"{x:.2f}")

    lines = ["# " + ("课堂学习收获" if zh else "What the class gained"), "",
             matched_line(result, lang), "",
             "| " + " | ".join(["前测" if zh else "Pre", "后测" if zh else "Post",
                                "g (Hake)", "d_z", "对→错" if zh else "right→wrong"]) + " |",
             "|---|---|---|---|---|",
             f"| {f(result['pre'], True)} | {f(result['post'], True)} | {f(result['g'])} | "
             f"{f(result['d'])} | {f(None if result['right_to_wrong'] is None else 100 * result['right_to_wrong'], True)} |",
             "", "## " + ("每道题" if zh else "Per item"), "",
             "| " + " | ".join(["题" if zh else "Item", "前测" if zh else "Pre",
                                "后测" if zh else "Post", "g", "对→错" if zh else "right→wrong",
                                "各卷 前/后" if zh else "Each form pre/post"]) + " |",
             "|---|---|---|---|---|---|"]
    for i, v in result["items"].items():
        name = item_names.get(i, {}).get(lang, str(i))
        rw = None if v["right_to_wrong"] is None else 100 * v["right_to_wrong"]
        lines.append(f"| {name} | {f(v['pre'], True)} | {f(v['post'], True)} | {f(v['g'])} "
                     f"| {f(rw, True)} | {item_by_form(v, lang)} |")
    for title, rows in zip((FORM_WORDS[lang]["forms"], FORM_WORDS[lang]["orders"]),
                           form_tables(result, lang)):
        lines += ["", "## " + title, "", "| " + " | ".join(rows[0]) + " |",
                  "|" + "---|" * len(rows[0])]
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    if result.get("forms"):
        lines += ["", FORM_WORDS[lang]["note"]]
    if result["misconceptions"]:
        lines += ["", "## " + ("误解" if zh else "Misconceptions"), "",
                  "| " + " | ".join(["误解" if zh else "Misconception", "前测" if zh else "Pre",
                                     "后测" if zh else "Post"]) + " |", "|---|---|---|"]
        for m, v in sorted(result["misconceptions"].items()):
            lines.append(f"| {misconceptions.get(m, {}).get(lang, m)} | {f(v['pre'], True)} | "
                         f"{f(v['post'], True)} |")
    lines += ["", sentence[lang], "",
              ("d_z：配对学生的平均差除以差值的标准差。" if zh else
               "d_z: matched students' mean difference over the SD of the differences.")]
    return "\n".join(lines) + "\n"
