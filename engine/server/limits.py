"""The API key and the body size, checked before any route runs or any body is parsed.

A pure ASGI middleware (`create_app` adds it to every route). 401 for a missing or wrong
key, compared in constant time: every route but `OPEN_PATHS` needs `api_key` when one is set,
and `/metrics` and `/v1/servelab/...` need `admin_key` instead when that is set (the teacher's
views: no student with the join code reads the others' answers). 413 for a body over
`max_body_bytes`, whether it declares its length or arrives chunked. Each refusal is OpenAI's
error body and counts in the metrics.
"""

from __future__ import annotations

import hmac
import json

from engine.server.metrics import ServerMetrics
from engine.server.protocol import APIError
from engine.server.state import ServerSettings

OPEN_PATHS = ("/health", "/class")  # no key: the health check and the students' empty page


class Limits:
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
