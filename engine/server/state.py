"""What every router shares: the settings, the stepping loop, the metrics and the admission.

`ServerState` is built once per app (`create_app`) and handed to each router's factory; no
router keeps a closure over another's variables. Admission is here because every route that
runs a request (the two OpenAI endpoints, the students' `/class/ask`) counts against the same
places: `max_queue` requests in the server at once, and, when asked for, a cap per client.
`admit` reserves a place, tokenizes the prompt off the stepping thread (`prompt_ids`: a
worker thread with its own copy of the tokenizer; a prompt over the model's length is
refused here), hands the ticket to the loop and waits for its answer; the `Lease` it leads
to gives the place back exactly once, and aborts the request in the loop if it had not ended
there (the client went away: its seat and blocks are freed at the next step).

Who is asking (`client_of`), so limits fit them:
- No join code (loopback, the default): one person's own server. Requests queue as in vLLM;
  no per-client cap unless `max_requests_per_user` is set, and then per address.
- Class mode (a join code, `api_key`, is set): a student cannot mint identities at will, so
  limits are keyed by the address and, from the students' page, by a phone token the server
  signed for that address when the page joined (`phone_token`; HMAC with a secret made at
  start, or the class's own, kept in its record, which the class server hands over). A `user` name or a nickname is a label, never a key. `max_requests_per_user` caps
  each phone (or each address without a token), `max_requests_per_address` each address.
  The teacher (the admin key) has no per-client cap, and is the only one who may name users
  `sim-*` (the projector draws those as simulated riders) or ask more than
  `student_max_tokens`.
- `X-Forwarded-For` is believed only from the addresses in `forwarded_allow_ips` (as
  uvicorn's flag of that name): anyone else could write any address there.

Stop strings are capped here (`MAX_STOPS`, `MAX_STOP_CHARS`, OpenAI allows at most four) so
that no request makes the stepping thread match long strings against every token.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import copy
import hashlib
import hmac
import ipaddress
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.server.loop import SIMULATED_PREFIX, Delta, EngineLoop, Ticket
from engine.server.metrics import ServerMetrics
from engine.server.protocol import APIError


@dataclass
class ServerSettings:
    """The server's limits (flags of `python -m engine.serve`), with safe defaults."""

    model_name: str = "smollm2-135m"  # the one name `model` may take
    api_key: str | None = None  # None: no key needed (only ever on 127.0.0.1)
    max_queue: int = 1024  # requests in the server at once (running + waiting); then 429
    max_requests_per_user: int | None = None  # per client (see client_of); None: no cap
    max_requests_per_address: int | None = None  # class mode: all of one address's phones
    max_tokens_cap: int | None = None  # largest max_tokens a request may ask (None: model len)
    max_body_bytes: int = 1 << 20  # 1 MiB; then 413
    body_timeout_s: float = 30.0  # the whole body must arrive within this; then 408
    # the teacher's key: when set, the step stream, /metrics and the other /v1/servelab/ views
    # need it instead of `api_key` (the join code every student has), so no student can read
    # the others' answers off the step stream
    admin_key: str | None = None
    # class mode: the largest max_tokens a student (the join code) may ask; more, `sim-*`
    # user names and ignore_eos are the teacher's (the admin key)
    student_max_tokens: int = 256
    # peers whose X-Forwarded-For is believed (a reverse proxy's address); empty: nobody's
    forwarded_allow_ips: list[str] = field(default_factory=list)
    # host names the students' page answers to besides loopback and the bind address
    # (DNS rebinding: a page a student opens must not reach this server under its own name)
    allowed_hosts: list[str] = field(default_factory=list)
    bind_host: str | None = None
    # False: no step stream (as a vLLM or SGLang deployment has none); the teacher's views
    # then read /metrics only
    step_stream: bool = True

    @property
    def class_mode(self) -> bool:
        return self.api_key is not None


MAX_STOPS = 4  # as OpenAI
MAX_STOP_CHARS = 256  # each stop string

TEACHER, STUDENT, OWNER = "teacher", "student", "owner"  # who is asking (`client_of`)
PHONE_HEADER = "x-servelab-phone"


@dataclass(frozen=True)
class Client:
    key: str  # what limits count by
    address: str
    role: str  # TEACHER, STUDENT (class mode, the join code) or OWNER (no join code)


def _in_list(host: str, allowed: list[str]) -> bool:
    if "*" in allowed:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host in allowed
    for a in allowed:
        try:
            if ip in ipaddress.ip_network(a, strict=False):
                return True
        except ValueError:
            continue
    return False


class ServerState:
    """One app's shared state. `inflight` is touched on the event loop thread only."""

    def __init__(self, engine, settings: ServerSettings, engine_factory=None):
        self.settings = settings
        self.metrics = ServerMetrics(settings.model_name)
        self.loop = EngineLoop(engine, self.metrics, settings.max_tokens_cap,
                               factory=engine_factory)
        self.inflight: Counter[str] = Counter()  # client key -> requests in the server
        self.inflight_addr: Counter[str] = Counter()  # address -> requests in the server
        self.draining = False  # set once shutdown begins: no new requests, viewers end
        # the handlers' tokenizer: a copy, on one worker thread, so the stepping thread's
        # (its detokenizers) is never used by two threads at once
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self._tokenize_pool = concurrent.futures.ThreadPoolExecutor(1, "tokenize")
        # signs phone tokens: new at every start, unless whoever mounts the routes keeps one
        # (the class server hands over its class's, so a restart accepts the same tokens)
        self.phone_secret = secrets.token_bytes(32)

    # --- who is asking ----------------------------------------------------------------------
    def address_of(self, request) -> str:
        peer = request.client.host if request.client else "unknown"
        allowed = self.settings.forwarded_allow_ips
        fwd = request.headers.get("x-forwarded-for")
        if not fwd or not allowed or not _in_list(peer, allowed):
            return peer
        # the nearest hop not one of the trusted proxies (uvicorn's rule)
        hops = [h.strip() for h in fwd.split(",") if h.strip()]
        for hop in reversed(hops):
            if not _in_list(hop, allowed):
                return hop
        return hops[0] if hops else peer

    def role_of(self, request) -> str:
        return request.scope.get("servelab_role") or (STUDENT if self.settings.class_mode
                                                      else OWNER)

    def phone_token(self, address: str) -> str:
        """A token for one phone at one address: random id + HMAC(secret, id, address)."""
        pid = secrets.token_urlsafe(12)
        return f"{pid}.{self._sign(pid, address)}"

    def _sign(self, pid: str, address: str) -> str:
        mac = hmac.new(self.phone_secret, f"{pid}|{address}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:18]).decode()

    def phone_of(self, request, address: str) -> str | None:
        """The phone id of a valid token sent from the address it was issued to, else None."""
        token = request.headers.get(PHONE_HEADER, "")
        pid, _, mac = token.partition(".")
        if not pid or not mac or len(token) > 128:
            return None
        return pid if hmac.compare_digest(mac, self._sign(pid, address)) else None

    def client_of(self, request) -> Client:
        address, role = self.address_of(request), self.role_of(request)
        if role == STUDENT and (phone := self.phone_of(request, address)) is not None:
            return Client(f"phone:{phone}@{address}", address, role)
        return Client(f"addr:{address}", address, role)

    def check_teacher_only(self, client: Client, user: str | None, max_tokens: int | None,
                           ignore_eos: bool) -> None:
        """Class mode: what only the teacher's key may ask (403 naming it)."""
        if client.role != STUDENT:
            return
        s = self.settings
        if user and user.lower().startswith(SIMULATED_PREFIX):
            raise APIError(403, f"user names starting with {SIMULATED_PREFIX!r} are the "
                                f"teacher's simulated riders (send the admin key)",
                           "permission_error", param="user", code="teacher_only")
        if max_tokens is not None and max_tokens > s.student_max_tokens:
            raise APIError(403, f"max_tokens={max_tokens}: with the join code at most "
                                f"{s.student_max_tokens} (more needs the teacher's admin key)",
                           "permission_error", param="max_tokens", code="teacher_only")
        if ignore_eos:
            raise APIError(403, "ignore_eos is the teacher's (send the admin key)",
                           "permission_error", param="ignore_eos", code="teacher_only")

    # --- the prompt, off the stepping thread --------------------------------------------------
    def _tokenize(self, prompt, messages) -> list[int]:
        tok = self.tokenizer
        if messages is not None:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty")
            return tok.encode(prompt, add_special_tokens=False)
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise ValueError("prompt must be non-empty text or a non-empty list of token ids")
        vocab = self.engine.model_config.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        return list(prompt)

    async def prompt_ids(self, ticket: Ticket) -> list[int]:
        """The ticket's prompt as token ids, computed on the tokenizer's worker thread (the
        Rust tokenizer lets go of the GIL while it works), or the 400 naming what is wrong."""
        aloop = asyncio.get_running_loop()
        try:
            ids = await aloop.run_in_executor(self._tokenize_pool, self._tokenize,
                                              ticket.prompt, ticket.messages)
        except ValueError as exc:
            raise APIError(400, str(exc), param="prompt") from None
        except Exception as exc:  # e.g. a chat template that rejects the messages
            raise APIError(400, f"cannot read the prompt: {exc}", param="messages") from None
        max_len = self.engine.config.max_model_len
        if len(ids) >= max_len:
            raise APIError(400, f"the prompt is {len(ids)} tokens; this server's max_model_len "
                                f"is {max_len}, so a prompt may have at most {max_len - 1}",
                           param="prompt", code="context_length_exceeded")
        return ids

    @staticmethod
    def check_stops(stop: list[str] | None) -> None:
        if not stop:
            return
        if len(stop) > MAX_STOPS:
            raise APIError(400, f"stop: {len(stop)} stop strings; at most {MAX_STOPS}",
                           param="stop")
        for s in stop:
            if len(s) > MAX_STOP_CHARS:
                raise APIError(400, f"stop: a stop string of {len(s)} characters; each may have "
                                    f"at most {MAX_STOP_CHARS}", param="stop")

    @property
    def engine(self):
        """The engine now: a switch change (`EngineLoop.swap`) replaces it in the loop."""
        return self.loop.engine

    @property
    def max_tokens_cap(self) -> int:
        return self.loop.max_tokens_cap

    async def admit(self, ticket: Ticket) -> Delta:
        """Reserve a place for this client, hand the ticket to the loop, wait for its answer
        (the first Delta: accepted, or the loop's 400). The caller then holds the place until
        `release` (or `lease(...).close()`)."""
        s = self.settings
        if self.draining:
            raise APIError(503, "the server is shutting down", "server_error",
                           code="shutting_down")
        self.check_stops(ticket.params.stop)
        if sum(self.inflight.values()) >= s.max_queue:
            raise APIError(429, f"the server is full ({s.max_queue} requests in it); "
                                f"try again shortly", "rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})
        client = ticket.client or Client(f"user:{ticket.user}", ticket.user, OWNER)
        ticket.client = client
        if client.role != TEACHER:
            cap = s.max_requests_per_user
            if cap is not None and self.inflight[client.key] >= cap:
                who = ("this phone" if client.key.startswith("phone:")
                       else f"address {client.address}")
                raise APIError(429, f"{who} already has {cap} requests running (user "
                                    f"names do not count as other clients)",
                               "rate_limit_error", code="too_many_requests_per_user",
                               headers={"Retry-After": "1"})
            cap = s.max_requests_per_address
            if cap is not None and self.inflight_addr[client.address] >= cap:
                raise APIError(429, f"address {client.address} already has {cap} requests "
                                    f"running", "rate_limit_error",
                               code="too_many_requests_per_address",
                               headers={"Retry-After": "1"})
        self.inflight[client.key] += 1
        if client.role != TEACHER:  # the teacher's (simulated) users share no student's cap
            self.inflight_addr[client.address] += 1
        try:
            if ticket.prompt_ids is None:
                ticket.prompt_ids = await self.prompt_ids(ticket)
        except BaseException:
            self.release(ticket)
            raise
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
        c = ticket.client
        counted = [(self.inflight, c.key)]
        if c.role != TEACHER:
            counted.append((self.inflight_addr, c.address))
        for counter, key in counted:
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]

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
