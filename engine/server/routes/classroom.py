"""The students' page: what the classroom's QR code opens, served by the class server itself.

Chapter 6.4's point, one server for many people, made with the class as the many people:
each student opens `GET /class` on a phone, types a nickname and a question, and the answer
streams back from the same engine the projector draws, with the student's own TTFT, tokens/s
and where the request sat ("seat 5, 3 blocks").

Why a page the server serves and not a Streamlit page: a Streamlit session is a Python
object graph and a websocket per phone inside the teacher's app process, rerunning a script
for every widget event; this page is one static HTML file (a few KB, no framework) and one
HTTP request per question. README ("Teaching with a class") has the measured costs.

Why it is a router of its own, in the server's package: it is the class's concern, not
OpenAI's, so it is mounted by one line of `create_app` and reaches the server only through
`ServerState` (`admit`, `lease`: the server's queue and per-user limits apply to students
too, and a student who leaves frees the seat like any client); it stays under `engine/server/`
because `python -m engine.serve` is the class server and the engine never imports `app/`.

Routes (`router(state)`):
- `GET /class`: the page. It holds no data, so it needs no key; the join code comes from the
  QR code's URL fragment (`#code=...`, never sent to the server in a URL) or is typed in.
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

Everything from a student is untrusted: nickname and question are length-limited with a clear
400, control characters are refused, and the page writes every string with `textContent`
(never innerHTML); the teacher's page escapes them with `html.escape`. Rate limits per
student (client address + nickname): one question in flight and `min_interval_s` between
questions, counted from the end of the last answer the student received (an answer cut by a
switch change does not count), answered with 429 and `Retry-After`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import unicodedata
from collections import OrderedDict, deque
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from engine.config import SamplingParams
from engine.server.loop import SIMULATED_PREFIX, Delta, Ticket
from engine.server.protocol import APIError
from engine.server.state import ServerState

PAGE_PATH = "/class"  # served without a key (it holds no data): engine/server/limits.py


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


def _clean(value: str, name: str, limit: int) -> str:
    """Strip; refuse empty, too long, or control characters (a newline in a nickname)."""
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


def router(state: ServerState, limits: ClassLimits | None = None) -> APIRouter:
    """The students' routes over the server's state (its loop, its admission)."""
    limits = limits or ClassLimits()
    loop = state.loop
    students = _Students(limits)
    answers: OrderedDict[str, Answer] = OrderedDict()
    ttfts: deque[float] = deque(maxlen=limits.max_recent_questions)  # the class's
    r = APIRouter()
    counter = itertools.count()

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
        return HTMLResponse(PAGE, headers={
            # the page runs only its own inline script and talks only to this server
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                                       "style-src 'unsafe-inline'; connect-src 'self'; "
                                       "img-src 'none'; base-uri 'none'; form-action 'none'",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})

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
        phone = body.phone
        if phone is not None and not 16 <= len(phone) <= 128:
            raise APIError(400, "phone must be 16 to 128 characters (the page's own secret)",
                           param="phone")
        address = request.client.host if request.client else "unknown"
        key = f"{address}|{nickname.casefold()}"
        students.check(key)
        max_tokens = min(limits.max_tokens, loop.max_tokens_cap)
        ticket = Ticket(request_id=f"class-{next(counter)}",
                        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                        user=nickname, aloop=asyncio.get_running_loop(), queue=asyncio.Queue(),
                        messages=[{"role": "user", "content": question}],
                        max_tokens=max_tokens, journey=True)
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
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ServeLab class</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;padding:14px;
 max-width:640px;margin:auto;background:#f4f6f8;color:#222;font-size:17px}
h1{font-size:22px;margin:4px 0 10px}
label{display:block;font-weight:600;margin:10px 0 4px}
input,textarea{width:100%;box-sizing:border-box;font-size:17px;padding:8px;border:1px solid #999;
 border-radius:8px}
textarea{height:90px;resize:vertical}
.count{font-size:13px;color:#666;text-align:right}
button{margin-top:12px;width:100%;font-size:19px;padding:10px;border:0;border-radius:10px;
 background:#2e9e4f;color:#fff}
button:disabled{background:#9bb}
#answer{white-space:pre-wrap;background:#fff;border:1px solid #ccc;border-radius:8px;
 padding:10px;min-height:60px;margin-top:12px}
#stats{display:flex;flex-wrap:wrap;gap:8px;margin-top:10px}
#stats div{background:#dff3e4;border-radius:8px;padding:6px 10px;font-size:15px}
#msg{margin-top:10px;color:#b00020;font-weight:600}
#asked{margin-top:12px;color:#444;white-space:pre-wrap}
</style></head><body>
<h1>ServeLab: ask the class engine</h1>
<label for="code">Join code</label>
<input id="code" autocomplete="off" autocapitalize="off" spellcheck="false" maxlength="64">
<label for="nick">Nickname</label>
<input id="nick" maxlength="32" autocomplete="nickname">
<label for="q">Question</label>
<textarea id="q" maxlength="400"></textarea>
<div class="count" id="count">0 / 400</div>
<button id="ask">Ask</button>
<div id="msg" role="alert"></div>
<div id="asked"></div>
<div id="answer" aria-live="polite"></div>
<div id="stats"><div id="seat">seat: -</div><div id="ttft">first token: -</div>
<div id="rate">tokens/s: -</div></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const frag = new URLSearchParams(location.hash.slice(1));
if (frag.get("code")) { $("code").value = frag.get("code"); }
$("nick").value = localStorage.getItem("servelab-nick") || "";
$("q").addEventListener("input", () => { $("count").textContent = $("q").value.length + " / 400"; });
function say(text) { $("msg").textContent = text; }
async function ask() {
  const code = $("code").value.trim(), nickname = $("nick").value, question = $("q").value;
  say(""); $("answer").textContent = ""; $("asked").textContent = "";
  $("seat").textContent = "seat: -"; $("ttft").textContent = "first token: -";
  $("rate").textContent = "tokens/s: -";
  if (!code) { say("Type the join code shown on the projector."); return; }
  localStorage.setItem("servelab-nick", nickname);
  $("asked").textContent = nickname + ": " + question;
  $("ask").disabled = true;
  const sent = performance.now();
  let first = null, tokens = 0;
  try {
    const r = await fetch("/class/ask", {method: "POST", headers: {"Content-Type": "application/json",
      "Authorization": "Bearer " + code}, body: JSON.stringify({nickname, question})});
    if (!r.ok) {
      let m = "the server said " + r.status;
      try { m = (await r.json()).error.message; } catch (e) {}
      say(r.status === 401 ? "Wrong join code: check the code on the projector." : m);
      return;
    }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let i;
      while ((i = buf.indexOf("\\n\\n")) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!line.startsWith("data: ")) continue;
        const ev = JSON.parse(line.slice(6));
        if (ev.type === "delta") {
          if (first === null) {
            first = performance.now();
            $("ttft").textContent = "first token: " + ((first - sent) / 1000).toFixed(2) + " s";
          }
          $("answer").textContent += ev.text;
        } else if (ev.type === "seat") {
          $("seat").textContent = "seat " + ev.seat + ", " + ev.blocks + " blocks";
        } else if (ev.type === "done") {
          tokens = ev.tokens;
          const s = (performance.now() - (first || sent)) / 1000;
          if (tokens > 1 && s > 0) {
            $("rate").textContent = "tokens/s: " + ((tokens - 1) / s).toFixed(1);
          }
        } else if (ev.type === "error") {
          say(ev.message);
        }
      }
    }
  } catch (e) {
    say("The class engine went away (the teacher may be changing a switch): ask again.");
  } finally {
    $("ask").disabled = false;
  }
}
$("ask").addEventListener("click", ask);
</script></body></html>
"""

