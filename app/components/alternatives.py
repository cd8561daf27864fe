"""The token inspector: one token and the model's most likely alternatives, as bars.

Two sources, both in StepReport dicts:
- the sampler's choice (speculation off): `Emitted.logprobs`, per token (its logprob,
  [[alternative id, logprob], ...]), the model's own distribution before temperature, top-k
  or top-p (vLLM's raw logprobs). The app's runs ask for them when they do not speculate
  (app/state.py ALTERNATIVES); the alternatives' texts come from the tokenizer, or from a
  recording's pieces.
- what a draft had to match: a speculation record's drafted tokens' `top` and its
  `next_top`, from the very rows the verifier read, texts included (spec_strip shows those).

Pure functions; model text goes through html.escape.
"""

from __future__ import annotations

import html
import math

from app.components.spec_strip import pct, piece_bytes, show_token

CSS = """
<style>
.sl-alts{display:grid;grid-template-columns:max-content 1fr max-content;gap:3px 8px;
 align-items:center;font-size:16px;max-width:560px;margin:4px 0;}
.sl-alts .sl-tok{font-family:monospace;white-space:pre;padding:1px 6px;border-radius:5px;
 border:1px solid #0002;background:#f3f3f3;}
.sl-alts .sl-chosen{border:2px solid #1f6fd1;font-weight:600;}
.sl-alts .sl-bar{height:14px;background:#1f6fd1;border-radius:3px;min-width:1px;}
.sl-alts .sl-rest{background:#bbb;}
.sl-alts .sl-p{font-variant-numeric:tabular-nums;}
</style>
"""


def token_text(tokenizer, token_id: int) -> str:
    """A token decoded on its own: by the tokenizer, or (a recording's tokenizer has only
    pieces) from its piece's bytes."""
    decode = getattr(tokenizer, "decode", None)
    if decode is not None:
        return decode([int(token_id)])
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    raw = piece_bytes(piece)
    return raw.decode("utf-8", errors="replace") if raw is not None else piece


def inspectable_requests(history: list[dict]) -> list[str]:
    """Request ids with at least one generated token whose alternatives were recorded."""
    seen: dict[str, None] = {}
    for rep in history:
        for e in rep.get("emitted", ()):
            if e.get("logprobs"):
                seen.setdefault(e["request_id"], None)
    return list(seen)


def sampled_tokens(history: list[dict], request_id: str, tokenizer, last: int = 20) -> list[dict]:
    """The last `last` generated tokens of one request that carry alternatives: step, token
    id, text, probability and `top` ([{token_id, p, text}], most likely first)."""
    raw = [(rep["step"], tid, lp)
           for rep in history for e in rep.get("emitted", ())
           if e["request_id"] == request_id and e.get("logprobs")
           for tid, lp in zip(e["token_ids"], e["logprobs"])][-last:]
    return [{"step": step, "token_id": int(tid), "text": token_text(tokenizer, tid),
             "p": math.exp(own),
             "top": [{"token_id": int(a), "p": math.exp(la), "text": token_text(tokenizer, a)}
                     for a, la in alts]}
            for step, tid, (own, alts) in raw]


def alternatives_html(top: list[dict], chosen_id: int | None = None, chosen_text: str = "",
                      chosen_p: float | None = None, mark: str = "", rest: str = "") -> str:
    """One bar per alternative (most likely first), the chosen token outlined and marked with
    `mark`; a chosen token outside the top gets its own row after them, and `rest` (a label)
    a grey bar for the probability left to every other token."""
    rows = []

    def row(text: str, p: float | None, chosen: bool, cls: str = "") -> None:
        label = show_token(text) + (f" {html.escape(mark)}" if chosen and mark else "")
        width = 0.0 if p is None else max(0.0, min(1.0, p))
        rows.append(f'<span class="sl-tok{" sl-chosen" if chosen else ""}">{label}</span>'
                    f'<div><div class="sl-bar{cls}" style="width:{100 * width:.1f}%"></div></div>'
                    f'<span class="sl-p">{pct(p)}</span>')

    outside = chosen_id is not None and all(a["token_id"] != chosen_id for a in top)
    for a in top:
        row(a.get("text", ""), a["p"], a["token_id"] == chosen_id)
    if outside:
        row(chosen_text, chosen_p, True)
    if rest and top:
        left = max(0.0, 1 - sum(a["p"] for a in top) - (chosen_p or 0.0 if outside else 0.0))
        rows.append(f'<span class="sl-tok">{html.escape(rest)}</span>'
                    f'<div><div class="sl-bar sl-rest" style="width:{100 * left:.1f}%">'
                    f'</div></div><span class="sl-p">{pct(left)}</span>')
    return f'{CSS}<div class="sl-alts">{"".join(rows)}</div>'
