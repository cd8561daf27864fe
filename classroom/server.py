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
`create_app(routers=...)` (`routers()` here), and it reaches the server only through
`ServerState` (`admit`, `lease`: the server's queue and per-user limits apply to students
too, and a student who leaves frees the seat like any client). The engine never imports it.

Routes (`router(state)`):
- `GET /class`: the page. It holds no data, so it needs no key (the router names it in
  `open_paths`); the join code comes from the QR code's URL fragment (`#code=...`, never sent
  to the server in a URL) or is typed in.
- `POST /class/ask` (JSON `{"nickname", "question", "phone"}`, `Authorization: Bearer <join
  code>`, checked by the app's middleware like every API route): server-sent events for this
  one request only, each numbered `i`: `accepted` (its id, its question, the engine's
  generation), `journey` (its own slice of each step that changed it: at the door with its
  place and the reasons it waited, or its seat, boarding step and wait, its page table
  growing, the count of its blocks shared with others, its drafts' verdicts), `seat`, `delta`
  (answer text with the step it came from), `done` (token count, the server's TTFT and where
  that falls among the class's, as a percentile only) or `error` (`code`
  "engine_restarting" when the teacher changed a switch: the page asks again by itself).
  A student never receives another request's text, nickname or timing.
- `GET /class/answer/{id}?start=N` (join code, `X-Phone-Secret`): the same answer's events
  from N. The answer runs on whether or not a phone is attached (kept `keep_answers_s` after
  it ends, aborted if nobody reads it for `detached_grace_s`), so a reload reattaches.
- `GET /v1/servelab/class/questions`: recent questions by request id, for the teacher's
  "show questions on screen" (under /v1/servelab/, so the teacher's admin key guards it).

- `POST /class/token` (the join code): `{"phone": <token>}`, a token the server signs for
  this phone at this address (`ServerState.phone_token`); the page sends it back with each
  question as `X-ServeLab-Phone`.

Everything from a student is untrusted: nickname and question are length-limited with a clear
400; a question's control characters are refused; a nickname loses its control, bidi-override
(U+202A-202E, U+2066-2069) and zero-width (U+200B-200F, U+FEFF) characters, so no name can
turn the projector's text around or hide as another's; the page writes every string with
`textContent` (never innerHTML); the teacher's page escapes them with `html.escape`. Rate
limits per phone (its token and address; without a token, the address): one question in
flight and `min_interval_s` between questions (counted from the end of the last answer the student received; an answer cut by a
switch change does not count),
answered with 429 and `Retry-After`. A nickname is a label: a new nickname is not a new
student. The page's Content-Security-Policy allows only its own script and style, by a nonce
made for each response, and no framing (`frame-ancestors 'none'`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import secrets
import time
import unicodedata
from collections import OrderedDict, deque
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from classroom.vote_panel import VOTE_PANEL
from classroom.vote_routes import votes_router
from engine.config import SamplingParams
from engine.server.app import RouterFactory
from engine.server.loop import SIMULATED_PREFIX, Delta, Ticket
from engine.server.protocol import APIError
from engine.server.state import ServerState

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


class AskBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    nickname: str
    question: str
    phone: str | None = None  # the page's own random secret: what a reload reattaches with


# what a nickname loses: bidi embeddings and overrides, bidi isolates, zero-width characters
# (and the BOM); control characters go too (category Cc)
_INVISIBLE = dict.fromkeys([*range(0x202A, 0x202F), *range(0x2066, 0x206A),
                            *range(0x200B, 0x2010), 0xFEFF, 0x2060])


def clean_nickname(value: str) -> str:
    """The nickname without control, bidi-control and zero-width characters."""
    value = value.translate(_INVISIBLE)
    return "".join(c for c in value if unicodedata.category(c) != "Cc")


def _clean(value: str, name: str, limit: int) -> str:
    """Strip; refuse empty, too long, or (a question's) control characters; a nickname's
    invisible characters are dropped first."""
    if name == "nickname":
        value = clean_nickname(value)
    value = value.strip()
    if not value:
        raise APIError(400, f"{name} is empty: type one", param=name)
    if len(value) > limit:
        raise APIError(400, f"{name} is {len(value)} characters; at most {limit}",
                       param=name, code="too_long")
    allowed = "\n\t" if name == "question" else ""
    if any(unicodedata.category(c) == "Cc" and c not in allowed for c in value):
        raise APIError(400, f"{name} holds a control character", param=name)
    return value


class _Students:
    """Per-student rate limits and the recent questions (event loop thread only)."""

    def __init__(self, limits: ClassLimits):
        self.limits = limits
        self.in_flight: set[str] = set()
        self.last_ask: dict[str, float] = {}
        self.questions: OrderedDict[str, dict] = OrderedDict()

    def check(self, key: str) -> None:
        if key in self.in_flight:
            raise APIError(429, "your previous question is still being answered; wait for it",
                           "rate_limit_error", code="one_question_at_a_time",
                           headers={"Retry-After": "1"})
        wait = self.limits.min_interval_s - (time.monotonic() - self.last_ask.get(key, -1e9))
        if wait > 0:
            raise APIError(429, f"one question per {self.limits.min_interval_s:g} s after an "
                                f"answer: try again in {max(wait, 1):.0f} s", "rate_limit_error",
                           code="too_many_questions", headers={"Retry-After": f"{wait:.0f}"})

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


def routers(limits: ClassLimits | None = None) -> list[RouterFactory]:
    """What the class server hands `create_app(routers=...)`: the students' routes (with the
    votes)."""
    return [lambda state: router(state, limits)]


def router(state: ServerState, limits: ClassLimits | None = None) -> APIRouter:
    """The students' routes over the server's state (its loop, its admission)."""
    limits = limits or ClassLimits()
    loop = state.loop
    students = _Students(limits)
    answers: OrderedDict[str, Answer] = OrderedDict()
    ttfts: deque[float] = deque(maxlen=limits.max_recent_questions)  # the class's
    r = APIRouter()
    r.open_paths = (PAGE_PATH,)  # create_app lets these through without a key
    counter = itertools.count()
    # the class's votes and pre/post test (vote_routes.py) ride on the same class server
    votes = votes_router()
    state.votes = votes.classroom
    r.include_router(votes)

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
        return HTMLResponse(PAGE.replace("</body>", VOTE_PANEL + "</body>").replace("{{NONCE}}", nonce), headers={
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

    @r.get(PAGE_PATH + "/answer/{request_id}")
    async def resume(request_id: str, request: Request, start: int = 0):
        """A phone's answer again, from event `start`: a reload reattaches to it."""
        ans = answers.get(request_id)
        if ans is None or not ans.owned_by(request.headers.get("x-phone-secret")):
            raise APIError(404, "no answer with this id for this phone (it may have expired)",
                           "invalid_request_error", param="request_id",
                           code="answer_not_found")
        return StreamingResponse(ans.tail(start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    @r.post(PAGE_PATH + "/ask")
    async def ask(body: AskBody, request: Request):
        nickname = _clean(body.nickname, "nickname", limits.max_nickname_chars)
        question = _clean(body.question, "question", limits.max_question_chars)
        if nickname.lower().startswith(SIMULATED_PREFIX):
            raise APIError(400, f"nicknames starting with {SIMULATED_PREFIX!r} are kept for "
                                f"simulated users; choose another", param="nickname")
        phone = body.phone  # the page's own secret: it reattaches to this answer after a reload
        if phone is not None and not 16 <= len(phone) <= 128:
            raise APIError(400, "phone must be 16 to 128 characters (the page's own secret)",
                           param="phone")
        client = state.client_of(request)  # the phone's token and address, not the nickname
        key = client.key
        students.check(key)
        max_tokens = min(limits.max_tokens, loop.max_tokens_cap)
        ticket = Ticket(request_id=f"class-{next(counter)}",
                        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                        user=nickname, aloop=asyncio.get_running_loop(), queue=asyncio.Queue(),
                        messages=[{"role": "user", "content": question}],
                        max_tokens=max_tokens, client=client, journey=True)
        students.in_flight.add(key)
        try:
            accepted: Delta = await state.admit(ticket)
        except BaseException:
            students.in_flight.discard(key)
            raise
        students.remember(ticket.request_id, nickname, question)
        rid = ticket.request_id
        ans = Answer(rid, _digest(phone) if phone else None)
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
                                     "message": "nobody was reading this answer"})
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
                                 "ttft_percentile": pct, "class_answers": len(ttfts) - 1})
                        break
            finally:
                ans.end()
                lease.close()

        ans.task = asyncio.get_running_loop().create_task(pump())
        return StreamingResponse(ans.tail(0), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    return r


# The page: one file, no framework, no external resource (a classroom may be offline). Every
# string that came from a person or the model is written with textContent, never innerHTML.
# Every string it shows is in STR in both languages; it starts in the phone's language
# (navigator.language, the same as Accept-Language) and the button in its corner switches.
# It keeps a random secret and the id of its last answer in localStorage, so a reload
# reattaches to the answer (running or finished) instead of losing it.
PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ServeLab class</title>
<style nonce="{{NONCE}}">
body{font-family:system-ui,-apple-system,"Segoe UI","PingFang SC","Noto Sans CJK SC",sans-serif;
 margin:0;padding:14px;max-width:640px;margin:auto;background:#f4f6f8;color:#222;font-size:17px}
h1{font-size:22px;margin:4px 0 10px}
label{display:block;font-weight:600;margin:10px 0 4px}
input,textarea{width:100%;box-sizing:border-box;font-size:17px;padding:8px;border:1px solid #999;
 border-radius:8px}
textarea{height:90px;resize:vertical}
.count{font-size:13px;color:#666;text-align:right}
button{margin-top:12px;width:100%;font-size:19px;padding:10px;border:0;border-radius:10px;
 background:#2e9e4f;color:#fff}
button:disabled{background:#9bb}
#lang{float:right;width:auto;margin:0;font-size:15px;padding:6px 12px;background:#345}
#answer{white-space:pre-wrap;background:#fff;border:1px solid #ccc;border-radius:8px;
 padding:10px;min-height:60px;margin-top:12px}
#stats{display:flex;flex-wrap:wrap;gap:8px;margin-top:10px}
#stats div{background:#dff3e4;border-radius:8px;padding:6px 10px;font-size:15px}
#msg{margin-top:10px;color:#b00020;font-weight:600}
#note{margin-top:10px;color:#0b5394;font-weight:600}
#asked{margin-top:12px;color:#444;white-space:pre-wrap}
#journey{margin-top:14px;background:#fff;border:1px solid #ccc;border-radius:8px;padding:10px}
#journey h2{font-size:18px;margin:0 0 6px}
#journey .row{margin:6px 0;font-size:15px}
#pages{display:flex;flex-wrap:wrap;gap:4px;margin-top:4px}
#pages span{background:#e8eef7;border-radius:4px;padding:2px 6px;font-size:13px;
 font-variant-numeric:tabular-nums}
#tokens{line-height:2.1;margin-top:4px;font-size:15px;white-space:pre-wrap}
#tokens .tk{background:#eef;border-radius:3px;padding:1px 2px;position:relative}
#tokens .tk sup{font-size:10px;color:#666;margin-right:1px}
#tokens .ok{background:#c8ecd0}
#tokens .no{background:#f6c9c9;text-decoration:line-through}
.model{font-size:13px;color:#666;margin-top:14px}
</style></head><body>
<button id="lang" type="button">中文</button>
<h1 data-t="title">ServeLab: ask the class engine</h1>
<label for="code" data-t="code">Join code</label>
<input id="code" autocomplete="off" autocapitalize="off" spellcheck="false" maxlength="64">
<label for="nick" data-t="nick">Nickname</label>
<input id="nick" maxlength="32" autocomplete="nickname">
<label for="q" data-t="question">Question</label>
<textarea id="q" maxlength="400"></textarea>
<div class="count" id="count">0 / 400</div>
<button id="ask" data-t="ask">Ask</button>
<div id="msg" role="alert"></div>
<div id="note" aria-live="polite"></div>
<div id="asked"></div>
<div id="answer" aria-live="polite"></div>
<div id="stats"><div id="seat"></div><div id="ttft"></div><div id="rate"></div></div>
<div id="journey" hidden>
<h2 data-t="journey">Your request's journey</h2>
<div class="row" id="j-door"></div>
<div class="row" id="j-seat"></div>
<div class="row"><span data-t="pages">Your page table (logical block → physical block)</span>
<div id="pages"></div></div>
<div class="row" id="j-shared"></div>
<div class="row"><span data-t="tokens">Your tokens as they arrived (step number above)</span>
<div id="tokens"></div></div>
<div class="row" id="j-class"></div>
</div>
<div class="model" data-t="model">The class engine runs a small English model (SmolLM2-135M): it
shows how serving works, not how well a large model answers. Chinese questions may get weak
answers.</div>
<script nonce="{{NONCE}}">
"use strict";
const STR = {
  en: {title: "ServeLab: ask the class engine", code: "Join code", nick: "Nickname",
    question: "Question", ask: "Ask", other: "中文",
    journey: "Your request's journey",
    pages: "Your page table (logical block → physical block)",
    tokens: "Your tokens as they arrived (step number above)",
    model: "The class engine runs a small English model (SmolLM2-135M): it shows how serving works, not how well a large model answers. Chinese questions may get weak answers.",
    seat0: "seat: -", ttft0: "first token: -", rate0: "tokens/s: -",
    seat: (s, b) => "seat " + s + ", " + b + " blocks",
    ttft: (x) => "first token: " + x + " s", rate: (x) => "tokens/s: " + x,
    needCode: "Type the join code shown on the projector.",
    wrongCode: "Wrong join code: check the code on the projector.",
    said: (n) => "the server said " + n,
    gone: "The class engine went away (the teacher may be changing a switch): ask again.",
    restarting: "The teacher changed a switch; asking again…",
    waitingEngine: "Waiting for the class engine to come back…",
    resumed: "Reconnected to your answer.",
    door: (pos, of) => "At the door: place " + (pos + 1) + " of " + of,
    why: "waited because: ",
    seated: (i, st, ws, wsec) => "Seat " + i + ", boarded at step " + st + " after " + ws +
      " steps (" + wsec + " s) at the door",
    shared: (n) => "Prefix blocks shared with others: " + n,
    pct: (p, n) => "Your first-token time is at the " + p + "th percentile of the class's " + n + " answers (lower is faster).",
    pct1: "You are the first answer in the class.",
    reasons: {seats: "all seats taken", kv: "KV cache full", static: "the static bus was still running", budget: "this step's token budget used up", other: "busy"}},
  zh: {title: "ServeLab：向全班的引擎提问", code: "加入码", nick: "昵称",
    question: "问题", ask: "提问", other: "English",
    journey: "你的请求的旅程",
    pages: "你的页表（逻辑块 → 物理块）",
    tokens: "你的词元，按到达顺序（上方是步数）",
    model: "全班的引擎运行一个小型英文模型（SmolLM2-135M）：它展示推理服务如何运作，而不是大模型答得多好。中文问题的回答可能较弱。",
    seat0: "座位：-", ttft0: "首个词元：-", rate0: "词元/秒：-",
    seat: (s, b) => "座位 " + s + "，" + b + " 个块",
    ttft: (x) => "首个词元：" + x + " 秒", rate: (x) => "词元/秒：" + x,
    needCode: "请输入投影上显示的加入码。",
    wrongCode: "加入码不对：请核对投影上的加入码。",
    said: (n) => "服务器返回 " + n,
    gone: "全班的引擎暂时离开了（老师可能在切换开关）：请再问一次。",
    restarting: "老师切换了一个开关；正在重新提问……",
    waitingEngine: "正在等待全班的引擎恢复……",
    resumed: "已重新连接到你的回答。",
    door: (pos, of) => "在门口：第 " + (pos + 1) + " 位，共 " + of + " 位",
    why: "等待原因：",
    seated: (i, st, ws, wsec) => "座位 " + i + "，第 " + st + " 步上车，在门口等了 " + ws +
      " 步（" + wsec + " 秒）",
    shared: (n) => "与他人共享的前缀块：" + n,
    pct: (p, n) => "你的首词元时间位于全班 " + n + " 个回答的第 " + p + " 百分位（越低越快）。",
    pct1: "你是全班第一个得到回答的。",
    reasons: {seats: "座位已满", kv: "KV 缓存已满", static: "静态批处理的大巴还在跑", budget: "本步的词元预算已用完", other: "繁忙"}}
};
const $ = (id) => document.getElementById(id);
let lang = localStorage.getItem("servelab-lang") ||
  ((navigator.language || "").toLowerCase().startsWith("zh") ? "zh" : "en");
const S = () => STR[lang];
let view = null;  // what the page shows of the current answer, redrawn on a language change
function fresh() {
  return {seat: null, ttft: null, rate: null, door: null, seated: null, pages: [],
          shared: null, pct: null, n: 0};
}
function applyLang() {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  document.title = S().title;
  document.querySelectorAll("[data-t]").forEach((el) => { el.textContent = S()[el.dataset.t]; });
  $("lang").textContent = S().other;
  drawStats();
}
function reasonText(r) { return S().reasons[r] || S().reasons.other; }
function drawStats() {
  const v = view || fresh();
  $("seat").textContent = v.seat ? S().seat(v.seat[0], v.seat[1]) : S().seat0;
  $("ttft").textContent = v.ttft !== null ? S().ttft(v.ttft) : S().ttft0;
  $("rate").textContent = v.rate !== null ? S().rate(v.rate) : S().rate0;
  if (!view) return;
  $("journey").hidden = false;
  const reasons = (rs) => rs.length ? " · " + S().why + [...new Set(rs.map(reasonText))].join(", ") : "";
  $("j-door").textContent = v.door ? S().door(v.door.position, v.door.of) + reasons(v.door.reasons) : "";
  const s = v.seated;
  $("j-seat").textContent = s ? S().seated(s.index, s.boarded_step, s.waited_steps, s.waited_s.toFixed(2)) + reasons(s.reasons) : "";
  $("j-shared").textContent = v.shared !== null ? S().shared(v.shared) : "";
  $("j-class").textContent = v.pct === null ? "" : (v.n < 1 ? S().pct1 : S().pct(v.pct, v.n));
}
$("lang").addEventListener("click", () => {
  lang = lang === "zh" ? "en" : "zh";
  localStorage.setItem("servelab-lang", lang);
  applyLang();
});
const frag = new URLSearchParams(location.hash.slice(1));
if (frag.get("code")) { $("code").value = frag.get("code"); }
$("nick").value = localStorage.getItem("servelab-nick") || "";
$("q").addEventListener("input", () => { $("count").textContent = $("q").value.length + " / 400"; });
let phone = localStorage.getItem("servelab-phone");
if (!phone) {
  const b = new Uint8Array(16); crypto.getRandomValues(b);
  phone = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  localStorage.setItem("servelab-phone", phone);
}
function say(text) { $("msg").textContent = text; }
function note(text) { $("note").textContent = text; }
function reset(nickname, question) {
  view = fresh();
  say(""); $("answer").textContent = ""; $("asked").textContent = nickname + ": " + question;
  $("pages").textContent = ""; $("tokens").textContent = "";
  drawStats();
}
function token(text, step, cls) {
  const el = document.createElement("span");
  el.className = "tk" + (cls ? " " + cls : "");
  if (step !== null) { const sup = document.createElement("sup"); sup.textContent = step; el.appendChild(sup); }
  el.appendChild(document.createTextNode(text));
  $("tokens").appendChild(el);
}
// one answer's events, from a fetch response; returns "done", "restart", "error" or "cut"
async function read(r, st) {
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return "cut";
    buf += dec.decode(value, {stream: true});
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const line = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!line.startsWith("data: ")) continue;
      const ev = JSON.parse(line.slice(6));
      st.next = ev.i + 1;
      if (ev.type === "accepted") {
        st.rid = ev.request_id;
        localStorage.setItem("servelab-answer", JSON.stringify(
          {rid: ev.request_id, nick: st.nickname, question: st.question}));
      } else if (ev.type === "delta") {
        if (st.first === null && ev.text) {
          st.first = performance.now();
          view.ttft = ((st.first - st.sent) / 1000).toFixed(2);
        }
        $("answer").textContent += ev.text;
        if (ev.text) token(ev.text, ev.step, "");
      } else if (ev.type === "seat") {
        view.seat = [ev.seat, ev.blocks];
      } else if (ev.type === "journey") {
        if (ev.door) view.door = ev.door;
        if (ev.seat) { view.seated = ev.seat; view.door = null; }
        if (ev.blocks) {
          const p = $("pages");
          for (let k = p.children.length; k < ev.blocks.length; k++) {
            const el = document.createElement("span");
            el.textContent = k + " → " + ev.blocks[k];
            p.appendChild(el);
          }
        }
        if (ev.shared_blocks !== undefined) view.shared = ev.shared_blocks;
        if (ev.drafts) {
          for (const d of ev.drafts) token(d.text, null, d.accepted ? "ok" : "no");
        }
      } else if (ev.type === "done") {
        const s = (performance.now() - (st.first || st.sent)) / 1000;
        if (ev.tokens > 1 && s > 0) view.rate = ((ev.tokens - 1) / s).toFixed(1);
        if (st.resumed && ev.server_ttft_s) view.ttft = ev.server_ttft_s.toFixed(2);
        if (ev.ttft_percentile !== null && ev.ttft_percentile !== undefined) {
          view.pct = Math.round(ev.ttft_percentile); view.n = ev.class_answers;
        } else { view.pct = 0; view.n = 0; }
        drawStats();
        return "done";
      } else if (ev.type === "error") {
        drawStats();
        if (ev.code === "engine_restarting") return "restart";
        say(ev.message);
        return "error";
      }
      drawStats();
    }
  }
}
const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
let phoneToken = sessionStorage.getItem("servelab-phone");
async function joinOnce(code) {
  // the server's token for this phone: its limits count by it, not by the nickname
  if (phoneToken) return;
  try {
    const r = await fetch("/class/token", {method: "POST", headers: {"Authorization": "Bearer " + code}});
    if (r.ok) { phoneToken = (await r.json()).phone; sessionStorage.setItem("servelab-phone", phoneToken); }
  } catch (e) {}
}
async function ask() {
  const code = $("code").value.trim(), nickname = $("nick").value, question = $("q").value;
  note("");
  if (!code) { say(S().needCode); return; }
  localStorage.setItem("servelab-nick", nickname);
  reset(nickname, question);
  $("ask").disabled = true;
  try {
    for (let attempt = 0; attempt < 20; attempt++) {
      const st = {nickname, question, sent: performance.now(), first: null, next: 0, rid: null};
      let outcome;
      try {
        await joinOnce(code);
        const headers = {"Content-Type": "application/json", "Authorization": "Bearer " + code};
        if (phoneToken) headers["X-ServeLab-Phone"] = phoneToken;
        const r = await fetch("/class/ask", {method: "POST", headers,
          body: JSON.stringify({nickname, question, phone})});
        if (!r.ok) {
          let m = S().said(r.status);
          try { m = (await r.json()).error.message; } catch (e) {}
          if (r.status === 503 && attempt < 19) { note(S().waitingEngine); await sleep(1000); continue; }
          say(r.status === 401 ? S().wrongCode : m);
          return;
        }
        outcome = await read(r, st);
        if (outcome === "cut" && st.rid) outcome = await follow(code, st);
      } catch (e) {
        outcome = st.rid ? await follow(code, st).catch(() => "gone") : "gone";
      }
      if (outcome === "restart") {
        note(S().restarting);
        reset(nickname, question);
        await sleep(500);
        continue;
      }
      if (outcome === "gone") {
        note(S().waitingEngine);
        await sleep(1500);
        reset(nickname, question);
        continue;
      }
      if (outcome === "done") note("");
      return;
    }
    say(S().gone);
  } finally {
    $("ask").disabled = false;
  }
}
// reattach to an answer by its id (a dropped connection, or a reload), from event st.next
async function follow(code, st) {
  for (let tries = 0; tries < 5; tries++) {
    const r = await fetch("/class/answer/" + encodeURIComponent(st.rid) + "?start=" + st.next,
      {headers: {"Authorization": "Bearer " + code, "X-Phone-Secret": phone}});
    if (r.status === 404) { localStorage.removeItem("servelab-answer"); return "error"; }
    if (!r.ok) { await sleep(1000); continue; }
    const out = await read(r, st);
    if (out !== "cut") return out;
  }
  return "gone";
}
async function resume() {
  let saved = null;
  try { saved = JSON.parse(localStorage.getItem("servelab-answer") || "null"); } catch (e) {}
  const code = $("code").value.trim();
  if (!saved || !saved.rid || !code) return;
  $("q").value = saved.question;
  $("count").textContent = saved.question.length + " / 400";
  reset(saved.nick, saved.question);
  const st = {nickname: saved.nick, question: saved.question, sent: performance.now(),
              first: null, next: 0, rid: saved.rid, resumed: true};
  $("ask").disabled = true;
  try {
    const out = await follow(code, st);
    if (out === "error" && st.next === 0) { view = null; $("asked").textContent = ""; drawStats(); }
    else note(S().resumed);
    if (out === "restart") { $("ask").disabled = false; await ask(); }
  } catch (e) {
    note("");
  } finally {
    $("ask").disabled = false;
  }
}
$("ask").addEventListener("click", ask);
applyLang();
resume();
</script></body></html>
"""
