"""OpenAI's API over the one stepping loop: what any OpenAI client (or `benchmarks.load`) talks to.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (streamed as server-sent events
in OpenAI's chunk format ending with `data: [DONE]`, or whole), `GET /v1/models`,
`GET /health`, `GET /metrics` (Prometheus text, vLLM's names: `engine/server/metrics.py`).

What a handler does: check the fields (404 unknown model; 400 max_tokens over the cap, a bad
sampling field, a field OpenAI defines that this server does not implement: `refused`), build SamplingParams, hand a Ticket to the loop through `ServerState.admit`
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
import re
import time
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
    refused,
    usage,
)
from engine.server.state import STUDENT, ServerState

_ids = itertools.count()  # request ids, unique in the process (tests reuse one engine)
DISCONNECT_POLL_S = 0.25  # a non-streaming handler checks this often whether its client left


# OpenAI reports an impossible token as -9999.0; JSON has no -Infinity
LOGPROB_FLOOR = -9999.0


def _lp(v: float | None) -> float | None:
    return None if v is None else max(v, LOGPROB_FLOOR)


def completion_logprobs(infos: list[dict], offset: int) -> dict:
    """Completions' (legacy) logprobs of some tokens: their text, logprob, alternatives (a
    map text -> logprob; None for a prompt's first token) and where each starts in `text`."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for i in infos:
        out["tokens"].append(i["token"])
        out["token_logprobs"].append(_lp(i["logprob"]))
        out["top_logprobs"].append(None if i["top"] is None else
                                   {a["token"]: _lp(a["logprob"]) for a in i["top"]})
        out["text_offset"].append(offset)
        offset += len(i["token"])
    return out


def chat_logprobs(infos: list[dict], offset: int) -> dict:
    """Chat's logprobs: per token its text, logprob, UTF-8 bytes and alternatives."""
    return {"content": [{"token": i["token"], "logprob": _lp(i["logprob"]), "bytes": i["bytes"],
                         "top_logprobs": [{"token": a["token"], "logprob": _lp(a["logprob"]),
                                           "bytes": a["bytes"]} for a in i["top"]]}
                        for i in infos], "refusal": None}


@dataclass(frozen=True)
class Shape:
    """What one endpoint's responses hold that the other's do not. Every body is
    `{"id", "object", "created", "model", "choices"[, "usage"]}` and every choice
    `{"index", <payload>, "logprobs", "finish_reason"[, token ids]}`."""

    id_prefix: str  # request ids: "<prefix>-<n>" (the id the step stream shows)
    chunk_object: str  # `object` of a streamed chunk, and of the usage-only last chunk
    final_object: str  # `object` of the whole (non-streamed) answer
    head: dict | None  # payload of a chunk sent before any token (None: no such chunk)
    chunk: Callable[[str, list[int] | None], dict]  # a chunk's payload: (text, token ids)
    final: Callable[[str], dict]  # the whole answer's payload: (text)
    logprobs: Callable[[list[dict], int], dict]  # tokens' logprobs (infos, text offset)


COMPLETION = Shape("cmpl", "text_completion", "text_completion", head=None,
                   chunk=lambda text, ids: {"text": text},
                   final=lambda text: {"text": text}, logprobs=completion_logprobs)
CHAT = Shape("chatcmpl", "chat.completion.chunk", "chat.completion",
             head={"delta": {"role": "assistant", "content": "", "refusal": None}},
             chunk=lambda text, ids: {"delta": {"content": text} if text or ids else {}},
             final=lambda text: {"message": {"role": "assistant", "content": text,
                                             "refusal": None}},
             logprobs=chat_logprobs)


@dataclass
class _Choice:
    """One sample's answer as it builds up (text, token ids, logprobs, text offset)."""

    text: str = ""
    tokens: list[int] | None = None
    infos: list[dict] | None = None
    offset: int = 0
    finish: str | None = None
    started: bool = False


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def respond(state: ServerState, shape: Shape, ticket: Ticket, request: Request,
                  accepted: Delta, stream: bool, include_usage: bool, return_ids: bool,
                  want_logprobs: bool = False, echo: str | None = None,
                  continuous_usage: bool = False):
    """Relay an admitted ticket's deltas: SSE chunks, or one body at the end. `echo`: the
    prompt's text, put before each answer (and its tokens' logprobs before the answer's)."""
    rid, created, model = ticket.request_id, now(), state.settings.model_name
    n_prompt = len(accepted.prompt_token_ids)
    n = ticket.params.n
    lease = state.lease(ticket)
    choices = [_Choice(tokens=[], infos=[] if want_logprobs else None) for _ in range(n)]

    def body(obj: str, chs: list, n_out: int | None = None) -> dict:
        out = {"id": rid, "object": obj, "created": created, "model": model, "choices": chs}
        if n_out is not None:
            out["usage"] = usage(n_prompt, n_out)
        return out

    def choice(index: int, payload: dict, reason, logprobs=None, ids: dict | None = None):
        c = {"index": index, **payload, "logprobs": logprobs, "finish_reason": reason}
        if ids is not None:
            c.update(ids)
        return c

    def take(d: Delta) -> tuple[str, list[dict] | None]:
        """A delta's new text and token infos, with the echoed prompt before the first."""
        c = choices[d.index]
        text, infos = d.text, ((d.logprobs or []) if want_logprobs else None)
        if not c.started:
            c.started = True
            if echo is not None:
                text = echo + text
                if want_logprobs:
                    infos = (d.prompt_logprobs or []) + infos
        c.text += text
        c.tokens.extend(d.token_ids)
        if c.finish is None:
            c.finish = d.finish_reason
        return text, infos

    if stream:
        async def events():
            try:
                if shape.head is not None:
                    ids = [] if return_ids else None
                    for i in range(n):
                        yield _sse(body(shape.chunk_object, [choice(
                            i, shape.head, None, None,
                            None if ids is None else {"token_ids": ids})]))
                n_out, open_ = 0, n
                while open_:
                    d: Delta = await ticket.queue.get()
                    if d.error is not None:
                        yield _sse(d.error.body())
                        lease.done = True
                        return
                    n_out += len(d.token_ids)
                    text, infos = take(d)
                    if d.token_ids or text or d.finish_reason:
                        c = choices[d.index]
                        lps = None
                        if infos is not None:
                            lps = shape.logprobs(infos, c.offset)
                            c.offset += sum(len(i["token"]) for i in infos)
                        ids = d.token_ids if return_ids else None
                        yield _sse(body(shape.chunk_object, [choice(
                            d.index, shape.chunk(text, ids), finish_reason(d.finish_reason),
                            lps, None if ids is None else {"token_ids": ids})],
                            n_out if continuous_usage else None))
                    if d.finish_reason is not None:
                        open_ -= 1
                lease.done = True
                if include_usage:
                    yield _sse(body(shape.chunk_object, [], n_out))
                yield "data: [DONE]\n\n"
            finally:
                lease.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 background=BackgroundTask(lease.close))
    # whether the client is still there is asked on a clock, not only when no token came:
    # tokens arrive every step, and a request that always had one would never be asked
    next_check = time.monotonic() + DISCONNECT_POLL_S
    infos_of: list[list[dict] | None] = [[] if want_logprobs else None for _ in range(n)]
    try:
        open_ = n
        while open_:
            try:
                d = await asyncio.wait_for(ticket.queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                d = None
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + DISCONNECT_POLL_S
                if await request.is_disconnected():
                    return Response(status_code=499)  # lease.close() aborts it
            if d is None:
                continue
            if d.error is not None:
                lease.done = True
                return error_response(d.error)
            _, infos = take(d)
            if infos is not None:
                infos_of[d.index].extend(infos)
            if d.finish_reason is not None:
                open_ -= 1
        lease.done = True
        out = []
        for i, c in enumerate(choices):
            ids = ({"prompt_token_ids": accepted.prompt_token_ids, "token_ids": c.tokens}
                   if return_ids else None)
            lps = shape.logprobs(infos_of[i], 0) if infos_of[i] is not None else None
            out.append(choice(i, shape.final(c.text), finish_reason(c.finish), lps, ids))
        return JSONResponse(body(shape.final_object, out, sum(len(c.tokens) for c in choices)))
    finally:
        lease.close()


_TOKEN_ID = re.compile(r"[0-9]{1,9}")


def sampling(state: ServerState, body, max_tokens: int | None, logprobs: int | None = None,
             prompt_logprobs: int | None = None) -> SamplingParams:
    """The request's SamplingParams, or an error naming the field (404 for the model)."""
    name, cap = state.settings.model_name, state.max_tokens_cap
    if body.model != name:
        raise APIError(404, f"the model {body.model!r} does not exist; this server serves "
                            f"{name!r} (GET /v1/models)", param="model", code="model_not_found")
    refused(body)
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options: only with stream=true", param="stream_options")
    if max_tokens is not None and max_tokens > cap:
        raise APIError(400, f"max_tokens={max_tokens} is over this server's cap of {cap}",
                       param="max_tokens")
    n, seats = body.n or 1, state.engine.config.max_num_seqs
    if n > seats:
        raise APIError(400, f"n={n}: this server runs at most {seats} samples at once",
                       param="n")
    bias = None
    if body.logit_bias:
        vocab = state.engine.model_config.vocab_size
        bias = {}
        for k, v in body.logit_bias.items():
            if not _TOKEN_ID.fullmatch(k) or int(k) >= vocab:
                raise APIError(400, f"logit_bias: {k!r} is not a token id in [0, {vocab})",
                               param="logit_bias")
            bias[int(k)] = v
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    try:
        return SamplingParams(
            max_tokens=max_tokens or 1,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p, top_k=body.top_k or 0,
            seed=body.seed, ignore_eos=bool(body.ignore_eos), stop=stop or None, n=n,
            presence_penalty=body.presence_penalty or 0.0,
            frequency_penalty=body.frequency_penalty or 0.0, logit_bias=bias,
            min_tokens=body.min_tokens or 0, stop_token_ids=body.stop_token_ids or None,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs)
    except ValueError as exc:  # the message names the field
        raise APIError(400, str(exc), param=str(exc).split(" ")[0].split("[")[0]) from None


async def run(state: ServerState, shape: Shape, body, request: Request,
              max_tokens: int | None, prompt=None, messages=None, logprobs: int | None = None,
              echo: bool = False):
    """Admit one request of either endpoint and answer it."""
    params = sampling(state, body, max_tokens, logprobs,
                      logprobs if echo and logprobs is not None else None)
    n = next(_ids)
    if params.seed is None:
        # a seed of its own (the engine's default counts the requests it holds, and the
        # loop forgets finished ones: two unseeded requests could share a seed)
        params.seed = state.engine.config.seed * 100003 + n
    # limits count by who is asking (ServerState.client_of), never by the `user` label
    client = state.client_of(request)
    state.check_teacher_only(client, body.user, max_tokens, body.ignore_eos)
    user = body.user or client.address
    ticket = Ticket(request_id=f"{shape.id_prefix}-{n}", params=params, user=user,
                    aloop=asyncio.get_running_loop(), queue=asyncio.Queue(), prompt=prompt,
                    messages=messages, max_tokens=max_tokens, client=client, echo=echo)
    if client.role == STUDENT:
        ticket.default_max_tokens = state.settings.student_max_tokens
    accepted = await state.admit(ticket)
    echo_text = None
    if echo:
        echo_text = prompt if isinstance(prompt, str) else accepted.prompt_text
    return await respond(state, shape, ticket, request, accepted, bool(body.stream),
                         body.include_usage, bool(body.return_token_ids),
                         logprobs is not None, echo_text, body.continuous_usage)


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
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, "prompt: this server takes one prompt per request (n "
                                    "samples of it with `n`)", param="prompt")
            prompt = prompt[0]
        n = body.n or 1
        if body.best_of is not None and body.best_of != n:
            raise APIError(400, f"best_of={body.best_of}: ranking samples is not supported; "
                                f"best_of may only equal n ({n})", param="best_of",
                           code="unsupported_parameter")
        max_tokens = body.max_tokens if body.max_tokens is not None else min(
            16, state.max_tokens_cap)
        return await run(state, COMPLETION, body, request, max_tokens, prompt=prompt,
                         logprobs=body.logprobs, echo=bool(body.echo))

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
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs=true", param="top_logprobs")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        return await run(state, CHAT, body, request, max_tokens, messages=messages,
                         logprobs=logprobs)

    return r
