"""The projector's view of a class vote, as HTML strings (no streamlit, so tests time them).

`count_html(state, lang)`: the open round: question, time left, how many have voted (never
how). `reveal_html(state, lang)`: from lock on: the histogram of each round side by side
(the first vote's only after the revote, so it cannot pull the second toward the majority),
the suggested next move, and at the reveal the right choice, the shift of the phones that
voted twice and the reason for every choice. `gains_html(report, lang)`: the class's gain,
and who it is computed on (matched students, those left out for taking one test only, blank
answers).
Every string from the server or a student is escaped; every label exists in zh and en.
"""

from __future__ import annotations

import html

from classroom.gains import FORM_WORDS, form_tables, item_by_form, matched_line

STRINGS = {
    "voted": {"zh": "已投票：{n} / {phones} 部手机", "en": "Voted: {n} of {phones} phones"},
    "hand_voted": {"zh": "手动计数：{n} 人", "en": "Counted by hand: {n}"},
    "left": {"zh": "剩余 {s} 秒", "en": "{s} s left"},
    "locked": {"zh": "已锁定", "en": "Locked"},
    "revealed": {"zh": "已揭晓", "en": "Revealed"},
    "hidden": {"zh": "（题目已从投影上隐藏）", "en": "(question hidden from the projector)"},
    "round1": {"zh": "第一次投票", "en": "First vote"},
    "round2": {"zh": "讨论后再投", "en": "After discussion"},
    "right": {"zh": "正确", "en": "right"},
    "share": {"zh": "答对 {p}%", "en": "{p}% right"},
    "next": {"zh": "建议下一步：", "en": "Suggested next move: "},
    "shift": {"zh": "两次都投了的 {m} 人中：错→对 {w2r}，对→错 {r2w}，一直对 {sr}，一直错 {sw}。",
              "en": "Of the {m} who voted twice: wrong→right {w2r}, right→wrong {r2w}, "
                    "stayed right {sr}, stayed wrong {sw}."},
    "why": {"zh": "每个选项为什么", "en": "Why each choice"},
    "measured": {"zh": "引擎测得：{v}", "en": "The engine measured: {v}"},
    "pre": {"zh": "前测", "en": "Pre-test"},
    "post": {"zh": "后测", "en": "Post-test"},
    "g": {"zh": "归一化增益 g", "en": "normalized gain g"},
    "d": {"zh": "配对效应量 d_z", "en": "paired effect size d_z"},
    "r2w": {"zh": "对→错比例", "en": "right→wrong rate"},
    "hand_source": {"zh": "（来自手动计数：d 和对→错需要匹配的手机）",
                    "en": "(from hand counts: d and right→wrong need matched phones)"},
    "item": {"zh": "概念", "en": "Idea"},
    "mis": {"zh": "误解", "en": "Misconception"},
    "by_form": {"zh": "各卷 前/后", "en": "Each form pre/post"},
}


def vt(key: str, lang: str, **fmt) -> str:
    text = STRINGS[key].get(lang) or STRINGS[key]["en"]
    return text.format(**fmt) if fmt else text


CSS = """<style>
.vt-q{font-size:26px;font-weight:600;margin:4px 0 10px}
.vt-big{font-size:40px;font-weight:700;color:#2e6fbd}
.vt-row{display:flex;gap:28px;flex-wrap:wrap}
.vt-h{flex:1;min-width:320px}
.vt-bar{display:flex;align-items:center;gap:8px;margin:5px 0;font-size:18px}
.vt-bar .l{width:44%;overflow-wrap:anywhere}
.vt-bar .b{height:24px;background:#8aa9cf;border-radius:4px}
.vt-bar.ok .b{background:#2e9e4f}
.vt-bar .n{min-width:2.5em}
.vt-note{font-size:18px;margin-top:8px}
.vt-tab{border-collapse:collapse;font-size:17px}
.vt-tab td,.vt-tab th{border:1px solid #ccc;padding:4px 10px;text-align:left}
</style>"""


def count_html(state: dict, lang: str) -> str:
    """While a round is open: the question, time left and how many voted (not how)."""
    r = state.get("round")
    if not r:
        return ""
    q = vt("hidden", lang) if r.get("hidden") else (r.get("question") or "")
    if r["state"] == "open":
        timer = vt("left", lang, s=int(r["seconds_left"] + 0.999))
    else:
        timer = vt("revealed" if r["state"] == "revealed" else "locked", lang)
    n = (vt("hand_voted", lang, n=r["voted"]) if r.get("hand") else
         vt("voted", lang, n=r["voted"], phones=state.get("phones", 0)))
    choices = "".join(f"<div class='vt-note'>{chr(65 + i)}. {html.escape(c)}</div>"
                      for i, c in enumerate(r.get("choices", []))) if not r.get("hidden") else ""
    return (f"{CSS}<div class='vt-q'>{html.escape(q)}</div>{choices}"
            f"<div class='vt-row'><div class='vt-big' data-voted='{int(r['voted'])}'>"
            f"{html.escape(n)}</div><div class='vt-big'>{html.escape(timer)}</div></div>")


def shares(counts: list[int]) -> list[int]:
    """Whole percentages that add up to 100 (largest remainder: floored shares alone may
    add up to 99); all zeros when nobody voted."""
    total = sum(counts)
    if not total:
        return [0] * len(counts)
    exact = [100 * n / total for n in counts]
    out = [int(x) for x in exact]
    order = sorted(range(len(counts)), key=lambda i: exact[i] - out[i], reverse=True)
    for i in order[:100 - sum(out)]:
        out[i] += 1
    return out


def histogram_html(counts: list[int], labels: list[str], correct: int | None,
                   title: str, lang: str) -> str:
    top = max(1, max(counts) if counts else 1)
    rows = []
    pct = shares(counts)
    for i, (n, label) in enumerate(zip(counts, labels)):
        ok = correct is not None and i == correct
        width = int(240 * n / top)
        mark = f" ✓ {vt('right', lang)}" if ok else ""
        rows.append(f"<div class='vt-bar{' ok' if ok else ''}'><span class='l'>{chr(65 + i)}. "
                    f"{html.escape(label)}{mark}</span><span class='b' style='width:{width}px'>"
                    f"</span><span class='n'>{n} ({pct[i]}%)</span></div>")
    return f"<div class='vt-h'><b>{html.escape(title)}</b>{''.join(rows)}</div>"


def reveal_html(state: dict, lang: str) -> str:
    """What the projector shows of the votes after the lock: at the lock only the suggested
    next move (no bar, no share: a class that sees the majority or the share right before it
    discusses drifts toward it); at the reveal both rounds' histograms side by side with the
    right choice marked, the shift, and why each choice."""
    r = state.get("round")
    if not r or r["state"] == "open":
        return ""
    if r["state"] == "locked":
        return (f"{CSS}<div class='vt-note'><b>{vt('next', lang)}</b>"
                f"{html.escape(r.get('suggestion_text') or '')}</div>")
    correct, labels = r.get("correct"), r["choices"]
    parts = []
    if r.get("previous_counts") is not None:
        parts.append(histogram_html(r["previous_counts"], labels, correct, vt("round1", lang),
                                    lang))
        parts.append(histogram_html(r["counts"], labels, correct, vt("round2", lang), lang))
    else:
        parts.append(histogram_html(r["counts"], labels, correct, vt("round1", lang), lang))
    out = [CSS, "<div class='vt-row'>", *parts, "</div>"]
    if r["state"] == "revealed":
        if r.get("measured"):
            out.append(f"<div class='vt-q'>{html.escape(vt('measured', lang, v=r['measured']))}"
                       "</div>")
        s = r.get("shift")
        if s:
            out.append("<div class='vt-note'>" + html.escape(vt(
                "shift", lang, m=s["matched"], w2r=s["wrong_to_right"],
                r2w=s["right_to_wrong"], sr=s["stayed_right"], sw=s["stayed_wrong"]))
                + "</div>")
        whys = [(i, w) for i, w in enumerate(r.get("why") or []) if w]
        if whys or r.get("explanation"):
            out.append(f"<div class='vt-note'><b>{vt('why', lang)}</b></div>")
            if r.get("explanation"):
                out.append(f"<div class='vt-note'>✓ {html.escape(r['explanation'])}</div>")
            out += [f"<div class='vt-note'>{chr(65 + i)}. {html.escape(w)}</div>" for i, w in whys]
    return "".join(out)


def _f(x, pct=False) -> str:
    if x is None:
        return "–"
    return f"{x:.0f}%" if pct else f"{x:.2f}"


def gains_html(report: dict, lang: str) -> str:
    """The class's gain: the four headline numbers, per idea (and per form), each form's and
    each order's means, per misconception, the sentence."""
    res = report["result"]
    r2w = None if res["right_to_wrong"] is None else 100 * res["right_to_wrong"]
    head = (f"<table class='vt-tab'><tr><th>{vt('pre', lang)}</th><th>{vt('post', lang)}</th>"
            f"<th>{vt('g', lang)}</th><th>{vt('d', lang)}</th><th>{vt('r2w', lang)}</th></tr>"
            f"<tr><td>{_f(res['pre'], True)}</td><td>{_f(res['post'], True)}</td>"
            f"<td>{_f(res['g'])}</td><td>{_f(res['d'])}</td><td>{_f(r2w, True)}</td></tr></table>")
    names = report.get("item_names", {})
    items = "".join(
        f"<tr><td>{html.escape(names.get(k, k))}</td><td>{_f(v['pre'], True)}</td>"
        f"<td>{_f(v['post'], True)}</td><td>{_f(v['g'])}</td><td>"
        f"{_f(None if v['right_to_wrong'] is None else 100 * v['right_to_wrong'], True)}</td>"
        f"<td>{html.escape(item_by_form(v, lang))}</td></tr>"
        for k, v in res["items"].items())
    # each form's and each order's means: a twin that is not parallel shows here
    forms = "".join(
        "<table class='vt-tab' style='margin-top:10px'>"
        + "".join("<tr>" + "".join(f"<{t}>{html.escape(c)}</{t}>" for c in row) + "</tr>"
                  for t, row in (("th" if j == 0 else "td", row) for j, row in enumerate(rows)))
        + "</table>" for rows in form_tables(res, lang))
    if forms:
        forms += f"<div class='vt-note'>{html.escape(FORM_WORDS[lang]['note'])}</div>"
    mnames = report.get("misconception_names", {})
    mis = "".join(f"<tr><td>{html.escape(mnames.get(m, m))}</td><td>{_f(v['pre'], True)}</td>"
                  f"<td>{_f(v['post'], True)}</td></tr>"
                  for m, v in sorted(res["misconceptions"].items()))
    # who the numbers are computed on: matched, left out (one test only), blanks (wrong)
    source = (vt("hand_source", lang) if report.get("source") == "hand" else
              matched_line(res, lang))
    return (f"{CSS}<div class='vt-note'>{html.escape(source)}</div>{head}"
            f"<table class='vt-tab' style='margin-top:10px'><tr><th>{vt('item', lang)}</th>"
            f"<th>{vt('pre', lang)}</th><th>{vt('post', lang)}</th><th>g</th>"
            f"<th>{vt('r2w', lang)}</th><th>{vt('by_form', lang)}</th></tr>{items}</table>"
            + forms
            + (f"<table class='vt-tab' style='margin-top:10px'><tr><th>{vt('mis', lang)}</th>"
               f"<th>{vt('pre', lang)}</th><th>{vt('post', lang)}</th></tr>{mis}</table>"
               if mis else "")
            + f"<div class='vt-note'><b>{html.escape(report['sentence'][lang])}</b></div>")
