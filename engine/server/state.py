"""What every router shares: the settings, the stepping loop, the metrics and the admission.

`ServerState` is built once per app (`create_app`) and handed to each router's factory; no
router keeps a closure over another's variables. Admission is here because every route that
runs a request (the two OpenAI endpoints, the students' `/class/ask`) counts against the same
places: `max_queue` requests in the server at once, `max_requests_per_user` per client.
`admit` reserves a place and waits for the loop's answer; the `Lease` it leads to gives the
place back exactly once, and aborts the request in the loop if it had not ended there (the
client went away: its seat and blocks are freed at the next step).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from engine.server.loop import Delta, EngineLoop, Ticket
from engine.server.metrics import ServerMetrics
from engine.server.protocol import APIError


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
    # False: no step stream (as a vLLM or SGLang deployment has none); the teacher's views
    # then read /metrics only
    step_stream: bool = True


class ServerState:
    """One app's shared state. `inflight` is touched on the event loop thread only."""

    def __init__(self, engine, settings: ServerSettings):
        self.engine, self.settings = engine, settings
        self.metrics = ServerMetrics(settings.model_name)
        self.loop = EngineLoop(engine, self.metrics, settings.max_tokens_cap)
        self.inflight: Counter[str] = Counter()  # client -> requests in the server

    @property
    def max_tokens_cap(self) -> int:
        return self.loop.max_tokens_cap

    async def admit(self, ticket: Ticket) -> Delta:
        """Reserve a place for this client, hand the ticket to the loop, wait for its answer
        (the first Delta: accepted, or the loop's 400). The caller then holds the place until
        `release` (or `lease(...).close()`)."""
        s = self.settings
        if sum(self.inflight.values()) >= s.max_queue:
            raise APIError(429, f"the server is full ({s.max_queue} requests in it); "
                                f"try again shortly", "rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})
        if self.inflight[ticket.user] >= s.max_requests_per_user:
            raise APIError(429, f"client {ticket.user!r} already has "
                                f"{s.max_requests_per_user} requests running",
                           "rate_limit_error", code="too_many_requests_per_user",
                           headers={"Retry-After": "1"})
        self.inflight[ticket.user] += 1
        self.loop.submit(ticket)
        try:
            first: Delta = await ticket.queue.get()
        except BaseException:  # cancelled while waiting (shutdown): give the place back
            self.release(ticket)
            self.loop.abort(ticket.request_id)
            raise
        if first.error is not None:
            self.release(ticket)
            raise first.error
        return first

    def release(self, ticket: Ticket) -> None:
        self.inflight[ticket.user] -= 1
        if self.inflight[ticket.user] <= 0:
            del self.inflight[ticket.user]

    def lease(self, ticket: Ticket, on_release: Callable[[], None] | None = None) -> Lease:
        """The admitted ticket's hold on the server, closed once its response is over."""
        return Lease(self, ticket, on_release)


class Lease:
    """An admitted request's place. The handler sets `done` once the loop ended the request
    (finished or errored); `close()` may run twice (the response's generator and its
    background task) and acts once: abort if not done, give the place back, `on_release`."""

    def __init__(self, state: ServerState, ticket: Ticket,
                 on_release: Callable[[], None] | None = None):
        self.state, self.ticket, self.on_release = state, ticket, on_release
        self.done = self.released = False

    def close(self) -> None:
        if not self.done:
            self.state.loop.abort(self.ticket.request_id)  # the client left: free its seat now
            self.done = True
        if not self.released:
            self.released = True
            self.state.release(self.ticket)
            if self.on_release is not None:
                self.on_release()
