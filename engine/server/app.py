"""The HTTP side: FastAPI routes in OpenAI's shapes over the one stepping loop.

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (streamed as server-sent
events in OpenAI's chunk format ending with `data: [DONE]`, or whole), `GET /v1/models`,
`GET /health`, `GET /v1/servelab/config` (the engine's configuration), `GET /metrics`
(Prometheus text, vLLM's names: `metrics.py`) and `GET /v1/servelab/steps` (the engine's
StepReports as server-sent events, each with its `owners` map: `loop.py` says what a viewer
reads). `GET /v1/servelab/steps?limit=N` closes
after N events.

What a handler does: check the limits, build SamplingParams, hand a Ticket to the loop,
wait for "accepted" (or the loop's 400: prompt too long, empty...), then relay the deltas.
A client that goes away mid-request has its request aborted: its seat and blocks are freed
at the next step.

Limits, each answered with OpenAI's error body `{"error": {"message", "type", "param",
"code"}}` and never a traceback: 400 bad field, over-long prompt, unknown model, max_tokens
over the cap; 401 missing or wrong API key (compared in constant time; every route but
`/health` needs it when a key is set); 413 body over `max_body_bytes`; 429 when
`max_queue` requests are already in the server, or this client (`user`, else its address)
already has `max_requests_per_user` running. No route reads a path or a file a request names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import itertools
import json
from collections import Counter
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.config import SamplingParams
from engine.server.loop import Delta, EngineLoop, Ticket
from engine.server.metrics import ServerMetrics
from engine.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    finish_reason,
    now,
    usage,
)

_ids = itertools.count()  # request ids, unique in the process (tests reuse one engine)
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
DISCONNECT_POLL_S = 0.5  # a non-streaming handler checks this often whether its client left
OPEN_PATHS = ("/health", "/class")  # no key: the health check and the students' empty page


@dataclass
class ServerSettings:
    """The server's limits (flags of `python -m engine.serve`), with safe defaults."""

    model_name: str = "smollm2-135m"  # the one name `model` may take
    api_key: str | None = None  # None: no key needed (only ever on 127.0.0.1)
    max_queue: int = 1024  # requests in the server at once (running + waiting); then 429
    max_requests_per_user: int = 8  # per client name or address; then 429
    max_tokens_cap: int | None = None  # largest max_tokens a request may ask (None: model len)
    max_body_bytes: int = 1 << 20  # 1 MiB; then 413
    # the teacher's key: when set, the step stream, /metrics and the other /v1/servelab/ views
    # need it instead of `api_key` (the join code every student has), so no student can read
    # the others' answers off the step stream
    admin_key: str | None = None


class _Limits:
    """Pure ASGI middleware: the API key and the body size, before any body is parsed."""

    def __init__(self, app, settings: ServerSettings, metrics: ServerMetrics):
        self.app, self.settings, self.metrics = app, settings, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        s = self.settings
        path = scope["path"]
        key = s.api_key
        if s.admin_key is not None and (path == "/metrics" or path.startswith("/v1/servelab/")):
            key = s.admin_key
        if key is not None and path not in OPEN_PATHS:
            headers = dict(scope["headers"])
            auth = headers.get(b"authorization", b"").decode("latin-1")
            given = auth[7:] if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(given.encode("utf-8", "replace"), key.encode()):
                whose = "the teacher's admin key" if key is s.admin_key else "the class's join code"
                return await self._refuse(send, APIError(
                    401, f"missing or wrong API key: send 'Authorization: Bearer <key>' ({whose})",
                    "authentication_error", code="invalid_api_key"))
        length = dict(scope["headers"]).get(b"content-length")
        too_big = APIError(413, f"request body over this server's limit of "
                                f"{s.max_body_bytes} bytes", code="request_too_large")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return await self._refuse(send, APIError(400, "bad Content-Length header"))
            if n > s.max_body_bytes:
                return await self._refuse(send, too_big)
        # a chunked body has no length up front: count as it arrives. FastAPI turns any error
        # raised while it reads the body into its own 400, so the overflow is remembered
        # here and the app's answer is replaced by the 413 on its way out.
        seen, overflow, refused = 0, False, False

        async def counted_receive():
            nonlocal seen, overflow
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > s.max_body_bytes:
                    overflow = True
                    raise _BodyTooLarge
            return msg

        async def checked_send(msg):
            nonlocal refused
            if not overflow:
                return await send(msg)
            if not refused:
                refused = True
                await self._refuse(send, too_big)

        try:
            await self.app(scope, counted_receive, checked_send)
        except _BodyTooLarge:
            if not refused:
                await self._refuse(send, too_big)

    async def _refuse(self, send, err: APIError) -> None:
        self.metrics.on_reject(err.status)
        body = json.dumps(err.body()).encode()
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _BodyTooLarge(Exception):
    pass


def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def create_app(engine, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app over `engine`. The stepping loop starts and stops with the app."""
    settings = settings or ServerSettings()
    metrics = ServerMetrics(settings.model_name)
    loop = EngineLoop(engine, metrics, settings.max_tokens_cap)
    cap = loop.max_tokens_cap
    inflight: Counter[str] = Counter()  # client -> requests in the server (event loop only)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        loop.start()
        yield
        loop.stop()

    app = FastAPI(title="ServeLab", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.loop, app.state.metrics, app.state.settings = loop, metrics, settings
    app.add_middleware(_Limits, settings=settings, metrics=metrics)

    @app.exception_handler(APIError)
    async def _api_error(request, err: APIError):
        metrics.on_reject(err.status)
        return _error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        # drop "body" and the names pydantic gives union members ("str", "list[int]"...)
        loc = [str(p) for p in first.get("loc", ()) if p != "body" and not (
            isinstance(p, str) and (p in _TYPE_TAGS or "[" in p or "-" in p))]
        param = ".".join(loc) or None
        msg = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            msg, param = "the request body is not valid JSON", None
        elif param:
            msg = f"{param}: {msg}"
        metrics.on_reject(400)
        return JSONResponse(error_body(msg, "invalid_request_error", param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        if exc.status_code == 404:
            msg = f"no route {request.url.path}"
        elif exc.status_code == 405:
            msg = f"{request.method} is not allowed on {request.url.path}"
        else:
            msg = str(exc.detail)
        return JSONResponse(error_body(msg, "invalid_request_error" if exc.status_code < 500
                                       else "server_error"), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request, exc):
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}",
                                       "server_error"), status_code=500)

    # --- plumbing shared by both endpoints --------------------------------------------------
    def client_name(body, request: Request) -> str:
        if body.user:
            return body.user
        return request.client.host if request.client else "unknown"

    def sampling(body, max_tokens: int | None) -> SamplingParams:
        if body.model != settings.model_name:
            raise APIError(400, f"unknown model {body.model!r}; this server serves "
                                f"{settings.model_name!r} (GET /v1/models)", param="model",
                           code="model_not_found")
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

    async def admit(ticket: Ticket) -> Delta:
        """Reserve a place for this client, hand the ticket to the loop, wait for its answer."""
        if sum(inflight.values()) >= settings.max_queue:
            raise APIError(429, f"the server is full ({settings.max_queue} requests in it); "
                                f"try again shortly", "rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})
        if inflight[ticket.user] >= settings.max_requests_per_user:
            raise APIError(429, f"client {ticket.user!r} already has "
                                f"{settings.max_requests_per_user} requests running",
                           "rate_limit_error", code="too_many_requests_per_user",
                           headers={"Retry-After": "1"})
        inflight[ticket.user] += 1
        loop.submit(ticket)
        try:
            first: Delta = await ticket.queue.get()
        except BaseException:  # cancelled while waiting (shutdown): give the place back
            release(ticket)
            loop.abort(ticket.request_id)
            raise
        if first.error is not None:
            release(ticket)
            raise first.error
        return first

    def release(ticket: Ticket) -> None:
        inflight[ticket.user] -= 1
        if inflight[ticket.user] <= 0:
            del inflight[ticket.user]

    def new_ticket(prefix, body, request, params, max_tokens, prompt=None, messages=None):
        n = next(_ids)
        if params.seed is None:
            # a seed of its own (the engine's default counts the requests it holds, and the
            # loop forgets finished ones: two unseeded requests could share a seed)
            params.seed = engine.config.seed * 100003 + n
        return Ticket(request_id=f"{prefix}-{n}", params=params,
                      user=client_name(body, request), aloop=asyncio.get_running_loop(),
                      queue=asyncio.Queue(), prompt=prompt, messages=messages,
                      max_tokens=max_tokens)

    async def run(ticket: Ticket, request: Request, chunk, final, stream: bool,
                  include_usage: bool, return_ids: bool, accepted: Delta):
        """Relay the loop's deltas: SSE chunks, or one body at the end."""
        n_prompt = len(accepted.prompt_token_ids)
        state = {"done": False, "released": False}

        def cleanup():
            if not state["done"]:
                loop.abort(ticket.request_id)  # the client went away: free its seat now
                state["done"] = True
            if not state["released"]:
                release(ticket)
                state["released"] = True

        if stream:
            async def events():
                try:
                    head = chunk(None, [] if return_ids else None, None, first=True)
                    if head is not None:
                        yield _sse(head)
                    n_out = 0
                    while True:
                        d: Delta = await ticket.queue.get()
                        if d.error is not None:
                            yield _sse(d.error.body())
                            state["done"] = True
                            break
                        n_out += len(d.token_ids)
                        if d.token_ids or d.text or d.finish_reason:
                            yield _sse(chunk(d.text, d.token_ids if return_ids else None,
                                             finish_reason(d.finish_reason)))
                        if d.finish_reason is not None:
                            state["done"] = True
                            if include_usage:
                                yield _sse(final(n_prompt, n_out))
                            break
                    yield "data: [DONE]\n\n"
                finally:
                    cleanup()

            return StreamingResponse(events(), media_type="text/event-stream",
                                     background=BackgroundTask(cleanup))
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
                    state["done"] = True
                    return _error_response(d.error)
                text.append(d.text)
                tokens.extend(d.token_ids)
                if d.finish_reason is not None:
                    state["done"] = True
                    return JSONResponse(final(n_prompt, len(tokens), "".join(text), tokens,
                                              finish_reason(d.finish_reason),
                                              accepted.prompt_token_ids if return_ids else None))
        finally:
            cleanup()

    # the students' page and its ask route (engine/server/student.py)
    from engine.server.student import student_router

    app.include_router(student_router(loop, admit, release))

    # the class's votes and pre/post test (engine/server/votes_router.py)
    from engine.server.votes_router import votes_router

    votes = votes_router()
    app.state.votes = votes.classroom
    app.include_router(votes)

    # --- routes -----------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": settings.model_name, "object": "model", "created": now(),
            "owned_by": "servelab", "max_model_len": engine.config.max_model_len}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "prompt: this server takes one prompt per request",
                               param="prompt")
            prompt = prompt[0]
        max_tokens = body.max_tokens if body.max_tokens is not None else min(16, cap)
        params = sampling(body, max_tokens)
        ticket = new_ticket("cmpl", body, request, params, max_tokens, prompt=prompt)
        accepted = await admit(ticket)
        rid, created = ticket.request_id, now()  # the id the step stream shows

        def chunk(text, token_ids, reason, first=False):
            if first:
                return None
            c = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            if token_ids is not None:
                c["token_ids"] = token_ids
            return {"id": rid, "object": "text_completion", "created": created,
                    "model": settings.model_name, "choices": [c]}

        def final(n_prompt, n_out, text=None, tokens=None, reason=None, prompt_ids=None):
            out = {"id": rid, "object": "text_completion", "created": created,
                   "model": settings.model_name, "choices": [], "usage": usage(n_prompt, n_out)}
            if text is not None:
                c = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
                if prompt_ids is not None:
                    c["prompt_token_ids"], c["token_ids"] = prompt_ids, tokens
                out["choices"] = [c]
            return out

        return await run(ticket, request, chunk, final, body.stream, body.include_usage,
                         body.return_token_ids, accepted)

    @app.post("/v1/chat/completions")
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
        params = sampling(body, max_tokens)
        ticket = new_ticket("chatcmpl", body, request, params, max_tokens, messages=messages)
        accepted = await admit(ticket)
        rid, created = ticket.request_id, now()

        def chunk(text, token_ids, reason, first=False):
            delta = {"role": "assistant", "content": ""} if first else (
                {"content": text} if text or token_ids else {})
            c = {"index": 0, "delta": delta, "logprobs": None,
                 "finish_reason": None if first else reason}
            if token_ids is not None:
                c["token_ids"] = token_ids
            return {"id": rid, "object": "chat.completion.chunk", "created": created,
                    "model": settings.model_name, "choices": [c]}

        def final(n_prompt, n_out, text=None, tokens=None, reason=None, prompt_ids=None):
            out = {"id": rid, "object": "chat.completion" if text is not None else
                   "chat.completion.chunk", "created": created, "model": settings.model_name,
                   "choices": [], "usage": usage(n_prompt, n_out)}
            if text is not None:
                c = {"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": None, "finish_reason": reason}
                if prompt_ids is not None:
                    c["prompt_token_ids"], c["token_ids"] = prompt_ids, tokens
                out["choices"] = [c]
            return out

        return await run(ticket, request, chunk, final, body.stream, body.include_usage,
                         body.return_token_ids, accepted)

    @app.get("/v1/servelab/config")
    async def engine_config():
        """The engine's configuration (what `python -m engine.load --compare-offline` reruns)."""
        return dataclasses.asdict(engine.config)

    @app.get("/v1/servelab/steps")
    async def steps(request: Request, limit: int = 0):
        """Server-sent events: one JSON object per engine step (newest first if behind)."""
        if limit < 0:
            raise APIError(400, "limit must be >= 0 (0: no limit)", param="limit")
        # subscribe now, so a viewer that has its headers sees every step from here on
        key, ev = loop.hub.subscribe(asyncio.get_running_loop())

        async def events():
            sent, last = 0, None
            try:
                while not limit or sent < limit:
                    try:
                        await asyncio.wait_for(ev.wait(), 15.0)
                    except asyncio.TimeoutError:
                        yield ": idle\n\n"  # keep-alive comment while the engine has no work
                        continue
                    ev.clear()
                    latest = loop.hub.latest
                    if latest is None or latest[0] == last:
                        continue
                    last = latest[0]
                    yield f"data: {latest[1]}\n\n"
                    sent += 1
            finally:
                loop.hub.unsubscribe(key)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 background=BackgroundTask(loop.hub.unsubscribe, key))

    return app
