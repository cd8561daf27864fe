"""Leak 3 drawn: per request, one strip per step of drafted tokens and the verifier's verdicts.

Green: a drafted token the target accepted. Red: the first drafted token it rejected. Pink:
tokens drafted after that rejection, thrown away unexamined. Blue: the token the target
itself emitted after the draft (the correction that replaces a rejected token, or the
bonus when every drafted token was accepted). Each token's tooltip names the target's most
likely tokens at its position (what a draft had to match, from the verifier's own row) and
the numbers of the acceptance rule. Pure functions of StepReport dicts; model text is shown
with visible whitespace and always through `html.escape`, inside attributes too.

Byte tokens: a byte-level tokenizer splits a Chinese character (3 UTF-8 bytes) over two or
three tokens, and each part alone decodes to the replacement glyph. Given each token's bytes
(`token_bytes`, from the tokenizer), a strip shows such a token as its bytes, e.g. ⟨e7·8c⟩,
and the token that completes the character adds it: ⟨ab⟩=猫.

Two acceptance numbers (chapter 6.4's formula needs the second):
- the acceptance rate, accepted / drafted: every drafted token counts, also those thrown away
  unexamined after a rejection;
- a, the chance that a drafted token is accepted given that the ones before it were:
  accepted / examined (a token is examined when all before it were accepted). The expected
  tokens per target pass with n drafted is (1 - a^(n+1)) / (1 - a), which `spec_summary`
  averages over the passes and sets beside the measured tokens per pass.
"""

from __future__ import annotations

import html

from app.components.palette import SPEC_COLORS, text_color
from app.i18n import t
from engine.metrics import num_examined

CSS = """
<style>
.sl-strip{display:flex;flex-wrap:wrap;align-items:center;gap:4px;margin:3px 0;font-size:18px;}
.sl-strip .sl-step{width:84px;font-size:14px;color:#444;}
.sl-tok{display:inline-block;padding:1px 6px;border-radius:5px;font-family:monospace;
 white-space:pre;border:1px solid #0002;}
.sl-kind{font-size:14px;margin-left:2px;color:#1f6fd1;}
</style>
"""


def visible(text: str) -> str:
    """Token text with visible whitespace, not yet escaped. A token that holds only part of a
    multi-byte character (common for Chinese) decodes to U+FFFD; it is drawn as ▯."""
    return (text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥")
            .replace("\r", "␍").replace("\ufffd", "▯")) or "∅"


def show_token(text: str) -> str:
    """`visible(text)`, escaped for HTML."""
    return html.escape(visible(text))


def pct(p: float | None) -> str:
    """A probability as a percentage: whole percent from 10%, one decimal below."""
    if p is None:
        return "—"
    return f"{100 * p:.0f}%" if p >= 0.1 else f"{100 * p:.1f}%"


def brief(top: list[dict]) -> str:
    """The target's most likely tokens in one line: «the» 62% · «a» 21% (plain text; the
    caller escapes it)."""
    return " · ".join(f"«{visible(a.get('text', ''))}» {pct(a['p'])}" for a in top)


def draft_tip(i: int, tok: dict) -> str:
    """A drafted token's tooltip: its verdict, the target's alternatives at its position
    (what it had to match), p_target, p_draft and the acceptance probability."""
    v = verdict(tok)
    lines = [f"#{i + 1} {t('spec.verdict.' + v)}"]
    if tok.get("top"):
        lines.append(t("spec.tip.top", alts=brief(tok["top"])))
    if v != "discarded" and tok.get("p_target") is not None:
        lines.append(t("spec.tip.pq", p=pct(tok["p_target"]), q=pct(tok.get("p_draft"))))
    if tok.get("accept_prob") is not None:
        lines.append(t("spec.tip.accept", a=pct(tok["accept_prob"])))
    return "\n".join(lines)


def next_tip(record: dict) -> str:
    """The target's own token's tooltip: correction or bonus, its probability in the target's
    row after the accepted prefix, and that row's most likely tokens."""
    lines = [t(f"spec.kind.{record['next_kind']}")]
    if record.get("next_top"):
        lines.append(t("spec.tip.top", alts=brief(record["next_top"])))
    if record.get("next_p") is not None:
        lines.append(t("spec.tip.p", p=pct(record["next_p"])))
    return "\n".join(lines)


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


def piece_bytes(piece: str) -> bytes | None:
    """The bytes of one tokenizer piece (`convert_ids_to_tokens`): byte-level BPE (GPT-2,
    SmolLM2, Qwen: each byte drawn as one printable character) or SentencePiece's byte
    fallback ("<0xE7>"). None when the piece is neither."""
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
        return bytes([int(piece[3:5], 16)])
    decoder = _byte_decoder()
    if all(ch in decoder for ch in piece):
        return bytes(decoder[ch] for ch in piece)
    return None


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted (its `bytes_to_unicode`)."""
    if not _BYTE_DECODER:
        keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                *range(ord("®"), ord("ÿ") + 1)]
        extra = 0
        for b in range(256):
            if b in keep:
                _BYTE_DECODER[chr(b)] = b
            else:
                _BYTE_DECODER[chr(256 + extra)] = b
                extra += 1
    return _BYTE_DECODER


_BYTE_DECODER: dict[str, int] = {}


def token_bytes(tokenizer, token_ids) -> dict[int, bytes]:
    """token id -> its bytes, for the ids whose piece the tokenizer can give as bytes."""
    out = {}
    for tid in set(token_ids):
        raw = piece_bytes(tokenizer.convert_ids_to_tokens(int(tid)))
        if raw is not None:
            out[int(tid)] = raw
    return out


class ByteJoiner:
    """Labels tokens in reading order: a token that decodes whole keeps its text; one that
    holds part of a character shows its bytes, and the one that completes it adds the
    character (the bytes of the incomplete tokens before it are carried along)."""

    def __init__(self, by_id: dict[int, bytes] | None):
        self.by_id = by_id or {}
        self.pending = b""

    def label(self, token_id: int, text: str) -> str:
        raw = self.by_id.get(token_id)
        if "\ufffd" not in text or raw is None:
            self.pending = b""
            return text
        shown = "⟨" + "·".join(f"{b:02x}" for b in raw) + "⟩"
        joined = (self.pending + raw).decode("utf-8", errors="replace")
        if self.pending and "\ufffd" not in joined:
            self.pending = b""
            return f"{shown}={joined}"
        self.pending = self.pending + raw if self.pending else raw
        return shown


def _tok(text: str, kind: str, title: str = "") -> str:
    bg = SPEC_COLORS[kind]
    return (f'<span class="sl-tok" style="background:{bg};color:{text_color(bg)}" '
            f'title="{html.escape(title, quote=True)}">{show_token(text)}</span>')


def strip_html(step: int, record: dict, by_id: dict[int, bytes] | None = None,
               mark_lookup: bool = False) -> str:
    """One step of one request: the drafted tokens with verdicts, then the target's token.

    `by_id` (token id -> bytes) lets tokens that hold part of a character show their bytes.
    The tokens the request kept (accepted drafts, then the target's own) are read in order,
    so a character split over several of them is joined; a rejected or discarded token
    starts afresh (it is not part of the text). With `mark_lookup` (prompt lookup in front
    of a model), a draft that prompt lookup made says so."""
    parts = [f'<span class="sl-step">{html.escape(t("spec.step", n=step))}</span>']
    if mark_lookup and record.get("source") == "lookup":
        parts.append(f'<span class="sl-kind">{html.escape(t("spec.by_lookup"))}</span>')
    kept = ByteJoiner(by_id)
    for i, tok in enumerate(record["drafted"]):
        v = verdict(tok)
        text = (kept if v == "accepted" else ByteJoiner(by_id)).label(tok["token_id"],
                                                                       tok["text"])
        parts.append(_tok(text, v, draft_tip(i, tok)))
    kind = record["next_kind"]
    parts.append(_tok(kept.label(record["next_token_id"], record["next_text"]),
                      kind if kind in SPEC_COLORS else "correction", next_tip(record)))
    parts.append(f'<span class="sl-kind">{html.escape(t(f"spec.kind.{kind}"))}</span>')
    return f'<div class="sl-strip">{"".join(parts)}</div>'


def strip_token_ids(history: list[dict], request_id: str) -> list[int]:
    """Every token id the strips of `request_id` show (to look their bytes up)."""
    return [tid for _, rec in records_for(history, request_id)
            for tid in [*(d["token_id"] for d in rec["drafted"]), rec["next_token_id"]]]


def strips_html(history: list[dict], request_id: str, last: int = 20,
                by_id: dict[int, bytes] | None = None, mark_lookup: bool = False) -> str:
    """The last `last` verified steps of one request, newest at the bottom."""
    rows = [strip_html(step, rec, by_id, mark_lookup)
            for step, rec in records_for(history, request_id)[-last:]]
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
    """p_target, p_draft and the acceptance probability min(1, p_target / p_draft); all None
    for a token after a rejection, which was never examined."""
    if verdict(tok) == "discarded":
        return dict.fromkeys(("p_target", "p_draft", "min_ratio", "engine_accept_prob"))
    pt, pd = tok.get("p_target"), tok.get("p_draft")
    ratio = None
    if pt is not None and pd:
        ratio = min(1.0, pt / pd)
    elif pt is not None and pd == 0:
        ratio = 1.0 if pt > 0 else 0.0
    return {"p_target": pt, "p_draft": pd, "min_ratio": ratio,
            "engine_accept_prob": tok.get("accept_prob")}


def expected_tokens_per_pass(a: float, k: int) -> float:
    """The chapter's formula: 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens per
    target pass, when each of k drafted tokens is accepted with probability a given that the
    ones before it were (the sum's form also holds at a = 1)."""
    if not 0.0 <= a <= 1.0 or k < 0:
        raise ValueError(f"a must be in [0, 1] and k >= 0; got a={a}, k={k}")
    return sum(a**i for i in range(k + 1))


def spec_summary(history: list[dict]) -> dict:
    """Totals over every verified draft: both acceptance numbers (see the module docstring),
    mean accepted length, measured tokens per pass and the formula's prediction of it."""
    drafted = accepted = examined = verifies = emitted = 0
    lengths: list[int] = []
    for rep in history:
        for rec in rep.get("spec", []):
            verifies += 1
            drafted += len(rec["drafted"])
            accepted += rec["num_accepted"]
            examined += num_examined(len(rec["drafted"]), rec["num_accepted"])
            emitted += rec["num_accepted"] + 1
            lengths.append(len(rec["drafted"]))
    a = accepted / examined if examined else None
    predicted = (sum(expected_tokens_per_pass(a, n) for n in lengths) / len(lengths)
                 if a is not None else None)
    return {
        "verifies": verifies,
        "drafted": drafted,
        "accepted": accepted,
        "examined": examined,
        "acceptance_rate": accepted / drafted if drafted else None,
        "a": a,
        "mean_drafted": drafted / verifies if verifies else None,
        "mean_accepted": accepted / verifies if verifies else None,
        "tokens_per_pass": emitted / verifies if verifies else None,
        "predicted_tokens_per_pass": predicted,
    }
