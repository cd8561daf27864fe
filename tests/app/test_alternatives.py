"""The token inspector and the strips' tooltips: the target's (or the sampler's) top
alternatives, drawn from StepReport dicts, model text escaped everywhere (no model, no
browser). Records from before the alternatives existed (tests/app/fixtures/reports.json)
still draw."""

from __future__ import annotations

import copy
import html
import json
import math
import pathlib
import sys
from types import SimpleNamespace

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.components import alternatives, spec_strip  # noqa: E402
from app.recorded import RecordedTokenizer  # noqa: E402
from engine.recording import engine_pieces  # noqa: E402

REPORTS = json.loads((ROOT / "tests/app/fixtures/reports.json").read_text(encoding="utf-8"))
EVIL = '<script>alert("x")</script>'


@pytest.fixture(autouse=True)
def english(monkeypatch):
    monkeypatch.setattr("app.i18n.get_lang", lambda: "en")


def record() -> dict:
    """A verified draft as the engine records it: two accepted, one rejected, one discarded,
    then the correction; a hostile alternative text among the tops."""
    top0 = [{"token_id": 5, "p": 0.62, "text": " the"}, {"token_id": 6, "p": 0.21, "text": " a"},
            {"token_id": 7, "p": 0.05, "text": EVIL}]
    return {"request_id": "r0", "source": "lookup", "next_kind": "correction",
            "num_accepted": 2, "next_token_id": 9, "next_text": " cat", "next_p": 0.4,
            "next_top": [{"token_id": 9, "p": 0.4, "text": " cat"},
                         {"token_id": 10, "p": 0.3, "text": ' "dog'}],
            "drafted": [
                {"token_id": 5, "text": " the", "p_target": 0.62, "p_draft": 1.0,
                 "accept_prob": 0.62, "accepted": True, "top": top0},
                {"token_id": 8, "text": " big", "p_target": 0.5, "p_draft": 0.7,
                 "accept_prob": 0.5 / 0.7, "accepted": True,
                 "top": [{"token_id": 8, "p": 0.5, "text": " big"}]},
                {"token_id": 11, "text": EVIL, "p_target": 0.01, "p_draft": 0.9,
                 "accept_prob": 0.01 / 0.9, "accepted": False,
                 "top": [{"token_id": 9, "p": 0.4, "text": " cat"}]},
                {"token_id": 12, "text": " x", "p_target": 0.2, "p_draft": 0.3,
                 "accept_prob": None, "accepted": False, "top": []}]}


def titles(out: str) -> list[str]:
    return [html.unescape(part.split('"', 1)[0]) for part in out.split('title="')[1:]]


def test_strip_tooltips_show_the_targets_alternatives_and_the_rule():
    out = spec_strip.strip_html(4, record())
    tips = titles(out)
    assert len(tips) == 5, "four drafted tokens and the target's own"
    assert tips[0].splitlines() == [
        "#1 accepted", "target's most likely here: «␣the» 62% · «␣a» 21% · "
        f"«{EVIL}» 5.0%", "p_target 62% · p_draft 100%",
        "chance of acceptance 62% (greedy: kept if it is the target's top token; sampled: "
        "min(1, p_target ÷ p_draft))"]
    assert "chance of acceptance 71%" in tips[1]
    assert tips[2].startswith("#3 rejected") and "«␣cat» 40%" in tips[2]
    assert tips[3] == "#4 discarded after a rejection", "never checked: no numbers"
    assert tips[4].splitlines() == ["correction", "target's most likely here: «␣cat» 40% · "
                                    "«␣\"dog» 30%", "its probability in the target's row: 40%"]


def test_model_text_in_tooltips_is_escaped_inside_the_attribute():
    out = spec_strip.strip_html(4, record())
    assert "<script>" not in out and 'alert("x")' not in out
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in out
    assert "&quot;dog" in out, "a quote in a token cannot end the title attribute"
    for part in out.split("<span")[1:]:
        assert part.count('"') % 2 == 0


def test_tooltips_speak_chinese(monkeypatch):
    monkeypatch.setattr("app.i18n.get_lang", lambda: "zh")
    tips = titles(spec_strip.strip_html(4, record()))
    assert "目标模型在这里最可能的：«␣the» 62%" in tips[0] and "接受概率 62%" in tips[0]
    assert "它在目标模型这一行的概率：40%" in tips[4]


def test_records_from_before_the_alternatives_still_draw():
    history = copy.deepcopy(REPORTS["spec_draft"])
    rid = spec_strip.spec_requests(history)[0]
    assert "most likely" in spec_strip.strips_html(history, rid), "the fixture has them"
    for rep in history:  # as a recording made before the alternatives existed
        for rec in rep["spec"]:
            del rec["next_top"], rec["next_p"]
            for d in rec["drafted"]:
                del d["top"]
    out = spec_strip.strips_html(history, rid)
    assert out.count('class="sl-strip"') == len(spec_strip.records_for(history, rid))
    assert "most likely" not in out and "chance of acceptance" in out


def test_alternatives_bars_mark_the_chosen_token_and_escape_text():
    top = record()["drafted"][0]["top"]
    out = alternatives.alternatives_html(top, 5, " the", 0.62, mark="← drafted",
                                         rest="every other token")
    assert out.count('class="sl-bar"') == 3 and out.count("sl-bar sl-rest") == 1
    assert out.count("sl-chosen") == 2  # the CSS rule and the one outlined token
    assert "␣the ← drafted" in out
    assert EVIL not in out and html.escape(EVIL) in out
    assert "width:62.0%" in out and "width:12.0%" in out, "the rest: 1 - 0.88"
    # a choice outside the top gets its own row, and counts in what is shown
    out = alternatives.alternatives_html(top, 99, "<b>", 0.02, mark="←", rest="rest")
    assert out.count('class="sl-bar"') == 4 and "&lt;b&gt; ←" in out and "<b>" not in out
    assert "width:10.0%" in out
    assert "sl-chosen" not in alternatives.alternatives_html(top).split("</style>")[1]


def emitted_history() -> list[dict]:
    lp = math.log
    return [{"step": 1, "emitted": [{"request_id": "r0", "token_ids": [5], "text": " the",
                                     "logprobs": None}]},
            {"step": 2, "emitted": [
                {"request_id": "r0", "token_ids": [8],
                 "logprobs": [[lp(0.5), [[8, lp(0.5)], [7, lp(0.3)], [6, lp(0.1)]]]]},
                {"request_id": "r1", "token_ids": [6],
                 "logprobs": [[lp(0.1), [[8, lp(0.7)], [7, lp(0.2)], [6, lp(0.1)]]]]}]},
            {"step": 3, "emitted": [{"request_id": "r1", "token_ids": [7],
                                     "logprobs": [[lp(0.9), [[7, lp(0.9)]]]]}]}]


def test_sampled_tokens_read_the_engines_logprobs_with_their_texts():
    texts = {5: " the", 6: " a", 7: EVIL, 8: " big"}
    tok = SimpleNamespace(decode=lambda ids: texts[ids[0]])
    history = emitted_history()
    assert alternatives.inspectable_requests(history) == ["r0", "r1"]
    r1 = alternatives.sampled_tokens(history, "r1", tok)
    assert [(t["step"], t["token_id"], t["text"]) for t in r1] == [(2, 6, " a"), (3, 7, EVIL)]
    assert r1[0]["p"] == pytest.approx(0.1)
    assert [(a["token_id"], a["text"]) for a in r1[0]["top"]] == [(8, " big"), (7, EVIL), (6, " a")]
    assert [a["p"] for a in r1[0]["top"]] == pytest.approx([0.7, 0.2, 0.1])
    assert alternatives.sampled_tokens(history, "r1", tok, last=1)[0]["step"] == 3
    out = alternatives.alternatives_html(r1[0]["top"], 6, " a", r1[0]["p"], mark="←")
    assert out.count("sl-chosen") == 2 and EVIL not in out


def test_a_recordings_pieces_give_the_alternatives_texts():
    """A replay has no tokenizer, only the pieces the recording kept: every alternative's
    is kept, and a byte-level piece decodes to its text."""
    encoder = {b: ch for ch, b in spec_strip._byte_decoder().items()}
    pieces = {5: "".join(encoder[b] for b in b" the"), 8: "Ġbig", 7: "<0x41>",
              6: "".join(encoder[b] for b in "猫".encode())}
    real = SimpleNamespace(convert_ids_to_tokens=lambda i: pieces[i])
    kept = engine_pieces(real, emitted_history())
    assert set(kept) == {5, 6, 7, 8}, "every emitted token and every alternative"
    tok = RecordedTokenizer(kept)
    assert [alternatives.token_text(tok, i) for i in (5, 8, 7, 6)] == [" the", " big", "A", "猫"]


@pytest.mark.parametrize("name", ["spec_ngram", "spec_draft"])
def test_the_engines_records_hold_consistent_alternatives(name):
    """Recorded by the real engine (temperature 1): each checked token's top is sorted, sums
    to at most 1 and gives the drafted token its p_target; the correction or bonus has its."""
    recs = [rec for rep in REPORTS[name] for rec in rep["spec"]]
    assert recs
    for rec in recs:
        for d in rec["drafted"]:
            if spec_strip.verdict(d) == "discarded":
                assert d["top"] == []
                continue
            ps = [a["p"] for a in d["top"]]
            assert len(ps) == 3 and ps == sorted(ps, reverse=True) and sum(ps) <= 1 + 1e-6
            for a in d["top"]:
                assert a["text"] is not None
                if a["token_id"] == d["token_id"]:
                    assert a["p"] == pytest.approx(d["p_target"], abs=1e-6)
        # a correction comes from max(0, p - q), so it too has p > 0 in the target's row
        assert len(rec["next_top"]) == 3 and 0 < rec["next_p"] <= 1
