"""Every OpenAI field honoured or refused, through the official `openai` client: logprobs
(completions and chat, streamed and not) equal to the engine's, echo with the prompt's
logprobs, n = 2 sharing the prompt's blocks and freeing them, penalties and logit_bias as
the engine applies them, null as "not given", a 404 for an unknown model, a 400 naming each
field this server does not implement."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from tests.conftest import SMALL, in_loop

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
PROMPT = "The three primary colors are"
MESSAGES = [{"role": "user", "content": "Name a fruit that is yellow."}]


@pytest.fixture(scope="module")
def reference():
    return LLMEngine(EngineConfig(**SMALL))


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                       timeout=60) as c:
        yield c


def no_blocks_held(app) -> None:
    held = in_loop(app, lambda e: (e.allocator.num_blocks - e.allocator.num_free_blocks,
                                   len(e.requests), len(e.groups)))
    assert held == (0, 0, 0)


def test_completion_logprobs_and_echo(client, reference, server):
    (ref,) = reference.generate([PROMPT], SamplingParams(max_tokens=5, logprobs=2,
                                                         prompt_logprobs=2, ignore_eos=True))
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                                  logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([own for own, _ in ref.logprobs], abs=1e-4)
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    assert all(len(top) <= 2 and max(top.values()) == own
               for top, own in zip(lp.top_logprobs, lp.token_logprobs))  # greedy: the best

    e = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                                  logprobs=2, echo=True, extra_body={"ignore_eos": True})
    c = e.choices[0]
    assert c.text == PROMPT + r.choices[0].text
    n_prompt = len(ref.prompt_token_ids)
    assert len(c.logprobs.tokens) == n_prompt + 5
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    assert c.logprobs.token_logprobs[1:n_prompt] == pytest.approx(
        [own for own, _ in ref.prompt_logprobs[1:]], abs=1e-4)
    assert c.logprobs.token_logprobs[n_prompt:] == lp.token_logprobs

    # streamed: the same tokens and logprobs, chunk by chunk
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5,
                                            temperature=0, logprobs=2, echo=True, stream=True,
                                            extra_body={"ignore_eos": True}))
    streamed = [v for ch in chunks for v in ch.choices[0].logprobs.token_logprobs]
    assert streamed == c.logprobs.token_logprobs
    assert "".join(ch.choices[0].text for ch in chunks) == c.text
    offsets = [v for ch in chunks for v in ch.choices[0].logprobs.text_offset]
    assert offsets == c.logprobs.text_offset
    no_blocks_held(server[1])


def test_chat_logprobs_and_refusal_field(client, reference):
    ids = reference.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                  tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    (ref,) = reference.generate([ids], SamplingParams(max_tokens=6, logprobs=3))
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=3)
    m = r.choices[0].message
    assert m.refusal is None and "refusal" in m.model_dump()
    content = r.choices[0].logprobs.content
    assert [t.logprob for t in content] == pytest.approx([o for o, _ in ref.logprobs],
                                                         abs=1e-4)
    assert all(len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
               for t in content)
    assert b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace") == m.content \
        or r.choices[0].finish_reason == "stop"
    s = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6,
                                            temperature=0, logprobs=True, top_logprobs=3,
                                            stream=True))
    streamed = [t.logprob for ch in s for c in ch.choices if c.logprobs
                for t in c.logprobs.content]
    assert streamed == [t.logprob for t in content]


def test_n2_completions_and_chat_share_then_free_blocks(client, reference, server):
    refs = reference.generate([PROMPT], SamplingParams(max_tokens=6, n=2, temperature=1.0,
                                                       seed=7, ignore_eos=True))[0].samples
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, n=2,
                                  temperature=1.0, seed=7,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.model_extra["token_ids"] for c in r.choices] == [s.token_ids for s in refs]
    assert r.usage.completion_tokens == 12
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, n=2,
                                            temperature=1.0, seed=7, stream=True,
                                            extra_body={"ignore_eos": True}))
    texts = ["", ""]
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in r.choices]
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, n=2,
                                          temperature=1.0, seed=3)
    assert len(chat.choices) == 2 and all(c.message.refusal is None for c in chat.choices)
    no_blocks_held(server[1])


def test_penalties_and_logit_bias_as_the_engine(client, reference):
    (plain,) = reference.generate([PROMPT], SamplingParams(max_tokens=8, ignore_eos=True))
    sp = SamplingParams(max_tokens=8, presence_penalty=1.5, frequency_penalty=1.0,
                        logit_bias={plain.token_ids[0]: -100.0}, ignore_eos=True)
    (ref,) = reference.generate([PROMPT], sp)
    r = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, presence_penalty=1.5,
        frequency_penalty=1.0, logit_bias={str(plain.token_ids[0]): -100},
        extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids
    assert ref.token_ids[0] != plain.token_ids[0]


def test_null_means_not_given(server):
    url, _ = server
    nulls = {k: None for k in ("temperature", "top_p", "n", "stream", "top_k", "seed", "stop",
                               "stream_options", "presence_penalty", "frequency_penalty",
                               "logit_bias", "logprobs", "echo", "best_of", "suffix", "user")}
    r = httpx.post(f"{url}/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2, **nulls})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1 and r.json()["choices"][0]["logprobs"] is None
    chat_nulls = {k: None for k in ("temperature", "top_p", "n", "stream", "logprobs",
                                    "top_logprobs", "tools", "tool_choice", "response_format",
                                    "max_completion_tokens", "modalities", "audio")}
    r = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                   json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **chat_nulls})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["refusal"] is None


def test_unknown_model_404_and_refused_fields_400(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-9", prompt="x", max_tokens=1)
    assert e.value.code == "model_not_found"
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    for kw, param in (({"tools": [tool]}, "tools"),
                      ({"response_format": {"type": "json_object"}}, "response_format"),
                      ({"tool_choice": "required"}, "tool_choice"),
                      ({"modalities": ["text", "audio"]}, "modalities"),
                      ({"reasoning_effort": "high"}, "reasoning_effort"),
                      ({"store": True}, "store"),
                      ({"top_logprobs": 2}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1, **kw)
        assert e.value.param == param, kw
    ok = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1,
                                        response_format={"type": "text"}, tool_choice="none")
    assert ok.choices[0].finish_reason in ("length", "stop")
    for kw, param in (({"best_of": 3, "n": 2}, "best_of"), ({"suffix": "end"}, "suffix")):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt="x", max_tokens=1, **kw)
        assert e.value.param == param


def test_continuous_usage_stats_counts_each_chunk(server):
    """vLLM's `stream_options.continuous_usage_stats` (guidellm sends it): each chunk's usage
    is the tokens so far, ending at the request's total; without it chunks carry none."""
    url, _ = server
    req = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "ignore_eos": True,
           "temperature": 0, "stream": True}
    for continuous in (True, False):
        so = {"include_usage": True, "continuous_usage_stats": continuous}
        with httpx.stream("POST", f"{url}/v1/completions", json={**req, "stream_options": so},
                          timeout=60) as r:
            assert r.status_code == 200
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]
        with_text = [c for c in chunks if c["choices"]]
        assert len(with_text) == 6
        if continuous:
            assert [c["usage"]["completion_tokens"] for c in with_text] == [1, 2, 3, 4, 5, 6]
            assert all(c["usage"]["prompt_tokens"] == chunks[-1]["usage"]["prompt_tokens"]
                       for c in with_text)
        else:
            assert all("usage" not in c for c in with_text)
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
