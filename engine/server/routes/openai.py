"""OpenAI's API over the one stepping loop: what any OpenAI client (or `engine.load`) talks to.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (streamed as server-sent events
in OpenAI's chunk format ending with `data: [DONE]`, or whole), `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text, vLLM's names: `engine/server/metrics.py`).

What a handler does: check the fields (400 unknown model, max_tokens over the cap, a bad
sampling field), build SamplingParams, hand a Ticket to the loop through `ServerState.admit`
(429 when the server or this client, `user` else its address, is full), wait for "accepted"
(or the loop's 400: prompt too long, empty...), then relay the deltas with `respond`.

The two endpoints differ only in their request's parsing (one prompt, or messages) and in
their bodies' shapes, which are data (`Shape`: `COMPLETION`, `CHAT`); one `respond` builds
every chunk and body for both. A client that goes away mid-request has its request aborted:
its seat and blocks are freed at the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from engine.config import SamplingParams
from engine.server.errors import error_response
from engine.server.loop import Delta, Ticket
from engine.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    finish_reason,
    now,
    usage,
)
from engine.server.state import ServerState

_ids = itertools.count()  # request ids, unique in the process (tests reuse one engine)
DISCONNECT_POLL_S = 0.5  # a non-streaming handler checks this often whether its client left


@dataclass(frozen=True)
class Shape:
    """What one endpoint's responses hold that the other's do not. Every body is
    `{"id", "object", "created", "model", "choices"[, "usage"]}` and every choice
    `{"index": 0, <payload>, "logprobs": null, "finish_reason"[, token ids]}`."""

    id_prefix: str  # request ids: "<prefix>-<n>" (the id the step stream shows)
    chunk_object: str  # `object` of a streamed chunk, and of the usage-only last chunk
    final_object: str  # `object` of the whole (non-streamed) answer
    head: dict | None  # payload of a chunk sent before any token (None: no such chunk)
    chunk: Callable[[str, list[int] | None], dict]  # a chunk's payload: (text, token ids)
    final: Callable[[str], dict]  # the whole answer's payload: (text)


COMPLETION = Shape("cmpl", "text_completion", "text_completion", head=None,
                   chunk=lambda text, ids: {"text": text},
                   final=lambda text: {"text": text})
CHAT = Shape("chatcmpl", "chat.completion.chunk", "chat.completion",
             head={"delta": {"role": "assistant", "content": ""}},
             chunk=lambda text, ids: {"delta": {"content": text} if text or ids else {}},
             final=lambda text: {"message": {"role": "assistant", "content": text}})


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def respond(state: ServerState, shape: Shape, ticket: Ticket, request: Request,
                  accepted: Delta, stream: bool, include_usage: bool, return_ids: bool):
    """Relay an admitted ticket's deltas: SSE chunks, or one body at the end."""
    rid, created, model = ticket.request_id, now(), state.settings.model_name
    n_prompt = len(accepted.prompt_token_ids)
    lease = state.lease(ticket)

    def body(obj: str, choices: list, n_out: int | None = None) -> dict:
        out = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices}
        if n_out is not None:
            out["usage"] = usage(n_prompt, n_out)
        return out

    def choice(payload: dict, reason, ids: dict | None = None) -> dict:
        c = {"index": 0, **payload, "logprobs": None, "finish_reason": reason}
        if ids is not None:
            c.update(ids)
        return c

    if stream:
        async def events():
            try:
                if shape.head is not None:
                    ids = [] if return_ids else None
                    yield _sse(body(shape.chunk_object, [choice(
                        shape.head, None, None if ids is None else {"token_ids": ids})]))
                n_out = 0
                while True:
                    d: Delta = await ticket.queue.get()
                    if d.error is not None:
                        yield _sse(d.error.body())
                        lease.done = True
                        break
                    n_out += len(d.token_ids)
                    if d.token_ids or d.text or d.finish_reason:
                        ids = d.token_ids if return_ids else None
                        yield _sse(body(shape.chunk_object, [choice(
                            shape.chunk(d.text, ids), finish_reason(d.finish_reason),
                            None if ids is None else {"token_ids": ids})]))
                    if d.finish_reason is not None:
                        lease.done = True
                        if include_usage:
                            yield _sse(body(shape.chunk_object, [], n_out))
                        break
                yield "data: [DONE]\n\n"
            finally:
                lease.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 background=BackgroundTask(lease.close))
    text, tokens = [], []
    try:
        while True:
            try:
                d = await asyncio.wait_for(ticket.queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return Response(status_code=499)
                continue
            if d.error is not None:
                lease.done = True
                return error_response(d.error)
            text.append(d.text)
            tokens.extend(d.token_ids)
            if d.finish_reason is not None:
                lease.done = True
                ids = ({"prompt_token_ids": accepted.prompt_token_ids, "token_ids": tokens}
                       if return_ids else None)
                return JSONResponse(body(shape.final_object, [choice(
                    shape.final("".join(text)), finish_reason(d.finish_reason), ids)],
                    len(tokens)))
    finally:
        lease.close()


def sampling(state: ServerState, body, max_tokens: int | None) -> SamplingParams:
    """The request's SamplingParams, or a 400 naming the field."""
    name, cap = state.settings.model_name, state.max_tokens_cap
    if body.model != name:
        raise APIError(400, f"unknown model {body.model!r}; this server serves "
                            f"{name!r} (GET /v1/models)", param="model", code="model_not_found")
    if max_tokens is not None and max_tokens > cap:
        raise APIError(400, f"max_tokens={max_tokens} is over this server's cap of {cap}",
                       param="max_tokens")
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    try:
        return SamplingParams(max_tokens=max_tokens or 1, temperature=body.temperature,
                              top_p=body.top_p, top_k=body.top_k, seed=body.seed,
                              ignore_eos=body.ignore_eos, stop=stop or None)
    except ValueError as exc:  # the message names the field
        raise APIError(400, str(exc), param=str(exc).split(" ")[0]) from None


async def run(state: ServerState, shape: Shape, body, request: Request,
              max_tokens: int | None, prompt=None, messages=None):
    """Admit one request of either endpoint and answer it."""
    params = sampling(state, body, max_tokens)
    n = next(_ids)
    if params.seed is None:
        # a seed of its own (the engine's default counts the requests it holds, and the
        # loop forgets finished ones: two unseeded requests could share a seed)
        params.seed = state.engine.config.seed * 100003 + n
    user = body.user or (request.client.host if request.client else "unknown")
    ticket = Ticket(request_id=f"{shape.id_prefix}-{n}", params=params, user=user,
                    aloop=asyncio.get_running_loop(), queue=asyncio.Queue(), prompt=prompt,
                    messages=messages, max_tokens=max_tokens)
    accepted = await state.admit(ticket)
    return await respond(state, shape, ticket, request, accepted, body.stream,
                         body.include_usage, body.return_token_ids)


def router(state: ServerState) -> APIRouter:
    r = APIRouter()

    @r.get("/health")
    async def health():
        return {"status": "ok"}

    @r.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": state.settings.model_name, "object": "model", "created": now(),
            "owned_by": "servelab", "max_model_len": state.engine.config.max_model_len}]}

    @r.get("/metrics")
    async def prometheus():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @r.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "prompt: this server takes one prompt per request",
                               param="prompt")
            prompt = prompt[0]
        max_tokens = body.max_tokens if body.max_tokens is not None else min(
            16, state.max_tokens_cap)
        return await run(state, COMPLETION, body, request, max_tokens, prompt=prompt)

    @r.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        messages = []
        for i, m in enumerate(body.messages):
            content = m.content
            if isinstance(content, list):  # OpenAI's content parts: text only here
                if not all(isinstance(p, dict) and p.get("type") == "text"
                           and isinstance(p.get("text"), str) for p in content):
                    raise APIError(400, f"messages.{i}.content: only text parts are supported",
                                   param=f"messages.{i}.content")
                content = "".join(p["text"] for p in content)
            messages.append({"role": "system" if m.role == "developer" else m.role,
                             "content": content})
        max_tokens = body.max_completion_tokens or body.max_tokens  # None: what room is left
        return await run(state, CHAT, body, request, max_tokens, messages=messages)

    return r
