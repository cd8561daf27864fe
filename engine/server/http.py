"""The HTTP server around the app: uvicorn, with bounds on slow clients and on shutdown.

uvicorn bounds the idle time between two requests on a connection (`timeout_keep_alive`)
but not the time a client takes to send its request's headers: a client that opens
connections and sends a header byte now and then holds each one forever, and enough of them
exhaust the process's file descriptors and lock everyone out. `BoundedH11Protocol` closes a
connection whose request headers are not complete within `header_timeout_s` of the
connection (or of the previous response's end). The body is bounded by the limits
middleware (`limits.py`: `body_timeout_s`, then 408).

`ServeLabServer` (uvicorn's `Server`) drains on Ctrl-C or SIGTERM: new requests get 503,
the step-stream viewers' streams end at once (they would otherwise never end), the log says
which requests it waits for, and after `shutdown_timeout_s` the rest are cancelled (their
requests aborted in the engine) and the stepping loop stops.
"""

from __future__ import annotations

import logging

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("servelab.server")

HEADER_TIMEOUT_S = 10.0  # a request's headers must be complete within this
KEEP_ALIVE_S = 5.0  # uvicorn's default: idle time between requests on one connection
SHUTDOWN_TIMEOUT_S = 10.0  # Ctrl-C: how long answers in progress may go on


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline on each request's headers."""

    header_timeout_s = HEADER_TIMEOUT_S

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._headers_of = None  # the cycle whose headers arrived last
        self._header_timer = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        if self.cycle is self._headers_of and not self.transport.is_closing():
            # no new request's headers since the timer started: close the connection
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and self.cycle is not self._headers_of:
            self._headers_of = self.cycle  # a request's headers are complete
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection has the same deadline

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


class ServeLabServer(uvicorn.Server):
    """uvicorn's server with a draining shutdown that says what it waits for."""

    async def shutdown(self, sockets=None) -> None:
        state = getattr(self.config.app.state, "server", None) if hasattr(
            self.config.app, "state") else None
        if state is not None:
            state.draining = True  # new requests: 503
            state.loop.hub.close()  # the step streams end now
            waiting = sorted(state.loop.tickets)
            if waiting:
                log.warning("shutting down: waiting up to %.0f s for %d request(s) in the "
                            "engine: %s", self.config.timeout_graceful_shutdown or 0,
                            len(waiting), ", ".join(waiting[:20]))
            else:
                log.warning("shutting down: no request in the engine")
        await super().shutdown(sockets)


def make_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning",
                header_timeout_s: float = HEADER_TIMEOUT_S,
                keep_alive_s: float = KEEP_ALIVE_S,
                shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S,
                forwarded_allow_ips: list[str] | None = None) -> ServeLabServer:
    """The uvicorn server `python -m engine.serve` runs (tests run the same one)."""
    protocol = type("Protocol", (BoundedH11Protocol,), {"header_timeout_s": header_timeout_s})
    # X-Forwarded-For is read by ServerState.address_of from the configured peers only;
    # uvicorn's own proxy-header rewriting stays off so the peer address stays the peer's
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            http=protocol, timeout_keep_alive=keep_alive_s,
                            timeout_graceful_shutdown=shutdown_timeout_s,
                            proxy_headers=False,
                            h11_max_incomplete_event_size=64 * 1024)
    return ServeLabServer(config)
