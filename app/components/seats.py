"""Leak 1 drawn: the batch as a subway car (seats and riders), the queue at its door, and the
seat x step timeline where idle seats show as waste. Pure functions of StepReport dicts.

Every request id and engine message placed in HTML goes through `html.escape`.
"""

from __future__ import annotations

import html

import altair as alt
import pandas as pd

from app.components.palette import STATE_COLORS, request_color, text_color
from app.i18n import t

SEAT_STATES = ("running", "prefill", "idle-finished", "empty")
MAX_QUEUE_CHIPS = 16

CSS = """
<style>
.sl-car{display:flex;flex-wrap:wrap;gap:8px;padding:10px;border:3px solid #555;
 border-radius:18px;background:#f4f6f8;}
.sl-seat{width:104px;min-height:100px;border-radius:10px;border:2px solid #999;padding:6px 8px;
 font-size:17px;line-height:1.25;position:relative;box-sizing:border-box;}
.sl-seat .sl-n{font-size:13px;color:#333;}
.sl-seat .sl-rid{display:inline-block;font-weight:700;font-size:20px;padding:0 6px;
 border-radius:6px;margin:2px 0;}
.sl-seat .sl-st{font-size:14px;font-weight:600;}
.sl-seat.empty{background:#fff;border-style:dashed;color:#888;}
.sl-seat.idle-finished{background:repeating-linear-gradient(45deg,#e6e6e6 0 8px,#cfcfcf 8px 16px);
 border-color:#e4572e;}
.sl-seat.running{background:#dff3e4;border-color:#2e9e4f;}
.sl-seat.prefill{background:#dcebf8;border-color:#3b82c4;}
.sl-queue{display:flex;flex-wrap:wrap;align-items:center;gap:6px;margin-top:10px;font-size:17px;}
.sl-chip{display:inline-block;padding:2px 8px;border-radius:6px;font-weight:700;}
.sl-note{font-size:15px;color:#444;margin-top:4px;}
</style>
"""


def _chip(rid: str, cls: str = "sl-chip", title: str | None = None) -> str:
    bg = request_color(rid)
    tip = f' title="{html.escape(title, quote=True)}"' if title else ""
    return (f'<span class="{cls}" style="background:{bg};color:{text_color(bg)}"{tip}>'
            f"{html.escape(rid)}</span>")


# the scheduler's fixed reasons (engine/scheduler.py) -> a translated line; others as they are
REASONS = {
    "all seats taken": "seats.reason.seats",
    "static batching: the bus boards only when every seat is empty": "seats.reason.static",
    "token budget of this step used up": "seats.reason.budget",
}


def reason_text(reason: str) -> str:
    return t(REASONS[reason]) if reason in REASONS else reason


def wait_text(wait: dict) -> str:
    """A request's wait (engine/waits.py: its code and counts) as a sentence in the page's
    language."""
    fields = {k: v for k, v in wait.items() if k != "code"}
    return t(f"wait.{wait['code']}.why", **fields)


def seat_state_label(state: str) -> str:
    return t(f"seats.state.{state}")


def seats_html(report: dict, titles: dict[str, str] | None = None) -> str:
    """The subway car: one card per seat with its rider, tokens so far and state. `titles`:
    a rider's full name for the tooltip where the card shows a shortened one."""
    cards = []
    for seat in report["seats"]:
        state = seat["state"]
        rid = seat["request_id"]
        body = [f'<div class="sl-n">{html.escape(t("seats.seat", n=seat["index"]))}</div>']
        if rid is None:
            body.append(f'<div class="sl-st">{html.escape(seat_state_label("empty"))}</div>')
        else:
            body.append(_chip(rid, "sl-rid"))
            tokens = t("seats.tokens", n=seat["num_output_tokens"])
            body.append(f"<div>{html.escape(tokens)}</div>")
            body.append(f'<div class="sl-st">{html.escape(seat_state_label(state))}</div>')
        full = (titles or {}).get(rid, rid) if rid is not None else "-"
        title = html.escape(f"{full}: {seat_state_label(state)}", quote=True)
        cards.append(f'<div class="sl-seat {html.escape(state)}" title="{title}">'
                     f'{"".join(body)}</div>')
    return f'{CSS}<div class="sl-car">{"".join(cards)}</div>'


def queue_html(report: dict) -> str:
    """The queue at the door: waiting request ids in arrival order, and why the head waits."""
    waiting, waits = report["waiting"], report.get("waits") or {}
    parts = [f"<b>{html.escape(t('seats.queue', n=len(waiting)))}</b>"]
    parts += [_chip(rid, title=wait_text(waits[rid]) if rid in waits else None)
              for rid in waiting[:MAX_QUEUE_CHIPS]]
    if len(waiting) > MAX_QUEUE_CHIPS:
        parts.append(html.escape(t("seats.more", n=len(waiting) - MAX_QUEUE_CHIPS)))
    out = f'<div class="sl-queue">{"".join(parts)}</div>'
    if waiting and waiting[0] in waits:  # the engine's own code for the head (engine/waits.py)
        out += (f'<div class="sl-note">{html.escape(t("seats.blocked"))}: '
                f'{html.escape(wait_text(waits[waiting[0]]))}</div>')
    elif report.get("blocked_reason") and waiting:  # a report recorded before the codes
        out += (f'<div class="sl-note">{html.escape(t("seats.blocked"))}: '
                f'{html.escape(reason_text(report["blocked_reason"]))}</div>')
    events = []
    for key in ("admitted", "finished", "preempted"):
        if report.get(key):
            events.append(f"{html.escape(t(f'seats.{key}'))}: "
                          + " ".join(_chip(r) for r in report[key]))
    if events:
        out += f'<div class="sl-note">{" · ".join(events)}</div>'
    return out


def timeline_frame(history: list[dict]) -> pd.DataFrame:
    """One row per seat per step: step, seat, state, request (or "")."""
    rows = [{"step": rep["step"], "seat": s["index"], "state": s["state"],
             "request": s["request_id"] or "", "tokens": s["num_output_tokens"]}
            for rep in history for s in rep["seats"]]
    return pd.DataFrame(rows, columns=["step", "seat", "state", "request", "tokens"])


def seat_use(history: list[dict]) -> dict:
    """Seat-steps by state over the whole history, and the share that produced tokens."""
    counts = {s: 0 for s in SEAT_STATES}
    for rep in history:
        for seat in rep["seats"]:
            counts[seat["state"]] = counts.get(seat["state"], 0) + 1
    total = sum(counts.values())
    busy = counts["running"] + counts["prefill"]
    return {**counts, "total": total, "busy_frac": busy / total if total else 0.0}


def timeline_chart(history: list[dict], title: str = "") -> alt.Chart:
    """Seat x step grid coloured by state: idle-finished cells are computed for nobody."""
    df = timeline_frame(history)
    df["label"] = df["state"].map(seat_state_label)
    labels = [seat_state_label(s) for s in SEAT_STATES]
    colors = [STATE_COLORS["running"], STATE_COLORS["prefill"], STATE_COLORS["wasted"],
              "#eeeeee"]
    return (
        alt.Chart(df, title=title or alt.Undefined)
        .mark_rect(stroke="white", strokeWidth=0.5)
        .encode(
            x=alt.X("step:O", title=t("seats.axis_step"), axis=alt.Axis(labelOverlap=True)),
            y=alt.Y("seat:O", title=t("seats.axis_seat")),
            color=alt.Color("label:N", title=None, scale=alt.Scale(domain=labels, range=colors),
                            legend=alt.Legend(orient="bottom", labelFontSize=14)),
            tooltip=[alt.Tooltip("step:O", title=t("seats.axis_step")),
                     alt.Tooltip("seat:O", title=t("seats.axis_seat")),
                     alt.Tooltip("request:N", title=t("seats.rider")),
                     alt.Tooltip("label:N", title=t("seats.state"))],
        )
        .properties(height=140 + 28 * (int(df["seat"].max()) + 1 if len(df) else 4))
        .configure_axis(labelFontSize=14, titleFontSize=15)
    )


def waits_frame(history: list[dict]) -> pd.DataFrame:
    """One row per step and reason code: how many requests waited for it that step (a step
    where nobody waited has no rows)."""
    from engine.waits import count_codes

    rows = []
    for rep in history:
        # a class's slim history keeps the counts; a full report, the waits themselves
        counts = rep.get("wait_counts") or count_codes(rep.get("waits") or {})
        rows += [{"step": rep["step"], "code": c, "requests": n} for c, n in counts.items()]
    return pd.DataFrame(rows, columns=["step", "code", "requests"])


# one colour per code of engine/waits.py's WAIT_CODES, in its order (Tableau 10)
WAIT_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#b07aa1", "#76b7b2", "#bab0ac", "#edc948",
               "#59a14f")


def waits_chart(history: list[dict], title: str = "") -> alt.Chart | None:
    """The tally of reasons over time: a stacked bar per step, one colour per reason; None
    when nobody waited."""
    from engine.waits import WAIT_CODES

    df = waits_frame(history)
    if df.empty:
        return None
    df["reason"] = df["code"].map(lambda c: t(f"wait.{c}"))
    # the legend names only the reasons that occurred (in the engine's order): eight entries
    # in one row leave the bars no room in a column of the page
    present = [c for c in WAIT_CODES if c in set(df["code"])]
    labels = [t(f"wait.{c}") for c in present]
    colors = [WAIT_COLORS[WAIT_CODES.index(c)] for c in present]  # a reason keeps its colour
    return (
        alt.Chart(df, title=title or alt.Undefined)
        .mark_bar()
        .encode(
            x=alt.X("step:O", title=t("seats.axis_step"), axis=alt.Axis(labelOverlap=True)),
            y=alt.Y("sum(requests):Q", title=t("seats.waits_axis")),
            color=alt.Color("reason:N", title=None, scale=alt.Scale(domain=labels, range=colors),
                            legend=alt.Legend(orient="bottom", labelFontSize=14, columns=3)),
            tooltip=[alt.Tooltip("step:O", title=t("seats.axis_step")),
                     alt.Tooltip("reason:N", title=t("seats.waits_reason")),
                     alt.Tooltip("requests:Q", title=t("seats.waits_axis"))],
        )
        .properties(height=260)
        .configure_axis(labelFontSize=14, titleFontSize=15)
    )
