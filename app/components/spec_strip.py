"""Leak 3 drawn: per request, one strip per step of drafted tokens and the verifier's verdicts.

Green: a drafted token the target accepted. Red: the first drafted token it rejected. Pink:
tokens drafted after that rejection, thrown away unexamined. Blue: the token the target
itself emitted after the draft (the correction that replaces a rejected token, or the
bonus when every drafted token was accepted). Pure functions of StepReport dicts; model
text is shown with visible whitespace and always through `html.escape`.
"""

from __future__ import annotations

import html

from app.components.palette import SPEC_COLORS, text_color
from app.i18n import t

CSS = """
<style>
.sl-strip{display:flex;flex-wrap:wrap;align-items:center;gap:4px;margin:3px 0;font-size:18px;}
.sl-strip .sl-step{width:84px;font-size:14px;color:#444;}
.sl-tok{display:inline-block;padding:1px 6px;border-radius:5px;font-family:monospace;
 white-space:pre;border:1px solid #0002;}
.sl-kind{font-size:14px;margin-left:2px;color:#1f6fd1;}
</style>
"""


def show_token(text: str) -> str:
    """Token text with visible whitespace, escaped for HTML. A token that holds only part of
    a multi-byte character (common for Chinese) decodes to U+FFFD; it is drawn as ▯."""
    visible = (text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
               .replace("\r", "␍").replace("\ufffd", "▯")) or "∅"
    return html.escape(visible)


def verdict(token: dict) -> str:
    """'accepted', 'rejected' (examined and refused) or 'discarded' (after a rejection)."""
    if token["accepted"]:
        return "accepted"
    return "rejected" if token.get("accept_prob") is not None else "discarded"


def records_for(history: list[dict], request_id: str) -> list[tuple[int, dict]]:
    """(step, spec record) for every step that verified a draft of `request_id`."""
    return [(rep["step"], rec) for rep in history for rec in rep.get("spec", [])
            if rec["request_id"] == request_id]


def spec_requests(history: list[dict]) -> list[str]:
    """Request ids with at least one verified draft, in first-seen order."""
    seen: dict[str, None] = {}
    for rep in history:
        for rec in rep.get("spec", []):
            seen.setdefault(rec["request_id"], None)
    return list(seen)


def _tok(text: str, kind: str, title: str = "") -> str:
    bg = SPEC_COLORS[kind]
    return (f'<span class="sl-tok" style="background:{bg};color:{text_color(bg)}" '
            f'title="{html.escape(title, quote=True)}">{show_token(text)}</span>')


def strip_html(step: int, record: dict) -> str:
    """One step of one request: the drafted tokens with verdicts, then the target's token."""
    parts = [f'<span class="sl-step">{html.escape(t("spec.step", n=step))}</span>']
    for i, tok in enumerate(record["drafted"]):
        v = verdict(tok)
        parts.append(_tok(tok["text"], v, f"#{i + 1} {t('spec.verdict.' + v)}"))
    kind = record["next_kind"]
    parts.append(_tok(record["next_text"], kind if kind in SPEC_COLORS else "correction",
                      t(f"spec.kind.{kind}")))
    parts.append(f'<span class="sl-kind">{html.escape(t(f"spec.kind.{kind}"))}</span>')
    return f'<div class="sl-strip">{"".join(parts)}</div>'


def strips_html(history: list[dict], request_id: str, last: int = 20) -> str:
    """The last `last` verified steps of one request, newest at the bottom."""
    rows = [strip_html(step, rec) for step, rec in records_for(history, request_id)[-last:]]
    if not rows:
        return CSS + f"<div>{html.escape(t('spec.no_drafts'))}</div>"
    return CSS + "".join(rows)


def legend_html() -> str:
    items = [("accepted", t("spec.verdict.accepted")), ("rejected", t("spec.verdict.rejected")),
             ("discarded", t("spec.verdict.discarded")), ("correction", t("spec.target_token"))]
    chips = "".join(
        f'<span class="sl-tok" style="background:{SPEC_COLORS[kind]};'
        f'color:{text_color(SPEC_COLORS[kind])};font-family:inherit">{html.escape(label)}</span>'
        for kind, label in items)
    return f'{CSS}<div class="sl-strip">{chips}</div>'


def drafted_tokens(history: list[dict], request_id: str) -> list[dict]:
    """Every drafted token of one request, flattened, with its step and position."""
    out = []
    for step, rec in records_for(history, request_id):
        for i, tok in enumerate(rec["drafted"]):
            out.append({**tok, "step": step, "pos": i + 1, "verdict": verdict(tok)})
    return out


def token_label(tok: dict) -> str:
    text = tok["text"].replace("\n", "↵").replace("\ufffd", "▯") or "∅"
    return f"{t('spec.step', n=tok['step'])} · #{tok['pos']} «{text}» · " \
           f"{t('spec.verdict.' + tok['verdict'])}"


def accept_math(tok: dict) -> dict:
    """p_target, p_draft and the acceptance probability min(1, p_target / p_draft)."""
    pt, pd = tok.get("p_target"), tok.get("p_draft")
    ratio = None
    if pt is not None and pd:
        ratio = min(1.0, pt / pd)
    elif pt is not None and pd == 0:
        ratio = 1.0 if pt > 0 else 0.0
    return {"p_target": pt, "p_draft": pd, "min_ratio": ratio,
            "engine_accept_prob": tok.get("accept_prob")}


def spec_summary(history: list[dict]) -> dict:
    """Totals over every verified draft: acceptance rate, mean accepted length, tokens per pass."""
    drafted = accepted = verifies = emitted = 0
    for rep in history:
        for rec in rep.get("spec", []):
            verifies += 1
            drafted += len(rec["drafted"])
            accepted += rec["num_accepted"]
            emitted += rec["num_accepted"] + 1
    return {
        "verifies": verifies,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted": accepted / verifies if verifies else None,
        "tokens_per_pass": emitted / verifies if verifies else None,
    }
