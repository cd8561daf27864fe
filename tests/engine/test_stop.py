"""Stop strings end a request and are cut from its text, as in vLLM; streaming never shows
a piece of text that is later taken back."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams

pytestmark = pytest.mark.slow

PROMPT = "<|im_start|>user\nList the days of the week.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def eng():
    return LLMEngine(EngineConfig(dtype="float32", max_num_seqs=2))


def _run(eng, params):
    """Step to the end; returns (output, the streamed text deltas joined)."""
    rid = eng.add_request(PROMPT, params)
    streamed = []
    while eng.has_unfinished():
        for e in eng.step().emitted:
            if e.request_id == rid:
                streamed.append(e.text)
    return eng.output(rid), "".join(streamed)


def test_stop_string_is_cut_and_never_streamed(eng):
    ref, _ = _run(eng, SamplingParams(max_tokens=40, ignore_eos=True))
    text = ref.text
    # a stop string that starts inside the text and spans several characters (and tokens)
    start = len(text) // 2
    stop = text[start:start + 7]
    assert len(stop.strip()) >= 3, text
    out, streamed = _run(eng, SamplingParams(max_tokens=40, ignore_eos=True, stop=[stop]))
    assert out.finish_reason == "stop"
    assert out.text == text[:text.find(stop)]
    assert stop not in out.text and stop not in streamed
    assert streamed == out.text  # what was streamed is exactly the final text
    # the token ids are the reference's, up to the token that completed the stop string
    assert out.token_ids == ref.token_ids[:len(out.token_ids)]
    assert len(out.token_ids) < len(ref.token_ids)
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks


def test_without_stop_streamed_text_is_the_whole_text(eng):
    out, streamed = _run(eng, SamplingParams(max_tokens=12, ignore_eos=True, stop=["\u2603"]))
    assert out.finish_reason == "length"
    assert streamed == out.text and len(out.text) > 0
