"""The official `openai` client against a real uvicorn server: completions and chat, streamed
and not; greedy answers equal, token for token, to `LLMEngine.generate` (and `LLMEngine.chat`)
on an engine of the same configuration; `usage` counts right."""

from __future__ import annotations

import httpx
import openai
import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from tests.conftest import SMALL, in_loop

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
PROMPT = "The three primary colors are"
MESSAGES = [{"role": "system", "content": "You are brief."},
            {"role": "user", "content": "Name a fruit that is yellow."}]


@pytest.fixture(scope="module")
def reference():
    """A separate engine, same configuration: what the server must reproduce."""
    return LLMEngine(EngineConfig(**SMALL))


@pytest.fixture(scope="module")
def client(server):
    url, _ = server
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0,
                       timeout=60) as c:
        yield c


def _ids(choice) -> list[int]:
    return list(choice.model_extra["token_ids"])


def test_completion_greedy_equals_generate(client, reference):
    ref = reference.generate(PROMPT, SamplingParams(max_tokens=16, temperature=0.0,
                                                    ignore_eos=True))[0]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    (choice,) = r.choices
    assert _ids(choice) == ref.token_ids
    assert choice.model_extra["prompt_token_ids"] == ref.prompt_token_ids
    assert choice.text == ref.text and choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == 16 and r.usage.total_tokens == 16 + len(
        ref.prompt_token_ids)
    assert r.object == "text_completion" and r.model == MODEL


def test_completion_stream_equals_generate(client, reference):
    ref = reference.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True})
    ids, text, reasons, usage = [], "", [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            ids += c.model_extra.get("token_ids") or []
            text += c.text
            reasons.append(c.finish_reason)
    assert ids == ref.token_ids and text == ref.text
    assert reasons[-1] == "length" and all(r is None for r in reasons[:-1])
    assert usage.completion_tokens == 12 and usage.prompt_tokens == len(ref.prompt_token_ids)


def test_prompt_as_token_ids(client, reference):
    ids = reference.tokenize("SELECT name FROM users WHERE")
    ref = reference.generate([ids], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert _ids(r.choices[0]) == ref.token_ids


def test_chat_equals_engine_chat(client, reference):
    ref = reference.chat(MESSAGES, SamplingParams(max_tokens=20))
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20,
                                       temperature=0, extra_body={"return_token_ids": True})
    (choice,) = r.choices
    assert _ids(choice) == ref.token_ids
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert choice.message.role == "assistant"
    # the answer's text, without the end-of-sequence token's own text
    assert "<|im_end|>" not in choice.message.content
    assert ref.text.startswith(choice.message.content) and choice.message.content
    assert choice.finish_reason == ("stop" if ref.finish_reason == "eos" else "length")


def test_chat_stream(client, reference):
    ref = reference.chat(MESSAGES, SamplingParams(max_tokens=20))
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = [t for ch in chunks for c in ch.choices for t in (c.model_extra.get("token_ids") or [])]
    content = "".join(c.delta.content or "" for ch in chunks for c in ch.choices)
    assert ids == ref.token_ids
    assert content and ref.text.startswith(content)
    assert chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert chunks[-1].choices == []


def test_sampled_with_seed_is_repeatable(client):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0.9, seed=7,
              extra_body={"ignore_eos": True, "return_token_ids": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert _ids(a.choices[0]) == _ids(b.choices[0])


def test_models_health_and_no_leak(server, client):
    url, app = server
    (m,) = client.models.list().data
    assert m.id == MODEL
    assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}
    # every request above finished: nothing left in the engine, every block free
    free, total, live = in_loop(app, lambda e: (e.allocator.num_free_blocks,
                                                e.allocator.num_blocks, len(e.requests)))
    assert free == total and live == 0
