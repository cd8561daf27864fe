"""OpenAI's request and response shapes, and its error body, as the server speaks them.

The field names are OpenAI's (`/v1/completions`, `/v1/chat/completions`), with the few
extensions vLLM adds and a load generator needs: `top_k`, `ignore_eos` (every request then
computes exactly `max_tokens`, so two servers do the same work) and `return_token_ids`
(each choice, and each streamed chunk, carries the token ids it adds, so a test can hold the
server to `LLMEngine.generate` token for token), `min_tokens`, `stop_token_ids`. Modelled
on vLLM's `vllm/entrypoints/openai/protocol.py`, but stricter: every field OpenAI defines is
honoured or refused with a 400 naming it, an unknown field is a 400, and no string is read
as a number (docs/serving.md, "Supported and refused fields").

Every error leaves as OpenAI's body: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.config import MAX_LOGPROBS


class APIError(Exception):
    """An error a client caused (or a limit it hit), answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, extra: dict | None = None):
        """`extra`: more fields of the error object, after OpenAI's four (a router's own,
        such as the class server's `wait`)."""
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers
        self.extra = extra

    def body(self) -> dict:
        body = error_body(self.message, self.type, self.param, self.code)
        if self.extra:
            body["error"].update(self.extra)
        return body


def error_body(message: str, type: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# Types are strict (no "8" for 8, no true for 1, no "yes" for true); a JSON integer is still a
# number. `null` for any optional field means "not given": the `openai` client sends null.
STRICT = ConfigDict(strict=True, extra="forbid")


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool | None = None  # a last chunk with `usage` and no choices
    include_obfuscation: bool | None = None  # refused when true: no obfuscation padding here
    # vLLM's extension (guidellm sends it): with include_usage, every chunk carries the usage
    # so far, so a client can count tokens per chunk without a tokenizer
    continuous_usage_stats: bool | None = None


class _Sampling(BaseModel):
    """The fields completions and chat share. An unknown field is a 400 naming it (the route
    also refuses, by name, OpenAI's fields this server does not implement: `refused`)."""

    model_config = STRICT

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)  # None: 1
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)  # None: 1
    top_k: int | None = Field(default=None, ge=-1)  # vLLM extension; 0 or -1 = all tokens
    n: int | None = Field(default=None, ge=1)  # samples (choices); at most the server's seats
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=64)  # the client's name (join code page)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None  # token id (as text) -> bias in [-100, 100]
    ignore_eos: bool | None = None  # vLLM extension
    min_tokens: int | None = Field(default=None, ge=0)  # vLLM extension
    stop_token_ids: list[int] | None = None  # vLLM extension
    return_token_ids: bool | None = None  # vLLM extension
    # OpenAI's fields accepted only at their default value (the route says why otherwise)
    service_tier: Any = None
    store: Any = None
    metadata: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    safety_identifier: Any = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)


class CompletionRequest(_Sampling):
    # text, or a list of token ids (OpenAI accepts both); a one-element list of either too
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None  # the prompt comes back before the answer (with its logprobs)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # alternatives per token
    best_of: int | None = Field(default=None, ge=1)  # only best_of == n (nothing to rank)
    suffix: Any = None  # refused: no insertion


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict]  # text, or OpenAI's content parts (text parts only)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # refused unless at their default: there is no tool calling, no structured output, no
    # audio, no reasoning here
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None


def _is_text_format(v) -> bool:
    return isinstance(v, dict) and v.get("type") == "text" and len(v) == 1


# field -> (is this value the default, i.e. nothing to implement?, why a value is refused)
_REFUSED = {
    "suffix": (lambda v: v in (None, ""), "text after the insertion point is not supported"),
    "response_format": (lambda v: v is None or _is_text_format(v),
                        "only {\"type\": \"text\"} is supported (no JSON mode or schema)"),
    "tools": (lambda v: v in (None, []), "tool calling is not supported"),
    "tool_choice": (lambda v: v in (None, "none"), "tool calling is not supported"),
    "parallel_tool_calls": (lambda v: v is None, "tool calling is not supported"),
    "functions": (lambda v: v in (None, []), "function calling is not supported"),
    "function_call": (lambda v: v in (None, "none"), "function calling is not supported"),
    "modalities": (lambda v: v is None or v == ["text"], "only text output is supported"),
    "audio": (lambda v: v is None, "audio output is not supported"),
    "prediction": (lambda v: v is None, "predicted outputs are not supported"),
    "reasoning_effort": (lambda v: v is None, "this model does not reason"),
    "verbosity": (lambda v: v is None, "verbosity is not supported"),
    "web_search_options": (lambda v: v is None, "web search is not supported"),
    "moderation": (lambda v: v is None, "moderation is not supported"),
    "service_tier": (lambda v: v in (None, "auto", "default"), "this server has one tier"),
    "store": (lambda v: v in (None, False), "this server stores no completions"),
    "metadata": (lambda v: v in (None, {}), "metadata goes with `store`, which is not "
                                            "supported"),
    "prompt_cache_key": (lambda v: v is None, "the prefix cache takes no key here"),
    "prompt_cache_retention": (lambda v: v is None, "the prefix cache takes no retention "
                                                    "setting here"),
    "prompt_cache_options": (lambda v: v is None, "the prefix cache takes no options here"),
    "safety_identifier": (lambda v: v is None, "there is no abuse monitoring to identify "
                                               "users to"),
}


def refused(body: BaseModel) -> None:
    """A 400 naming the first field given a value this server does not implement."""
    for name, (default, why) in _REFUSED.items():
        if name in type(body).model_fields and not default(getattr(body, name)):
            raise APIError(400, f"{name}: {why}; leave it out (or null)", param=name,
                           code="unsupported_parameter")
    so = body.stream_options
    if so is not None and so.include_obfuscation:
        raise APIError(400, "stream_options.include_obfuscation: no obfuscation padding is "
                            "sent here", param="stream_options.include_obfuscation",
                       code="unsupported_parameter")


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(engine_reason: str | None) -> str | None:
    """The engine's reasons in OpenAI's words: eos and stop strings are "stop", running out of
    max_tokens or of the model's length is "length"."""
    if engine_reason is None:
        return None
    return {"eos": "stop", "stop": "stop", "stop_token": "stop", "length": "length",
            "max_model_len": "length",
            "abort": "abort"}.get(engine_reason, engine_reason)
