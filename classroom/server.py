"""The students' page: what the classroom's QR code opens, served by the class server itself.

Chapter 6.4's point, one server for many people, made with the class as the many people:
each student opens `GET /class` on a phone, types a nickname and a question, and the answer
streams back from the same engine the projector draws, with the student's own TTFT, tokens/s
and where the request sat ("seat 5, 3 blocks").

Why a page the server serves and not a Streamlit page: a Streamlit session is a Python
object graph and a websocket per phone inside the teacher's app process, rerunning a script
for every widget event; this page is one static HTML file (a few KB, no framework) and one
HTTP request per question. docs/performance.md ("The class server") has the measured costs.

Why it is a router of its own, outside the engine's package: it is the class's concern, not
OpenAI's, so whoever starts the class server (`python -m classroom.serve`) hands it to
`create_app(routers=...)` (`routers(lessons)` here), and it reaches the server only through
`ServerState` (`admit`, `lease`: the server's queue and per-user limits apply to students
too, and a student who leaves frees the seat like any client). The engine never imports it.

Routes (`router(state, lessons)`):
- `GET /class`: the page (`classroom/page.py`: static files). It holds no data, so it needs
  no key (the router names it in `open_paths`); the join code comes from the QR code's URL
  fragment (`#code=...`, never sent to the server in a URL) or is typed in.
- `POST /class/ask` (JSON `{"nickname", "question", "phone"}`, `Authorization: Bearer <join
  code>`, checked by the app's middleware like every API route): server-sent events for this
  one request only, each numbered `i`: `accepted` (its id, its question, the engine's
  generation), `journey` (its own slice of each step that changed it: at the door with its
  place and the reasons it waited, or its seat, boarding step and wait, its page table
  growing, the count of its blocks shared with others, its drafts' verdicts), `seat`, `delta`
  (answer text with the step it came from), `done` (token count, the server's TTFT and where
  that falls among the class's, as a percentile only, and `timeline`: its own life stretch
  by stretch, engine/waits.py `Timeline`: queued with the codes of each stretch of waiting,
  prefill (its chunks), decode, preempted with the rule and the tokens to redo, each with
  its steps and its ms since it arrived; the page draws it after the answer on a 1-2-5 ms
  axis, so two neighbours' phones compare) or `error` (`code` "engine_restarting" when the
  teacher changed a switch: the page asks again by itself). A student never receives
  another request's text, nickname or timing (the timeline's waits lose whom they waited
  behind or were preempted for).
- `GET /class/answer/{id}?start=N` (join code, `X-Phone-Secret`): the same answer's events
  from N. The answer runs on whether or not a phone is attached (kept `keep_answers_s` after
  it ends, aborted if nobody reads it for `detached_grace_s`), so a reload reattaches.
- `GET /v1/servelab/class/questions`: recent questions by request id, for the teacher's
  "show questions on screen" (under /v1/servelab/, so the teacher's admin key guards it).
- `GET /v1/servelab/class/timeline/{id}`: a kept student's request's timeline (the `done`
  event's, or so far while it runs), for the projector's click on a nickname (admin key).
- `GET /v1/servelab/class/trace`: the class server's recent steps (`RecentSteps`, a sink of
  the stepping loop, bounded in steps and in the requests they name) as a Chrome trace
  (engine/trace.py), the Classroom page's download (admin key).

- `POST /class/token` (the join code): `{"phone": <token>}`, a token the server signs for
  this phone at this address (`ServerState.phone_token`) with the class's secret, kept in its
  record, so a class server restarted on the same class accepts it; the page sends it back
  with each question as `X-ServeLab-Phone`.

Everything from a student is untrusted: nickname and question are length-limited with a clear
400; a question's control characters are refused; a nickname loses its control, bidi-override
(U+202A-202E, U+2066-2069) and zero-width (U+200B-200F, U+FEFF) characters, so no name can
turn the projector's text around or hide as another's; the page writes every string with
`textContent` (never innerHTML); the teacher's page escapes them with `html.escape`. Rate
limits per phone (its token and address; without a token, the address): one question in
flight and `min_interval_s` between questions (counted from the end of the last answer the
student received; an answer cut by a switch change does not count), answered with 429 and
`Retry-After`, whose error carries `wait`: the phone's own limit as a wait reason of its own
(`OWN_WAIT_CODES`: `own_in_flight`; `own_pause` with `seconds_left` and `interval_s`), apart
from the engine's codes, which the page says in its language with a countdown, putting the
last answer back on screen. Every refusal on these routes speaks the phone's language
(`?lang=zh|en`, which the page sends, else Accept-Language, as the votes pick it): the texts
are `REFUSALS`, zh and en; an en phone reads the same English as before. A nickname is a
label: a new nickname is not a new student. The page's Content-Security-Policy allows only its own script and style, by a nonce
made for each response, and no framing (`frame-ancestors 'none'`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import re
import secrets
import time
import unicodedata
from collections import OrderedDict, deque
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from classroom.page import PAGE
from classroom.vote_routes import votes_router
from classroom.votes import FLOOD_VOTES, FLOOD_WINDOW_S, Classroom, Lessons, pick_lang
from engine.config import SamplingParams
from engine.server.app import RouterFactory
from engine.server.loop import SIMULATED_PREFIX, Delta, Ticket
from engine.server.protocol import APIError
from engine.server.state import ServerState
from engine.trace import RecentSteps

PAGE_PATH = "/class"  # served without a key (it holds no data): the router's `open_paths`


@dataclass
class ClassLimits:
    """What one student may send (the class server's defaults; safe for a phone keyboard)."""

    max_nickname_chars: int = 32
    max_question_chars: int = 400
    max_tokens: int = 96  # answer length: short, so thirty students share the seats quickly
    min_interval_s: float = 3.0  # from one answer's end to the same student's next question
    max_recent_questions: int = 256  # what the teacher's "show questions" keeps
    keep_answers_s: float = 600.0  # a finished answer stays for a reload this long
    max_kept_answers: int = 1024
    detached_grace_s: float = 20.0  # an answer nobody reads is aborted after this
    flood_votes: int = FLOOD_VOTES  # ballots one phone may send within flood_window_s
    flood_window_s: float = FLOOD_WINDOW_S


class AskBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    nickname: str
    question: str
    phone: str | None = None  # the page's own random secret: what a reload reattaches with


# Every refusal a phone gets from the ask/answer routes, in zh and en: the English text is what
# clients and tests have always read; a Chinese phone (`?lang=zh`, else Accept-Language, as the
# votes pick it) gets the zh one with the same numbers. `{zname}` is the field's Chinese name.
REFUSALS = {
    "empty": ("{zname}是空的：请输入{zname}。", "{name} is empty: type one"),
    "too_long": ("{zname}有 {n} 个字符，最多只能有 {limit} 个。",
                 "{name} is {n} characters; at most {limit}"),
    "control": ("{zname}含有控制字符：请删掉它。", "{name} holds a control character"),
    "simulated": ("以 {prefix!r} 开头的昵称留给模拟用户：请换一个。",
                  "nicknames starting with {prefix!r} are kept for simulated users; "
                  "choose another"),
    "phone": ("页面的手机密钥必须是 16 到 128 个字符：请刷新页面。",
              "phone must be 16 to 128 characters (the page's own secret)"),
    "one_question_at_a_time": ("你的上一个问题还在回答中：请等它答完。",
                               "your previous question is still being answered; wait for it"),
    "too_many_questions": ("每个回答结束后 {interval} 秒内只能再问一个问题：请 {wait} 秒后再试。",
                           "one question per {interval} s after an answer: try again in "
                           "{wait} s"),
    "answer_not_found": ("这部手机没有这个编号的回答（它可能已经过期）。",
                         "no answer with this id for this phone (it may have expired)"),
    "left": ("没有人在读这个回答。", "nobody was reading this answer"),
    # the server's own refusals at admission (engine/server/state.py), by their code: an en
    # phone keeps the server's text
    "queue_full": ("服务器已满（里面有 {n} 个请求）：请稍后再试。", None),
    "too_many_requests_per_user": ("这部手机已有 {n} 个请求在运行：请等它们结束。", None),
    "too_many_requests_per_address": ("你的网络地址已有 {n} 个请求在运行：请等它们结束。", None),
    "context_length_exceeded": ("问题有 {n} 个 token，太长了：这台服务器最多接受 {limit} 个。", None),
    "shutting_down": ("服务器正在关闭：请稍后再试。", None),
}
FIELDS_ZH = {"nickname": "昵称", "question": "问题"}

# The phone's own limits as wait reasons, apart from the engine's (engine/waits.py, which never
# imports the classroom): a 429 from `/class/ask` for one of these carries `error.wait` =
# {"code", ...}, and the page says it in its language (student.js `STR.own`).
#   own_in_flight  this phone's previous question is still being answered (one at a time)
#   own_pause      the pause after an answer (`min_interval_s`): seconds_left, interval_s
OWN_WAIT_CODES = ("own_in_flight", "own_pause")


def refusal_text(key: str, lang: str, **fields) -> str:
    """A refusal's message in `lang` ('zh' or 'en'), its fields filled."""
    zh, en = REFUSALS[key]
    text = zh if lang == "zh" or en is None else en
    return text.format(zname=FIELDS_ZH.get(fields.get("name", ""), ""), **fields)


def _localized(err: APIError, lang: str, state: ServerState) -> APIError:
    """The server's admission refusal `err` with its message in `lang` (the same status, type,
    param, code and headers); unknown codes and an en phone keep the server's text."""
    if lang != "zh" or err.code not in REFUSALS:
        return err
    s = state.settings
    nums = {"queue_full": {"n": s.max_queue},
            "too_many_requests_per_user": {"n": s.max_requests_per_user},
            "too_many_requests_per_address": {"n": s.max_requests_per_address}}.get(err.code, {})
    if err.code == "context_length_exceeded":
        found = re.findall(r"\d+", err.message)
        nums = {"n": found[0], "limit": found[-1]} if len(found) >= 2 else {"n": "?", "limit": "?"}
    return APIError(err.status, refusal_text(err.code, "zh", **nums), err.type, err.param,
                    err.code, err.headers)


def request_lang(request: Request) -> str:
    """The phone's language, as the votes pick it: `?lang=`, else Accept-Language."""
    return pick_lang(request.query_params.get("lang"), request.headers.get("accept-language"))


# what a nickname loses: bidi embeddings and overrides, bidi isolates, zero-width characters
# (and the BOM); control characters go too (category Cc)
_INVISIBLE = dict.fromkeys([*range(0x202A, 0x202F), *range(0x2066, 0x206A),
                            *range(0x200B, 0x2010), 0xFEFF, 0x2060])


def clean_nickname(value: str) -> str:
    """The nickname without control, bidi-control and zero-width characters."""
    value = value.translate(_INVISIBLE)
    return "".join(c for c in value if unicodedata.category(c) != "Cc")


def _clean(value: str, name: str, limit: int, lang: str = "en") -> str:
    """Strip; refuse empty, too long, or (a question's) control characters, in `lang`; a
    nickname's invisible characters are dropped first."""
    if name == "nickname":
        value = clean_nickname(value)
    value = value.strip()
    if not value:
        raise APIError(400, refusal_text("empty", lang, name=name), param=name)
    if len(value) > limit:
        raise APIError(400, refusal_text("too_long", lang, name=name, n=len(value), limit=limit),
                       param=name, code="too_long")
    allowed = "\n\t" if name == "question" else ""
    if any(unicodedata.category(c) == "Cc" and c not in allowed for c in value):
        raise APIError(400, refusal_text("control", lang, name=name), param=name)
    return value


class _Students:
    """Per-student rate limits and the recent questions (event loop thread only)."""

    def __init__(self, limits: ClassLimits):
        self.limits = limits
        self.in_flight: set[str] = set()
        self.last_ask: dict[str, float] = {}
        self.questions: OrderedDict[str, dict] = OrderedDict()

    def check(self, key: str, lang: str = "en") -> None:
        if key in self.in_flight:
            raise APIError(429, refusal_text("one_question_at_a_time", lang),
                           "rate_limit_error", code="one_question_at_a_time",
                           headers={"Retry-After": "1"},
                           extra={"wait": {"code": "own_in_flight"}})
        wait = self.limits.min_interval_s - (time.monotonic() - self.last_ask.get(key, -1e9))
        if wait > 0:
            raise APIError(429, refusal_text("too_many_questions", lang,
                                             interval=f"{self.limits.min_interval_s:g}",
                                             wait=f"{max(wait, 1):.0f}"), "rate_limit_error",
                           code="too_many_questions", headers={"Retry-After": f"{wait:.0f}"},
                           extra={"wait": {"code": "own_pause",
                                           "seconds_left": round(wait, 1),
                                           "interval_s": self.limits.min_interval_s}})

    def remember(self, request_id: str, nickname: str, question: str) -> None:
        self.questions[request_id] = {"nickname": nickname, "question": question}
        while len(self.questions) > self.limits.max_recent_questions:
            self.questions.popitem(last=False)


def seat_of(engine, request_id: str) -> dict | None:
    """Where a request sits now: seat index and KV blocks held (run on the loop thread)."""
    for i, r in enumerate(engine.scheduler.seats):
        if r is not None and r.request_id == request_id:
            return {"seat": i, "blocks": len(r.block_table)}
    return None


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "replace")).digest()


class Answer:
    """One student's answer as its events, kept after the phone's connection ends, so a
    reload reattaches (`GET /class/answer/{id}` with the phone's secret) and reads on from
    any event. Event loop thread only."""

    def __init__(self, request_id: str, phone: bytes | None):
        self.request_id, self.phone = request_id, phone
        self.events: list[dict] = []
        self.done = False
        self.changed = asyncio.Event()
        self.attached = 0
        self.detached_at = time.monotonic()
        self.ended_at: float | None = None
        self.task: asyncio.Task | None = None  # the pump: held here so it is not collected
        self.timeline = None  # its Timeline (engine/waits.py), which the loop builds

    def add(self, event: dict) -> None:
        self.events.append(event)
        self.changed.set()
        self.changed = asyncio.Event()

    def end(self) -> None:
        self.done, self.ended_at = True, time.monotonic()
        self.changed.set()

    def owned_by(self, phone: str | None) -> bool:
        return self.phone is not None and phone is not None and \
            hmac.compare_digest(self.phone, _digest(phone))

    async def tail(self, start: int = 0):
        """Its events from `start`, then each new one until it ends (`i` numbers them)."""
        i = max(0, start)
        self.attached += 1
        try:
            while True:
                while i < len(self.events):
                    yield _event({**self.events[i], "i": i})
                    i += 1
                if self.done:
                    return
                await self.changed.wait()
        finally:
            self.attached -= 1
            self.detached_at = time.monotonic()


def _percentile(values, mine: float) -> float | None:
    """Where `mine` falls among the class's first-token times: the share (0-100) of them
    at or below it. Only this number reaches a phone, never another student's time."""
    values = list(values)
    if not values:
        return None
    return round(100.0 * sum(1 for v in values if v <= mine) / len(values), 1)


def routers(lessons: Lessons | None = None, limits: ClassLimits | None = None,
            classroom: Classroom | None = None) -> list[RouterFactory]:
    """What the class server hands `create_app(routers=...)`: the students' routes (with the
    votes), over `lessons` (default: the packaged `lessons`, `Lessons.load()`). `classroom`:
    the class the votes keep (`classroom/serve.py` loads it from its record on disk; default a
    new one, kept in memory only)."""
    lessons = lessons or Lessons.load()
    return [lambda state: router(state, lessons, limits, classroom)]


# request ids, unique in the process as the OpenAI routes' are: two class servers in one
# process (the tests reuse one engine, a switch flip keeps the process) never share one
_ids = itertools.count()


def router(state: ServerState, lessons: Lessons | None = None,
           limits: ClassLimits | None = None, classroom: Classroom | None = None) -> APIRouter:
    """The students' routes over the server's state (its loop, its admission), and the
    votes' over `lessons` (the course as data) and `classroom` (default: a new class)."""
    limits = limits or ClassLimits()
    loop = state.loop
    students = _Students(limits)
    answers: OrderedDict[str, Answer] = OrderedDict()
    ttfts: deque[float] = deque(maxlen=limits.max_recent_questions)  # the class's
    r = APIRouter()
    r.open_paths = (PAGE_PATH,)  # create_app lets these through without a key
    # the class's votes and pre/post test (vote_routes.py) ride on the same class server
    votes = votes_router(classroom, lessons=lessons, limits=limits)
    state.votes = votes.classroom
    # the phones' tokens are signed with the class's secret, kept in its record: a class
    # server restarted on the same class accepts every token it signed before
    state.phone_secret = votes.classroom.phone_secret
    r.include_router(votes)
    # the recent steps, for the teacher's trace download (a sink of the loop, as a recorder)
    recent = RecentSteps(name="python -m classroom.serve")
    state.loop.sinks.append(recent)

    def keep(ans: Answer) -> None:
        """Remember an answer for reloads: the newest `max_kept_answers`, ended ones for
        `keep_answers_s`."""
        answers[ans.request_id] = ans
        now = time.monotonic()
        for rid in [k for k, a in answers.items()
                    if a.ended_at is not None and now - a.ended_at > limits.keep_answers_s]:
            del answers[rid]
        while len(answers) > limits.max_kept_answers:
            answers.popitem(last=False)

    @r.get(PAGE_PATH, response_class=HTMLResponse)
    async def page():
        nonce = secrets.token_urlsafe(18)  # new for each response: no other script can run
        return HTMLResponse(PAGE.replace("{{NONCE}}", nonce), headers={
            # the page runs only its own script and style and talks only to this server
            "Content-Security-Policy": f"default-src 'none'; script-src 'nonce-{nonce}'; "
                                       f"style-src 'nonce-{nonce}'; connect-src 'self'; "
                                       "img-src 'none'; base-uri 'none'; form-action 'none'; "
                                       "frame-ancestors 'none'",
            "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})

    @r.post(PAGE_PATH + "/token")
    async def join(request: Request):
        """A phone joins: a token signed for it at its address (the limits' key)."""
        return {"phone": state.phone_token(state.address_of(request))}

    @r.get("/v1/servelab/class/questions")
    async def questions():
        return {"questions": students.questions, "limits": limits.__dict__}

    @r.get("/v1/servelab/class/timeline/{request_id}")
    async def timeline(request_id: str):
        """One student's request, stretch by stretch (what its phone gets in `done`), for
        the projector: running or kept for a reload."""
        ans = answers.get(request_id)
        if ans is None or ans.timeline is None:
            raise APIError(404, f"no student's request {request_id[:64]!r} is kept",
                           param="request_id", code="request_not_found")
        return {"request_id": request_id, "done": ans.done,
                "timeline": ans.timeline.to_list()}

    @r.get("/v1/servelab/class/trace")
    async def trace():
        """The class server's recent steps as a Chrome trace (engine/trace.py)."""
        return recent.trace()

    @r.get(PAGE_PATH + "/answer/{request_id}")
    async def resume(request_id: str, request: Request, start: int = 0):
        """A phone's answer again, from event `start`: a reload reattaches to it."""
        ans = answers.get(request_id)
        if ans is None or not ans.owned_by(request.headers.get("x-phone-secret")):
            raise APIError(404, refusal_text("answer_not_found", request_lang(request)),
                           "invalid_request_error", param="request_id",
                           code="answer_not_found")
        return StreamingResponse(ans.tail(start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    @r.post(PAGE_PATH + "/ask")
    async def ask(body: AskBody, request: Request):
        lang = request_lang(request)
        nickname = _clean(body.nickname, "nickname", limits.max_nickname_chars, lang)
        question = _clean(body.question, "question", limits.max_question_chars, lang)
        if nickname.lower().startswith(SIMULATED_PREFIX):
            raise APIError(400, refusal_text("simulated", lang, prefix=SIMULATED_PREFIX),
                           param="nickname")
        phone = body.phone  # the page's own secret: it reattaches to this answer after a reload
        if phone is not None and not 16 <= len(phone) <= 128:
            raise APIError(400, refusal_text("phone", lang), param="phone")
        client = state.client_of(request)  # the phone's token and address, not the nickname
        key = client.key
        students.check(key, lang)
        max_tokens = min(limits.max_tokens, loop.max_tokens_cap)
        ticket = Ticket(request_id=f"class-{next(_ids)}",
                        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                        user=nickname, aloop=asyncio.get_running_loop(), queue=asyncio.Queue(),
                        messages=[{"role": "user", "content": question}],
                        max_tokens=max_tokens, client=client, journey=True)
        students.in_flight.add(key)
        try:
            accepted: Delta = await state.admit(ticket)
        except APIError as err:
            students.in_flight.discard(key)
            raise _localized(err, lang, state) from None
        except BaseException:
            students.in_flight.discard(key)
            raise
        students.remember(ticket.request_id, nickname, question)
        rid = ticket.request_id
        ans = Answer(rid, _digest(phone) if phone else None)
        ans.timeline = ticket.timeline
        keep(ans)
        answered = False

        def student_done():  # only an answer the student got counts against the next one
            students.in_flight.discard(key)
            if answered:
                students.last_ask[key] = time.monotonic()

        lease = state.lease(ticket, on_release=student_done)
        ans.add({"type": "accepted", "request_id": rid, "question": question,
                 "prompt_tokens": len(accepted.prompt_token_ids), "max_tokens": max_tokens,
                 "engine": loop.generation})

        async def pump():
            """The loop's deltas into the answer's events, whoever is attached; a request
            nobody watches for `detached_grace_s` is aborted (its seat and blocks freed)."""
            nonlocal answered
            n_out, seat = 0, None
            try:
                while True:
                    try:
                        d: Delta = await asyncio.wait_for(ticket.queue.get(), 1.0)
                    except asyncio.TimeoutError:
                        if ans.attached == 0 and \
                                time.monotonic() - ans.detached_at > limits.detached_grace_s:
                            ans.add({"type": "error", "code": "left",
                                     "message": refusal_text("left", lang)})
                            break
                        continue
                    if d.error is not None:
                        lease.done = True
                        ans.add({"type": "error", "message": d.error.message,
                                 "code": d.error.code})
                        break
                    if d.journey is not None:
                        ans.add({"type": "journey", **d.journey})
                        if "seat" in d.journey:
                            now_at = {"seat": d.journey["seat"]["index"],
                                      "blocks": len(d.journey.get("blocks", []))}
                            if now_at != seat:
                                seat = now_at
                                ans.add({"type": "seat", **seat})
                    n_out += len(d.token_ids)
                    if d.text or d.token_ids:
                        ans.add({"type": "delta", "text": d.text, "step": d.step,
                                 "tokens": len(d.token_ids)})
                    if d.finish_reason is not None:
                        lease.done = True
                        ttft = (ticket.first_token_time - ticket.arrival
                                if ticket.first_token_time else None)
                        pct = _percentile(ttfts, ttft) if ttft is not None else None
                        if ttft is not None:
                            ttfts.append(ttft)
                        answered = True
                        ans.add({"type": "done", "tokens": n_out,
                                 "finish_reason": d.finish_reason, "server_ttft_s": ttft,
                                 "ttft_percentile": pct, "class_answers": len(ttfts) - 1,
                                 "timeline": ticket.timeline.to_list()})
                        break
            finally:
                ans.end()
                lease.close()

        ans.task = asyncio.get_running_loop().create_task(pump())
        return StreamingResponse(ans.tail(0), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    return r
