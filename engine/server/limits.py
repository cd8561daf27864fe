"""The API key and the body size, checked before any route runs or any body is parsed.

A pure ASGI middleware (`create_app` adds it to every route). 421 for a `Host` header that
is a name this server was not told it has (`host_allowed`: DNS rebinding). 401 for a missing
or wrong key, compared in constant time: every route but the open paths (`OPEN_PATHS`, and
those the mounted routers name, such as the students' page) needs `api_key` when
one is set, and `/metrics` and `/v1/servelab/...` need `admin_key` instead when that is set
(the teacher's views: no student with the join code reads the others' answers); the admin
key opens every route. The role it found (teacher, student, owner) is left in the scope as
`servelab_role` for the routes' limits (`ServerState.client_of`). 413 for a body over
`max_body_bytes`, whether it declares its length or arrives chunked; 408 for a body that
has not all arrived within `body_timeout_s`. Each refusal is OpenAI's error body and counts
in the metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import time

from engine.server.metrics import ServerMetrics
from engine.server.protocol import APIError
from engine.server.state import OWNER, STUDENT, TEACHER, ServerSettings

OPEN_PATHS = ("/health",)  # no key: the health check (and the open paths the routers add)


class Limits:
    """Pure ASGI middleware: the API key and the body size, before any body is parsed."""

    def __init__(self, app, settings: ServerSettings, metrics: ServerMetrics,
                 open_paths: tuple[str, ...] = OPEN_PATHS):
        self.app, self.settings, self.metrics = app, settings, metrics
        self.open_paths = open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        s = self.settings
        path = scope["path"]
        headers = dict(scope["headers"])
        host = headers.get(b"host", b"").decode("latin-1")
        if not host_allowed(host, s):
            # DNS rebinding: a page from elsewhere reaching this server under a name of its own
            return await self._refuse(send, APIError(
                421, f"this server does not answer to the host name {host[:80]!r} (it answers "
                     f"to its addresses, localhost and --allowed-hosts)",
                code="host_not_allowed"))
        admin_path = path == "/metrics" or path.startswith("/v1/servelab/")
        auth = headers.get(b"authorization", b"").decode("latin-1")
        given = (auth[7:] if auth[:7].lower() == "bearer " else "").encode("utf-8", "replace")
        # who is asking: the teacher (admin key), a student (the join code), or, without a
        # join code, the server's owner; routes read it as scope["servelab_role"]
        if s.admin_key is not None and hmac.compare_digest(given, s.admin_key.encode()):
            role = TEACHER
        elif s.api_key is not None:
            role = STUDENT
        else:
            role = OWNER
        key = s.admin_key if s.admin_key is not None and admin_path else s.api_key
        if key is not None and path not in self.open_paths and role != TEACHER and not \
                hmac.compare_digest(given, key.encode()):
            whose = "the teacher's admin key" if key is s.admin_key else "the class's join code"
            return await self._refuse(send, APIError(
                401, f"missing or wrong API key: send 'Authorization: Bearer <key>' ({whose})",
                "authentication_error", code="invalid_api_key"))
        scope["servelab_role"] = role
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
        # a chunked body has no length up front: count as it arrives; and a body that
        # arrives too slowly holds a connection: `body_timeout_s` for all of it. FastAPI
        # turns any error raised while it reads the body into its own 400, so the refusal
        # is remembered here and the app's answer is replaced by it on its way out.
        seen, refusal, refused, body_done = 0, None, False, False
        deadline = None

        async def counted_receive():
            nonlocal seen, refusal, body_done, deadline
            if body_done:  # what comes now is the client leaving: no deadline on that
                return await receive()
            if deadline is None:
                deadline = time.monotonic() + s.body_timeout_s
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                refusal = APIError(408, f"the request body did not arrive within "
                                        f"{s.body_timeout_s:g} s", code="body_timeout")
                raise _Refused from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > s.max_body_bytes:
                    refusal = too_big
                    raise _Refused
                body_done = not msg.get("more_body", False)
            else:
                body_done = True
            return msg

        async def checked_send(msg):
            nonlocal refused
            if refusal is None:
                return await send(msg)
            if not refused:
                refused = True
                await self._refuse(send, refusal)

        try:
            await self.app(scope, counted_receive, checked_send)
        except _Refused:
            if not refused:
                refused = True
                await self._refuse(send, refusal)

    async def _refuse(self, send, err: APIError) -> None:
        self.metrics.on_reject(err.status)
        body = json.dumps(err.body()).encode()
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def host_allowed(host: str, s: ServerSettings) -> bool:
    """The Host header names this server: an IP address (no DNS involved, so no rebinding),
    localhost, the bind address, or a name in `allowed_hosts`. No Host (HTTP/1.0): allowed."""
    if not host:
        return True
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name == (s.bind_host or "").lower() or "*" in s.allowed_hosts or name in [
        h.lower() for h in s.allowed_hosts]


class _Refused(Exception):
    """The body broke a limit (size, time); the refusal is sent instead of the app's answer."""
