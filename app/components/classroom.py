"""The class's shared engine drawn with the other pages' components: request ids become the
students' nicknames, simulated users one grey rider "sim", so the projector shows who sits
where and whose blocks are whose. Pure functions of step-stream dicts (a StepReport dict plus
its `owners` map: request id -> {"user", "kind"}).

Nicknames and questions come from students: untrusted. Every one goes into HTML through
`html.escape` here or in the components that draw the relabelled report (seats, KV map).
"""

from __future__ import annotations

import copy
import html

from app.components.palette import request_color, text_color

SIM = "sim"  # every simulated rider's label: one grey (palette colour 9 by its hash)
MAX_WAITING_NAMES = 24


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


def _chip(label: str, kind: str) -> str:
    bg = "#7f7f7f" if kind == "simulated" else request_color(label)
    mark = "🤖 " if kind == "simulated" else ""
    return (f'<span class="sl-chip" style="background:{bg};color:{text_color(bg)}">'
            f"{mark}{html.escape(label)}</span>")


CSS = """
<style>
.sl-door{display:flex;flex-wrap:wrap;align-items:center;gap:6px;margin-top:10px;font-size:17px;}
.sl-door .sl-chip{display:inline-block;padding:2px 8px;border-radius:6px;font-weight:700;}
.sl-qs,.sl-students{font-size:18px;line-height:1.4;margin:0;padding-left:0;list-style:none;}
.sl-qs li,.sl-students li{margin:4px 0;padding:4px 8px;background:#fff;border-left:6px solid #2e9e4f;
 border-radius:4px;}
.sl-qs b{margin-right:8px;}
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
    parts = [f"<b>At the door: {len(report['waiting'])}</b>"]
    parts += [_chip(p, "person") for p in people[:MAX_WAITING_NAMES]]
    if len(people) > MAX_WAITING_NAMES:
        parts.append(html.escape(f"+{len(people) - MAX_WAITING_NAMES} students"))
    if sims:
        parts.append(_chip(f"{sims} simulated", "simulated"))
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
                                        "blocks": 0, "tokens": 0, "state": "waiting"})
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
        items.append(f"<li>{_chip(r['nickname'], 'person')} seat {seat}, {r['blocks']} "
                     f"blocks, {r['tokens']} tokens · {html.escape(r['state'])}</li>")
    return f'{CSS}<ul class="sl-students">{"".join(items)}</ul>'
