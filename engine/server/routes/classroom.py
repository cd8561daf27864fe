"""The students' page: what the classroom's QR code opens, served by the class server itself.

Chapter 6.4's point, one server for many people, made with the class as the many people:
each student opens `GET /class` on a phone, types a nickname and a question, and the answer
streams back from the same engine the projector draws, with the student's own TTFT, tokens/s
and where the request sat ("seat 5, 3 blocks").

Why a page the server serves and not a Streamlit page: a Streamlit session is a Python
object graph and a websocket per phone inside the teacher's app process, rerunning a script
for every widget event; this page is one static HTML file (a few KB, no framework) and one
HTTP request per question. docs/performance.md ("The class server") has the measured costs.

Why it is a router of its own, in the server's package: it is the class's concern, not
OpenAI's, so it is mounted by one line of `create_app` and reaches the server only through
`ServerState` (`admit`, `lease`: the server's queue and per-user limits apply to students
too, and a student who leaves frees the seat like any client); it stays under `engine/server/`
because `python -m engine.serve` is the class server and the engine never imports `app/`.

Routes (`router(state)`):
- `GET /class`: the page. It holds no data, so it needs no key; the join code comes from the
  QR code's URL fragment (`#code=...`, never sent to the server in a URL) or is typed in.
- `POST /class/ask` (JSON `{"nickname", "question"}`, `Authorization: Bearer <join code>`,
  checked by the app's middleware like every API route): server-sent events for this one
  request only: `accepted`, `seat` (seat index and KV blocks held), `delta` (answer text),
  `done` (token count, the server's TTFT) or `error`. A student never receives another
  request's text: this stream carries one ticket's deltas and nothing else.
- `GET /v1/servelab/class/questions`: recent questions by request id, for the teacher's
  "show questions on screen" (under /v1/servelab/, so the teacher's admin key guards it).

- `POST /class/join` (the join code): `{"phone": <token>}`, a token the server signs for
  this phone at this address (`ServerState.phone_token`); the page sends it back with each
  question as `X-ServeLab-Phone`.

Everything from a student is untrusted: nickname and question are length-limited with a clear
400; a question's control characters are refused; a nickname loses its control, bidi-override
(U+202A-202E, U+2066-2069) and zero-width (U+200B-200F, U+FEFF) characters, so no name can
turn the projector's text around or hide as another's; the page writes every string with
`textContent` (never innerHTML); the teacher's page escapes them with `html.escape`. Rate
limits per phone (its token and address; without a token, the address): one question in
flight and `min_interval_s` between questions (counted from the end of the last answer),
answered with 429 and `Retry-After`. A nickname is a label: a new nickname is not a new
student. The page's Content-Security-Policy allows only its own script and style, by a nonce
made for each response, and no framing (`frame-ancestors 'none'`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.background import BackgroundTask

from engine.config import SamplingParams
from engine.server.loop import SIMULATED_PREFIX, Delta, Ticket
from engine.server.protocol import APIError
from engine.server.routes.votes import votes_router
from engine.server.state import ServerState
from engine.server.vote_panel import VOTE_PANEL

PAGE_PATH = "/class"  # served without a key (it holds no data): engine/server/limits.py


@dataclass
class ClassLimits:
    """What one student may send (the class server's defaults; safe for a phone keyboard)."""

    max_nickname_chars: int = 32
    max_question_chars: int = 400
    max_tokens: int = 96  # answer length: short, so thirty students share the seats quickly
    min_interval_s: float = 3.0  # from one answer's end to the same student's next question
    max_recent_questions: int = 256  # what the teacher's "show questions" keeps


class AskBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    nickname: str
    question: str


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


def router(state: ServerState, limits: ClassLimits | None = None) -> APIRouter:
    """The students' routes over the server's state (its loop, its admission)."""
    limits = limits or ClassLimits()
    loop = state.loop
    students = _Students(limits)
    r = APIRouter()
    counter = itertools.count()
    # the class's votes and pre/post test (routes/votes.py) ride on the same class server
    votes = votes_router()
    state.votes = votes.classroom
    r.include_router(votes)

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

    @r.post(PAGE_PATH + "/join")
    async def join(request: Request):
        """A phone joins: a token signed for it at its address (the limits' key)."""
        return {"phone": state.phone_token(state.address_of(request))}

    @r.get("/v1/servelab/class/questions")
    async def questions():
        return {"questions": students.questions, "limits": limits.__dict__}

    @r.post(PAGE_PATH + "/ask")
    async def ask(body: AskBody, request: Request):
        nickname = _clean(body.nickname, "nickname", limits.max_nickname_chars)
        question = _clean(body.question, "question", limits.max_question_chars)
        if nickname.lower().startswith(SIMULATED_PREFIX):
            raise APIError(400, f"nicknames starting with {SIMULATED_PREFIX!r} are kept for "
                                f"simulated users; choose another", param="nickname")
        client = state.client_of(request)  # the phone's token and address, not the nickname
        key = client.key
        students.check(key)
        max_tokens = min(limits.max_tokens, loop.max_tokens_cap)
        ticket = Ticket(request_id=f"class-{next(counter)}",
                        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                        user=nickname, aloop=asyncio.get_running_loop(), queue=asyncio.Queue(),
                        messages=[{"role": "user", "content": question}],
                        max_tokens=max_tokens, client=client)
        students.in_flight.add(key)
        try:
            accepted: Delta = await state.admit(ticket)
        except BaseException:
            students.in_flight.discard(key)
            raise
        students.remember(ticket.request_id, nickname, question)
        rid = ticket.request_id

        def student_done():  # the student may ask again after `min_interval_s`
            students.in_flight.discard(key)
            students.last_ask[key] = time.monotonic()

        lease = state.lease(ticket, on_release=student_done)

        async def where() -> dict | None:
            try:
                return await asyncio.wrap_future(loop.call(lambda eng: seat_of(eng, rid)))
            except Exception:  # the server is stopping: no seat to tell
                return None

        async def events():
            try:
                yield _event({"type": "accepted", "request_id": rid,
                              "prompt_tokens": len(accepted.prompt_token_ids),
                              "max_tokens": max_tokens})
                n_out, seat = 0, None
                while True:
                    d: Delta = await ticket.queue.get()
                    if d.error is not None:
                        lease.done = True
                        yield _event({"type": "error", "message": d.error.message})
                        break
                    if d.token_ids and (n_out == 0 or (n_out // 16) != (n_out + len(
                            d.token_ids)) // 16):
                        # where it sits: at the first token, then every 16 (blocks grow)
                        now_at = await where()
                        if now_at is not None and now_at != seat:
                            seat = now_at
                            yield _event({"type": "seat", **seat})
                    n_out += len(d.token_ids)
                    if d.text:
                        yield _event({"type": "delta", "text": d.text})
                    if d.finish_reason is not None:
                        lease.done = True
                        ttft = (ticket.first_token_time - ticket.arrival
                                if ticket.first_token_time else None)
                        yield _event({"type": "done", "tokens": n_out,
                                      "finish_reason": d.finish_reason, "server_ttft_s": ttft})
                        break
            finally:
                lease.close()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"},
                                 background=BackgroundTask(lease.close))

    return r


# The page: one file, no framework, no external resource (a classroom may be offline). Every
# string that came from a person or the model is written with textContent, never innerHTML.
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ServeLab class</title>
<style nonce="{{NONCE}}">
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
<script nonce="{{NONCE}}">
"use strict";
const $ = (id) => document.getElementById(id);
const frag = new URLSearchParams(location.hash.slice(1));
if (frag.get("code")) { $("code").value = frag.get("code"); }
$("nick").value = localStorage.getItem("servelab-nick") || "";
$("q").addEventListener("input", () => { $("count").textContent = $("q").value.length + " / 400"; });
function say(text) { $("msg").textContent = text; }
let phone = sessionStorage.getItem("servelab-phone");
async function joinOnce(code) {
  // the server's token for this phone: its limits count by it, not by the nickname
  if (phone) return;
  try {
    const r = await fetch("/class/join", {method: "POST", headers: {"Authorization": "Bearer " + code}});
    if (r.ok) { phone = (await r.json()).phone; sessionStorage.setItem("servelab-phone", phone); }
  } catch (e) {}
}
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
    await joinOnce(code);
    const headers = {"Content-Type": "application/json", "Authorization": "Bearer " + code};
    if (phone) headers["X-ServeLab-Phone"] = phone;
    const r = await fetch("/class/ask", {method: "POST", headers,
      body: JSON.stringify({nickname, question})});
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

