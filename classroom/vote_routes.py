"""The class's votes over HTTP: phones join and vote, the teacher runs rounds and tests.

Included by the class router (`classroom/server.py`), which keeps the `Classroom` on the
server's state as `state.votes`. The state lives in one `Classroom` (`classroom/votes.py`)
per server, driven only from the event loop (handlers do a few dict operations and commit the
change to the class's record, one small transaction, before they answer: classroom/record.py;
the stepping thread never sees a vote). The self-test a round may open, the test's pairs and the
misconceptions come in as data (`Lessons`), from whoever starts the server.

Phone routes (the join code, like `/class/ask`; the phone's id in the `X-Phone` header,
issued by `POST /class/join` and kept in the page's localStorage):
- `POST /class/join` `{"phone"?: id it kept, "nickname"?}` -> `{"phone", "class"}`
- `GET /class/vote` -> the open round in the phone's language, with its own ballot only
- `POST /class/vote` `{"round", "choice", "class"?}` -> the phone's view after the vote
- `GET /class/test`, `POST /class/test` `{"item", "choice"}`: this phone's form of the test
The language: `?lang=zh|en` (the page's toggle), else `Accept-Language`. A refused vote is
OpenAI's error JSON with the message in that language, and changes no count: every route of
this router runs under one handler for `VoteError` (`VoteRoute`).

Teacher routes, under /v1/servelab/votes/ (so the teacher's admin key guards them):
`GET state` (the projector's view: how many voted while open, counts from lock; `names`, the
named phones by handle; `masking`), `GET masking` (the hidden names and the word list every
projected name passes through),
`GET stream` (that view as server-sent events, one per change), `POST open`
(`{"question": {...}}` or `{"quiz": id}`, `"seconds"`), `lock`, `extend` `{"seconds"}`,
`revote`, `reveal` `{"correct"?, "measured"?}`, `hand` `{"counts"}`, `hide` `{"handle",
"hidden"?}` (a student's name, by the handle `state` lists) or `{"hidden"?}` (the round's
question), `words` `{"words": [...]}`, `test/start` `{"phase"}`, `test/stop`,
`test/hand`, `export.csv` (`?nicknames=1` adds them: the teacher's own export),
`gains` (g, d_z, right-to-wrong per item and misconception, each form's and each order's
means, the sentence, the summary).
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.background import BackgroundTask

from classroom.gains import class_gains, hand_gains, revisit_sentence, summary_markdown
from classroom.votes import (
    Classroom,
    Lessons,
    Question,
    VoteError,
    load_misconceptions,
    load_test_forms,
    packaged_lessons,
    pick_lang,
    quiz_question,
)
from engine.server.protocol import APIError

TEACHER = "/v1/servelab/votes"
MAX_PHONES = 2000  # joins a class server accepts (a class, not the internet)


def _lang(request: Request) -> str:
    return pick_lang(request.query_params.get("lang"), request.headers.get("accept-language"))


def _refuse(err: VoteError, lang: str) -> APIError:
    kind = "rate_limit_error" if err.status == 429 else "invalid_request_error"
    return APIError(err.status, err.message(lang), kind, code=err.code,
                    headers={"Retry-After": "3"} if err.status == 429 else None)


class VoteRoute(APIRoute):
    """Every vote route's one handler for a refused request: a `VoteError` its handler
    raised leaves as an `APIError` (OpenAI's error body, the server's error handler writes
    it) with the refusal's status and its message in the request's language."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def refusing(request: Request):
            try:
                return await handler(request)
            except VoteError as err:
                raise _refuse(err, _lang(request)) from None

        return refusing


async def _body(request: Request, lang: str = "en") -> dict:
    try:
        data = json.loads(await request.body() or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise APIError(400, "请求体不是合法的 JSON。" if lang == "zh" else
                       "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise APIError(400, "请求体应是一个 JSON 对象。" if lang == "zh" else
                       "the request body must be a JSON object")
    return data


def _teacher_error(exc: ValueError) -> APIError:
    return APIError(400, str(exc), param=str(exc).split(":")[0] or None)


def votes_router(classroom: Classroom | None = None,
                 lessons: Lessons | None = None, limits=None) -> APIRouter:
    """The votes' routes over one `Classroom` (default: a new one with the test's forms and
    `limits`' flood rule, a classroom.server.ClassLimits). `lessons`: the course as data
    (default: the packaged `lessons`)."""
    lessons = lessons or packaged_lessons()
    flood = {} if limits is None else {"flood_votes": limits.flood_votes,
                                       "flood_window_s": limits.flood_window_s}
    room = classroom or Classroom(forms=load_test_forms(lessons), **flood)
    router = APIRouter(route_class=VoteRoute)
    router.classroom = room  # the app keeps it on app.state too (tests read it)
    router.lessons = lessons
    quiz = lessons.questions
    waiters: set[asyncio.Event] = set()

    def wake():
        for ev in list(waiters):
            ev.set()

    room.listeners.append(wake)

    def phone_id(request: Request) -> str:
        return request.headers.get("x-phone", "")

    # --- phones -------------------------------------------------------------------------------
    @router.post("/class/join")
    async def join(request: Request):
        lang = _lang(request)
        body = await _body(request, lang)
        pid, nick = body.get("phone"), body.get("nickname", "")
        if pid is not None and not isinstance(pid, str):
            pid = None
        if pid not in room.phones and len(room.phones) >= MAX_PHONES:
            raise APIError(429, "课堂已满。" if lang == "zh" else "the class is full",
                           "rate_limit_error", code="class_full")
        phone = room.join(pid, nick if isinstance(nick, str) else "", lang)
        return {"phone": phone.pid, "class": room.class_id, "lang": lang}

    @router.get("/class/vote")
    async def phone_round(request: Request):
        return room.phone_view(phone_id(request), _lang(request))

    @router.post("/class/vote")
    async def vote(request: Request):
        lang = _lang(request)
        body = await _body(request, lang)
        pid = phone_id(request)
        room.vote(pid, body.get("round"), body.get("choice"), body.get("class"))
        return room.phone_view(pid, lang)

    @router.get("/class/test")
    async def phone_test(request: Request):
        return room.test_view(phone_id(request), _lang(request))

    @router.post("/class/test")
    async def test_answer(request: Request):
        lang = _lang(request)
        body = await _body(request, lang)
        pid = phone_id(request)
        room.answer_test(pid, body.get("item"), body.get("choice"), body.get("class"))
        return room.test_view(pid, lang)

    # --- the teacher --------------------------------------------------------------------------
    def state(lang: str) -> dict:
        out = room.projector(lang)
        out["names"] = room.names()  # the teacher's hide / show buttons, by handle
        out["masking"] = room.masking()
        return out

    @router.get(TEACHER + "/state")
    async def teacher_state(request: Request):
        return state(_lang(request))

    @router.get(TEACHER + "/stream")
    async def teacher_stream(request: Request, limit: int = 0):
        """The projector's view as server-sent events: now, then after every change."""
        lang = _lang(request)
        ev = asyncio.Event()
        waiters.add(ev)

        async def events():
            sent, last = 0, None
            try:
                while not limit or sent < limit:
                    if room.version != last:
                        last = room.version
                        yield f"data: {json.dumps(state(lang), ensure_ascii=False)}\n\n"
                        sent += 1
                        continue
                    try:
                        await asyncio.wait_for(ev.wait(), 15.0)
                    except asyncio.TimeoutError:
                        yield ": idle\n\n"
                    ev.clear()
            finally:
                waiters.discard(ev)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 background=BackgroundTask(waiters.discard, ev))

    def teacher_op(fn):
        async def handler(request: Request):
            lang = _lang(request)
            body = await _body(request, lang)
            try:
                fn(body)
            except (ValueError, TypeError, KeyError) as e:  # a VoteError: VoteRoute's
                raise _teacher_error(ValueError(str(e))) from None
            return state(lang)
        return handler

    def op_open(body):
        seconds = body.get("seconds", 60)
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise ValueError("seconds: a number")
        if "quiz" in body:
            if body["quiz"] not in quiz:
                raise ValueError(f"quiz: no self-test item {str(body['quiz'])[:40]!r}")
            q = quiz_question(quiz[body["quiz"]])
        else:
            q = Question.from_dict(body.get("question"))
        room.open_round(q, float(seconds))

    def op_seconds(name):
        def op(body):
            s = body.get("seconds", 30 if name == "extend" else 60)
            if not isinstance(s, (int, float)) or isinstance(s, bool):
                raise ValueError("seconds: a number")
            (room.extend if name == "extend" else room.revote)(float(s))
        return op

    def op_reveal(body):
        c = body.get("correct")
        if c is not None and (not isinstance(c, int) or isinstance(c, bool)):
            raise ValueError("correct: the index of a choice")
        room.reveal(c, measured=body.get("measured"))

    def op_hide(body):
        if "handle" in body:  # a phone's name, by its pseudonymous id: hidden, or shown again
            room.set_hidden(str(body["handle"]), bool(body.get("hidden", True)))
        else:  # the round's question
            room.hide_question(bool(body.get("hidden", True)))

    def op_test_hand(body):
        room.test_hand_count(body.get("phase"), body.get("item"), body.get("form"),
                             body.get("counts"))

    ops = {"open": op_open, "lock": lambda b: room.lock(), "extend": op_seconds("extend"),
           "revote": op_seconds("revote"), "reveal": op_reveal,
           "hand": lambda b: room.hand_count(b.get("counts")), "hide": op_hide,
           "words": lambda b: room.set_words(b.get("words")), "test/start": lambda b: room.start_test(b.get("phase")),
           "test/stop": lambda b: room.stop_test(), "test/hand": op_test_hand}
    for name, fn in ops.items():
        router.add_api_route(f"{TEACHER}/{name}", teacher_op(fn), methods=["POST"])

    @router.get(TEACHER + "/words")
    async def words():
        return {"words": room.words}

    @router.get(TEACHER + "/masking")
    async def masking():
        """What the projector passes every student's name through (classroom.votes.mask_name):
        the hidden phones' nicknames and the word list."""
        return room.masking()

    @router.get(TEACHER + "/export.csv")
    async def export(nicknames: int = 0):
        return PlainTextResponse(room.export_csv(with_nicknames=bool(nicknames)),
                                 media_type="text/csv; charset=utf-8")

    @router.get(TEACHER + "/gains")
    async def gains(request: Request):
        return gains_report(room, _lang(request), lessons)

    return router


def hand_form_means(pre: dict, post: dict, forms) -> dict:
    """Each form's share right on each test from hand counts (item -> form -> counts per
    choice): {"A": {"pre", "post", "n_pre": None, "n_post": None}, "B": ...}, None where a
    form was not counted. A count has answers, not students: no n, and no orders."""
    out = {}
    for f in ("A", "B"):
        v = {}
        for ph, hand in (("pre", pre), ("post", post)):
            counted = [(c[forms.form(f)[i].correct], sum(c)) for i, by in hand.items()
                       for g, c in by.items() if g == f]
            n = sum(a for _, a in counted)
            v[ph] = 100.0 * sum(r for r, _ in counted) / n if n else None
            v["n_" + ph] = None
        out[f] = v
    return out


def gains_report(room: Classroom, lang: str, lessons: Lessons | None = None) -> dict:
    """The summary page's numbers: from matched phones, else from hand counts. `lessons`
    names the test's items and the misconceptions (default: the packaged `lessons`)."""
    import math

    result = class_gains(**room.test_tables()._asdict())
    source = "phones"
    if not result["matched"] and room.forms is not None:
        hp, hq = room.tests.get("pre"), room.tests.get("post")
        if hp and hq and hp.hand and hq.hand:
            def tally(t):
                out = {}
                for i, by_form in t.hand.items():
                    right = sum(c[room.forms.form(f)[i].correct] for f, c in by_form.items())
                    out[i] = (right, sum(sum(c) for c in by_form.values()))
                return out
            result, source = hand_gains(tally(hp), tally(hq)), "hand"
            result["forms"] = hand_form_means(hp.hand, hq.hand, room.forms)
    lessons = lessons or packaged_lessons()
    names = lessons.item_names() if room.forms is not None else {}
    mis = load_misconceptions(lessons)
    sentence = revisit_sentence(result, names, mis)
    clean = json.loads(json.dumps(result, default=lambda o: None if isinstance(o, float) and
                                  math.isnan(o) else str(o)))
    clean["items"] = {str(k): v for k, v in result["items"].items()}
    return {"source": source, "result": clean, "sentence": sentence,
            "item_names": {str(k): v[lang] for k, v in names.items()},
            "misconception_names": {k: v[lang] for k, v in mis.items()},
            "summary": summary_markdown(result, sentence, names, mis, lang)}
