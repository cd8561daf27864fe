"""OpenAI's request and response shapes, and its error body, as the server speaks them.

The field names are OpenAI's (`/v1/completions`, `/v1/chat/completions`), with the few
extensions vLLM adds and a load generator needs: `top_k`, `ignore_eos` (every request then
computes exactly `max_tokens`, so two servers do the same work) and `return_token_ids`
(each choice, and each streamed chunk, carries the token ids it adds, so a test can hold the
server to `LLMEngine.generate` token for token). Modelled on vLLM's
`vllm/entrypoints/openai/protocol.py`; unknown fields are ignored, as vLLM does.

Every error leaves as OpenAI's body: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class APIError(Exception):
    """An error a client caused (or a limit it hit), answered with OpenAI's error body."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False  # a last chunk with `usage` and no choices


class _Sampling(BaseModel):
    """The fields completions and chat share."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # vLLM extension; 0 or -1 = all tokens
    n: int = Field(default=1, ge=1, le=1)  # one choice per request
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=64)  # the client's name (join code page)
    ignore_eos: bool = False  # vLLM extension
    return_token_ids: bool = False  # vLLM extension

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    # text, or a list of token ids (OpenAI accepts both); a one-element list of text too
    prompt: str | list[int] | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict]  # text, or OpenAI's content parts (text parts only)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # OpenAI's newer name


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
    return {"eos": "stop", "stop": "stop", "length": "length", "max_model_len": "length",
            "abort": "abort"}.get(engine_reason, engine_reason)
