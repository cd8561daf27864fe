"""Every error leaves as OpenAI's error body with its status, never a traceback.

`add_error_handlers(app, metrics)`: an `APIError` a route raised (its own status; counted as
a rejection), pydantic's validation error (400, `param` naming the field as OpenAI does:
`messages.0.content`, not pydantic's union tags), Starlette's 404/405 (the path or method
named), anything else (500 naming only the exception's type).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from engine.server.metrics import ServerMetrics
from engine.server.protocol import APIError, error_body

_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request, err: APIError):
        metrics.on_reject(err.status)
        return error_response(err)

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
