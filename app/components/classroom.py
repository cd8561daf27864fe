"""The class's shared engine drawn with the other pages' components: request ids become the
students' nicknames, simulated users one grey rider "sim", so the projector shows who sits
where and whose blocks are whose. Pure functions of step-stream dicts (a StepReport dict plus
its `owners` map: request id -> {"user", "kind"}).

Nicknames and questions come from students: untrusted. Every one goes into HTML through
`html.escape` here or in the components that draw the relabelled report (seats, KV map).

Width rules for the projector: a nickname is shortened to a display width (a CJK or other
wide character counts two, so 小明 is as wide as "abcd"), ending in "…", and its full text
goes into the tooltip; nothing is cut by the box it sits in.
"""

from __future__ import annotations

import copy
import html
import unicodedata

from app.components.kvmap import _fill, _hatch
from app.components.palette import request_color, text_color
from app.i18n import t

SIM = "sim"  # every simulated rider's label: one grey (palette colour 9 by its hash)
MAX_WAITING_NAMES = 24
SEAT_WIDTH = 6  # display columns a seat card's name may take (its 20 px bold type, 104 px card)
CHIP_WIDTH = 16  # at the door and in the students' list
HOLD_S = 4.0  # a seat a student just left stays on the projector this long, "answered"


def display_width(text: str) -> int:
    """Columns `text` takes: two for a wide (CJK, fullwidth) character, one otherwise."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def fit(text: str, width: int) -> str:
    """`text` shortened to `width` display columns, ending in "…" when cut."""
    if display_width(text) <= width:
        return text
    out, used = [], 0
    for c in text:
        w = 2 if unicodedata.east_asian_width(c) in "WF" else 1
        if used + w > width - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "…"


def fitted(labels: dict[str, str], width: int = SEAT_WIDTH) -> tuple[dict, dict]:
    """(request id -> shortened label, shortened label -> full label): two riders whose
    names shorten alike keep apart by a "·n"."""
    short, full, seen = {}, {}, {}
    for rid, name in labels.items():
        s = fit(name, width)
        if s in full and full[s] != name:
            seen[s] = seen.get(s, 1) + 1
            s = fit(name, width - 2) + f"·{seen[s]}"
        short[rid], full[s] = s, name
    return short, full


def _shown(name: str, masking: dict) -> str:
    """`name` as the class's hide list and word list allow (classroom.votes.mask_name): a
    hidden one reads "(hidden)", a masked one stars."""
    from classroom.votes import mask_name

    shown = mask_name(name, set(masking.get("hidden") or ()), masking.get("words") or ())
    return t("cls.hidden_name") if shown is None else shown


def mask_owners(owners: dict, masking: dict | None) -> dict:
    """Who asked each request, each student's nickname `_shown`. Every projected view (seats,
    KV blocks, the door, the students list) reads names from here, so one click hides a
    student everywhere."""
    if not masking or not (masking.get("hidden") or masking.get("words")):
        return owners
    return {rid: who if who.get("kind") == "simulated" or not who.get("user")
            else {**who, "user": _shown(who["user"], masking)}
            for rid, who in owners.items()}


def mask_questions(pairs: list[tuple[str, str]], masking: dict | None) -> list[tuple[str, str]]:
    """The questions list's (nickname, question) pairs, each nickname `_shown`."""
    if not masking:
        return pairs
    return [(_shown(nick, masking), q) for nick, q in pairs]


def display_labels(report: dict, owners: dict) -> dict[str, str]:
    """Request id -> the label the projector shows: the student's nickname (with "·2", "·3"
    when two requests share one in this report), "sim" for simulated users, else the id."""
    labels: dict[str, str] = {}
    used: dict[str, int] = {}
    for rid in _ids_in(report):
        if rid in labels:
            continue
        who = owners.get(rid) or report.get("owners", {}).get(rid)
        if who is None:
            labels[rid] = rid
        elif who.get("kind") == "simulated":
            labels[rid] = SIM
        else:
            name = who.get("user") or rid
            n = used.get(name, 0) + 1
            used[name] = n
            labels[rid] = name if n == 1 else f"{name}·{n}"
    return labels


def _ids_in(report: dict):
    for s in report["seats"]:
        if s["request_id"]:
            yield s["request_id"]
    yield from report["waiting"]
    yield from report["kv"]["block_tables"]
    for key in ("admitted", "finished", "preempted", "aborted"):
        yield from report.get(key, [])
    for e in report["emitted"]:
        yield e["request_id"]
    for rec in report.get("spec", []):
        yield rec["request_id"]


def relabel(report: dict, labels: dict[str, str]) -> dict:
    """A copy of the report with every request id replaced by its label."""
    r = copy.deepcopy({k: v for k, v in report.items() if k != "owners"})

    def lab(rid):
        return labels.get(rid, rid) if rid is not None else None

    for s in r["seats"]:
        s["request_id"] = lab(s["request_id"])
    r["waiting"] = [lab(x) for x in r["waiting"]]
    for key in ("admitted", "finished", "preempted", "aborted"):
        if key in r:
            r[key] = [lab(x) for x in r[key]]
    for e in r["emitted"]:
        e["request_id"] = lab(e["request_id"])
    for rec in r.get("spec", []):
        rec["request_id"] = lab(rec["request_id"])
    kv = r["kv"]
    for b in kv["blocks"]:
        b["owners"] = [lab(o) for o in b["owners"]]
    kv["block_tables"] = {lab(k): v for k, v in kv["block_tables"].items()}
    return r


def _chip(label: str, kind: str, width: int = CHIP_WIDTH) -> str:
    bg = "#7f7f7f" if kind == "simulated" else request_color(label)
    mark = "🤖 " if kind == "simulated" else ""
    return (f'<span class="sl-chip" style="background:{bg};color:{text_color(bg)}" '
            f'title="{html.escape(label, quote=True)}">{mark}{html.escape(fit(label, width))}'
            f"</span>")


CSS = """
<style>
.sl-door{display:flex;flex-wrap:wrap;align-items:center;gap:6px;margin-top:10px;font-size:17px;}
.sl-door .sl-chip{display:inline-block;padding:2px 8px;border-radius:6px;font-weight:700;}
.sl-qs,.sl-students{font-size:18px;line-height:1.4;margin:0;padding-left:0;list-style:none;}
.sl-qs li,.sl-students li{margin:4px 0;padding:4px 8px;background:#fff;border-left:6px solid #2e9e4f;
 border-radius:4px;}
.sl-qs b{margin-right:8px;}
.sl-seat .sl-rid{max-width:100%;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;
 vertical-align:bottom;box-sizing:border-box;}
.sl-seat.answered{background:#fff6d8;border-color:#c99a06;}
.sl-ckv{display:grid;gap:3px;}
.sl-ckv div{height:30px;border:1px solid #777;border-radius:4px;position:relative;font-size:12px;
 box-sizing:border-box;overflow:hidden;white-space:nowrap;line-height:28px;padding:0 2px;
 text-overflow:clip;}
.sl-ckv div.free{background:#fff;border:1px dashed #bbb;}
.sl-ckv div.shared{border:3px solid #000;}
.sl-ckv div span{text-shadow:0 0 2px #fff;font-weight:700;}
.sl-kvsize{font-size:16px;margin:4px 0;}
</style>
"""


def door_html(report: dict, owners: dict, labels: dict[str, str]) -> str:
    """The queue at the door: waiting students by name, simulated users as a count."""
    people, sims = [], 0
    for rid in report["waiting"]:
        who = owners.get(rid) or report.get("owners", {}).get(rid) or {}
        if who.get("kind") == "simulated":
            sims += 1
        else:
            people.append(labels.get(rid, rid))
    parts = [f"<b>{html.escape(t('cls.door', n=len(report['waiting'])))}</b>"]
    parts += [_chip(p, "person") for p in people[:MAX_WAITING_NAMES]]
    if len(people) > MAX_WAITING_NAMES:
        parts.append(html.escape(t("cls.door.more", n=len(people) - MAX_WAITING_NAMES)))
    if sims:
        parts.append(_chip(t("cls.door.sims", n=sims), "simulated"))
    return f'{CSS}<div class="sl-door">{"".join(parts)}</div>'


def riders(report: dict, owners: dict) -> dict[str, int]:
    """How many seats students and simulated users hold now."""
    out = {"person": 0, "simulated": 0}
    for s in report["seats"]:
        rid = s["request_id"]
        if rid:
            who = owners.get(rid) or report.get("owners", {}).get(rid) or {}
            out["simulated" if who.get("kind") == "simulated" else "person"] += 1
    return out


def questions_html(questions: list[tuple[str, str]]) -> str:
    """(nickname, question) pairs, newest first, escaped: the projector is public."""
    items = "".join(f"<li><b>{html.escape(n)}</b>{html.escape(q)}</li>" for n, q in questions)
    return f'{CSS}<ul class="sl-qs">{items}</ul>'


def student_rows(history: list[dict], owners: dict, limit: int = 12) -> list[dict]:
    """The latest students' requests from the (slim) history, newest first: seat, most KV
    blocks held, tokens so far, state. A short answer can come and go between two redraws of
    the projector; this list keeps it on screen."""
    rows: dict[str, dict] = {}
    for rep in history:
        seated = {s["request_id"]: s["index"] for s in rep["seats"] if s["request_id"]}
        held = rep["kv"].get("blocks_held", {})
        for rid in [*rep["waiting"], *seated]:
            who = owners.get(rid)
            if who is None or who.get("kind") == "simulated":
                continue
            row = rows.setdefault(rid, {"nickname": who.get("user", rid), "seat": None,
                                        "blocks": 0, "tokens": 0, "state": "waiting",
                                        "request_id": rid})
            if rid in seated:
                row["seat"], row["state"] = seated[rid], "seated"
                row["blocks"] = max(row["blocks"], held.get(rid, 0))
        for e in rep["emitted"]:
            if e["request_id"] in rows:
                rows[e["request_id"]]["tokens"] += len(e["token_ids"])
        for rid in rep["finished"]:
            if rid in rows:
                rows[rid]["state"] = "answered"
    return list(rows.values())[::-1][:limit]


def students_html(rows: list[dict]) -> str:
    """The latest students: nickname chip, seat, blocks, tokens, state (all escaped)."""
    if not rows:
        return ""
    items = []
    for r in rows:
        seat = "-" if r["seat"] is None else r["seat"]
        line = t("cls.student.row", seat=seat, blocks=r["blocks"], tokens=r["tokens"],
                 state=t(f"cls.state.{r['state']}"))
        items.append(f"<li>{_chip(r['nickname'], 'person')} {html.escape(line)}</li>")
    return f'{CSS}<ul class="sl-students">{"".join(items)}</ul>'


def held_seats(report: dict, history: list[dict], owners: dict, now: float,
               hold_s: float = HOLD_S) -> dict:
    """A copy of the report whose empty seats show the student who left them within `hold_s`
    seconds (state "answered", their last token count): an answer of one second stays on
    the projector for a few. From the history's every step (each carries its arrival `t`)."""
    r = copy.deepcopy({k: v for k, v in report.items() if k != "owners"})
    finished = {rid for rep in history for rid in rep.get("finished", [])}
    for seat in r["seats"]:
        if seat["request_id"] is not None:
            continue
        for rep in reversed(history):
            if now - rep.get("t", now) > hold_s:
                break
            held = rep["seats"][seat["index"]] if seat["index"] < len(rep["seats"]) else None
            rid = held and held["request_id"]
            if not rid:
                continue
            who = owners.get(rid) or {}
            if who.get("kind") == "person" and rid in finished:
                seat.update(request_id=rid, state="answered",
                            num_output_tokens=held["num_output_tokens"])
            break
    return r


def class_kv_html(kv: dict, names: dict[str, str], columns: int = 24) -> str:
    """The class's KV pool: each block shows its owner's shortened nickname, the tooltip the
    block number, the full nickname and its fill. `kv` is the relabelled report's (owners
    are labels); `names` maps a label to its full text."""
    bs = kv["block_size"]
    listed = {b["block"]: b for b in kv["blocks"]}
    cells = []
    for i in range(min(kv["num_blocks"], 4096)):
        b = listed.get(i) or {"block": i, "state": "free", "owners": [], "tokens": 0}
        owners = b["owners"]
        style, label = "", ""
        if owners:
            color = request_color(owners[0])
            style = _hatch(color) if b["state"] == "reserved" else _fill(color, b["tokens"] / bs)
            label = fit(owners[0], 4)
        full = ", ".join(names.get(o, o) for o in owners) or "-"
        title = t("cls.kv.block", n=i, who=full, tokens=b["tokens"], size=bs)
        cls = "shared" if len(owners) > 1 else ("free" if not owners else "")
        cells.append(f'<div class="{cls}" style="{style}" title="{html.escape(title, quote=True)}">'
                     f"<span>{html.escape(label)}</span></div>")
    used = sum(1 for b in kv["blocks"] if b["owners"])
    size = t("cls.kv.size", used=used, total=kv["num_blocks"], bs=bs,
             pct=round(100 * used / max(1, kv["num_blocks"])))
    return (f'{CSS}<div class="sl-kvsize">{html.escape(size)}</div><div class="sl-ckv" '
            f'style="grid-template-columns:repeat({columns},minmax(0,1fr))">{"".join(cells)}'
            f"</div>")


LARGE_CSS = """
<style>
.sl-seat{width:150px !important;min-height:136px !important;font-size:22px !important;}
.sl-seat .sl-rid{font-size:27px !important;}
.sl-seat .sl-n,.sl-seat .sl-st{font-size:18px !important;}
.sl-door,.sl-students,.sl-qs,.sl-kvsize{font-size:24px !important;}
.sl-ckv div{height:40px !important;font-size:16px !important;line-height:38px !important;}
[data-testid="stMetricValue"]{font-size:44px !important;}
[data-testid="stMetricLabel"] p{font-size:20px !important;}
[data-testid="stMarkdownContainer"] p{font-size:22px;}
</style>
"""


TL_COLORS = {"queued": "#e0a030", "prefill": "#3a7bd5", "decode": "#2e9e4f",
             "preempted": "#c0392b"}  # as on the phones (classroom/static/student.html)
TL_CSS = """
<style>
.sl-tl{font-size:15px;max-width:560px;}
.sl-tl h4{margin:0 0 4px;font-size:17px;}
.sl-tl .sl-tl-row{display:grid;grid-template-columns:88px 1fr;gap:2px 8px;align-items:center;
 margin:3px 0;}
.sl-tl .sl-tl-track{position:relative;height:12px;background:#eef1f4;border-radius:3px;}
.sl-tl .sl-tl-bar{position:absolute;top:0;bottom:0;border-radius:3px;}
.sl-tl .sl-tl-why{grid-column:2;font-size:13px;color:#444;}
.sl-tl .sl-tl-scale{grid-column:2;display:flex;justify-content:space-between;font-size:12px;
 color:#555;}
</style>
"""


def _ms(x: float) -> str:
    return t("tl.s", x=f"{x / 1000:g}") if x >= 1000 else t("tl.ms", x=f"{x:g}")


def timeline_scale(ms: float) -> float:
    """The axis's end: the first of 1, 2, 5 x 10^k ms at or above `ms` (as the phones draw)."""
    m = 100.0
    while True:
        for f in (1, 2, 5):
            if f * m >= ms or f * m >= 1e7:
                return f * m
        m *= 10


def timeline_html(stretches: list[dict], name: str) -> str:
    """One student's request, stretch by stretch (engine/waits.py Timeline, from the class
    server): a bar per stretch on one ms axis, its steps and ms, and the reasons it waited in
    the app's language. `name` is the label the projector shows (already masked); escaped."""
    title = html.escape(t("tl.title", name=name))
    if not stretches:
        return f'{TL_CSS}<div class="sl-tl"><h4>{title}</h4>{html.escape(t("tl.none"))}</div>'
    end = timeline_scale(stretches[-1]["end_ms"])
    rows = ['<div class="sl-tl-row"><span></span><div class="sl-tl-scale">'
            + "".join(f"<span>{html.escape(_ms(x))}</span>" for x in (0, end / 2, end))
            + "</div></div>"]
    for st in stretches:
        left = 100 * st["start_ms"] / end
        width = max(0.6, 100 * (st["end_ms"] - st["start_ms"]) / end)
        color = TL_COLORS.get(st["phase"], "#888")
        why = [t("tl.step" if st["from_step"] == st["to_step"] else "tl.steps",
                 a=st["from_step"], b=st["to_step"], n=st["steps"],
                 t0=round(st["start_ms"]), t1=round(st["end_ms"]))]
        for r in st["reasons"]:
            if r["code"] == "preempted":
                why.append(t("tl.redo", n=r["fields"].get("redo_tokens", "?")))
            else:
                why.append(f"{t('wait.' + r['code'])} × {r['steps']}")
        rows.append(
            f'<div class="sl-tl-row" data-phase="{html.escape(st["phase"], quote=True)}">'
            f"<b>{html.escape(t('tl.' + st['phase']))}</b>"
            f'<div class="sl-tl-track"><div class="sl-tl-bar" style="left:{left:.2f}%;'
            f'width:{width:.2f}%;background:{color}"></div></div>'
            f'<div class="sl-tl-why">{html.escape(" · ".join(why))}</div></div>')
    return f'{TL_CSS}<div class="sl-tl"><h4>{title}</h4>{"".join(rows)}</div>'
