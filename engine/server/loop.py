"""The one stepping thread: the only code that touches the LLMEngine while the server runs.

Chapter 6.4's engine serves many people by stepping one batch for all of them; a server
that gave each HTTP request its own engine, or let two engines step at once on the same
cores, would throw that away. So, as in vLLM's engine core, one thread owns the engine:

- HTTP handlers (asyncio, uvicorn's thread) never call the engine. They put commands on a
  thread-safe queue: `submit(ticket)` (add a request), `abort(request_id)` (its client went
  away), `call(fn)` (run fn(engine) here and return its result: tests and admin views).
- The thread drains every waiting command, steps the engine while it has work, and hands
  each request's new tokens and text to that request's asyncio queue with
  `loop.call_soon_threadsafe` (one hand-over per request per step). With no work it blocks
  on the command queue: an idle server uses no CPU.
- Tokenizing the prompt and applying the chat template happen here too (the tokenizer is
  not shared across threads), so a bad prompt comes back to its handler as an `APIError`
  before any byte of the response is sent.
- An engine error fails the requests it concerns with a clear message; the loop goes on.

The step stream (`StepHub`, served as `GET /v1/servelab/steps`): after each step, if anyone
watches, the report becomes one JSON object: `StepReport.to_dict()` plus
`"owners": {request_id: {"user": <OpenAI's "user" field, or the client's address>,
"kind": "simulated" | "person"}}` for every request the report names (seats, queue, KV
block tables, emitted, finished, aborted). `kind` is "simulated" when the user name starts
with "sim-" (what `python -m engine.load` sends), so a viewer can draw simulated riders
apart from people. A viewer that falls behind is not queued a backlog: it gets the newest
report when it is ready again (step numbers then skip).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import queue
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field

from engine.config import SamplingParams
from engine.server.protocol import APIError, finish_reason

log = logging.getLogger("servelab.server")

SIMULATED_PREFIX = "sim-"


def user_kind(user: str) -> str:
    return "simulated" if user.startswith(SIMULATED_PREFIX) else "person"


@dataclass
class Delta:
    """What one step (or the admission) gives one request's handler."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # the engine's reason, once finished
    error: APIError | None = None
    accepted: bool = False  # the first delta: the request is in the engine
    prompt_token_ids: list[int] | None = None  # with `accepted`
    max_tokens: int | None = None  # with `accepted`: the resolved budget


@dataclass
class Ticket:
    """One request as its handler and the loop share it."""

    request_id: str
    params: SamplingParams  # max_tokens may be replaced once the prompt length is known
    user: str
    aloop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    prompt: str | list[int] | None = None  # completions: text or token ids
    messages: list[dict] | None = None  # chat: run through the chat template
    max_tokens: int | None = None  # None: what the model length leaves, up to the cap
    arrival: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_output_tokens: int = 0

    @property
    def kind(self) -> str:
        return user_kind(self.user)


class StepHub:
    """The newest step report, for any number of viewers, without a backlog."""

    def __init__(self):
        self._lock = threading.Lock()
        self._subs: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._next = 0
        self.latest: tuple[int, str] | None = None  # (step, JSON)

    @property
    def watched(self) -> bool:
        return bool(self._subs)

    def subscribe(self, aloop: asyncio.AbstractEventLoop) -> tuple[int, asyncio.Event]:
        ev = asyncio.Event()
        with self._lock:
            key = self._next
            self._next += 1
            self._subs[key] = (aloop, ev)
            if self.latest is not None:
                ev.set()  # a new viewer sees the current state at once
        return key, ev

    def unsubscribe(self, key: int) -> None:
        with self._lock:
            self._subs.pop(key, None)

    def publish(self, step: int, payload: str) -> None:
        with self._lock:
            self.latest = (step, payload)
            subs = list(self._subs.values())
        for aloop, ev in subs:
            try:
                aloop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # that viewer's event loop is closed
                pass


class EngineLoop:
    def __init__(self, engine, metrics=None, max_tokens_cap: int | None = None):
        self.engine = engine
        self.metrics = metrics
        self.max_tokens_cap = max_tokens_cap or engine.config.max_model_len
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.tickets: dict[str, Ticket] = {}  # unfinished requests in the engine
        self.owners: dict[str, dict] = {}  # request id -> {"user", "kind"} while it is drawn
        self.hub = StepHub()
        # engine/recording.py's Recorder: every step's report with its owners, when set
        self.recorder = None
        # recent aborts: {"request_id", "received_step" (steps done when the abort came),
        # "freed_step" (the step whose report lists it)}: how fast a disconnect frees blocks
        self.abort_log: deque[dict] = deque(maxlen=1024)
        self._aborting: dict[str, dict] = {}
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._stopping = False

    # --- called from other threads ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self.commands.put(("stop",))
        self._thread.join(timeout)

    def submit(self, ticket: Ticket) -> None:
        self.commands.put(("add", ticket))

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))

    def call(self, fn) -> concurrent.futures.Future:
        """Run fn(engine) on the loop thread, between steps; the future holds its result."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.commands.put(("call", fn, fut))
        return fut

    # --- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            try:
                self._iteration()
            except Exception:
                # a bug of ours, not the engine's (that is caught in _step): never leave a
                # handler waiting for a loop that died. Fail what is in flight and go on.
                log.error("engine loop error:\n%s", traceback.format_exc())
                self._fail_all(APIError(500, "internal error in the server's engine loop",
                                        "server_error"))
        for t in list(self.tickets.values()):  # shutting down: nobody is left waiting
            self._deliver(t, Delta(error=APIError(503, "the server is shutting down",
                                                  "server_error")))

    def _iteration(self) -> None:
        # an abort alone is work too: the next step's report lists it, for the viewers
        busy = self.engine.has_unfinished() or bool(self._aborting)
        try:
            # idle: sleep until a command comes (no busy spin); busy: just look
            cmd = self.commands.get(block=not busy)
        except queue.Empty:
            cmd = None
        while cmd is not None:
            self._handle(cmd)
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                cmd = None
        if not self._stopping and (self.engine.has_unfinished() or self._aborting):
            self._step()

    def _fail_all(self, err: APIError) -> None:
        """Every request in the engine fails with err and leaves it."""
        eng = self.engine
        for rid, t in list(self.tickets.items()):
            self._deliver(t, Delta(error=err))
            try:
                eng.abort_request(rid)
            except Exception:  # the engine's state is suspect; the request is dropped
                log.error("abort of %s failed:\n%s", rid, traceback.format_exc())
            self.tickets.pop(rid)
            eng.requests.pop(rid, None)  # dropped even if its abort failed
        self._aborting.clear()

    def _handle(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "stop":
            self._stopping = True
        elif kind == "add":
            self._add(cmd[1])
        elif kind == "abort":
            rid = cmd[1]
            req = self.engine.requests.get(rid)
            if rid in self.tickets and req is not None and not req.is_finished:
                self.engine.abort_request(rid)  # seat and blocks are free from now on
                entry = {"request_id": rid, "received_step": self.engine.step_count,
                         "freed_step": None}
                self.abort_log.append(entry)
                self._aborting[rid] = entry
        elif kind == "call":
            fn, fut = cmd[1], cmd[2]
            try:
                fut.set_result(fn(self.engine))
            except Exception as exc:  # the caller sees it; the loop goes on
                fut.set_exception(exc)

    def _prompt_ids(self, t: Ticket) -> list[int]:
        eng = self.engine
        if t.messages is not None:
            # as LLMEngine.chat: the model's own chat template, ending where the answer starts
            ids = eng.tokenizer.apply_chat_template(t.messages, add_generation_prompt=True,
                                                    tokenize=True)
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        return eng.tokenize(t.prompt)

    def _add(self, t: Ticket) -> None:
        eng = self.engine
        max_len = eng.config.max_model_len
        try:
            ids = self._prompt_ids(t)
        except ValueError as exc:
            self._deliver(t, Delta(error=APIError(400, str(exc), param="prompt")))
            return
        except Exception as exc:  # e.g. a chat template that rejects the messages
            self._deliver(t, Delta(error=APIError(400, f"cannot read the prompt: {exc}",
                                                  param="messages")))
            return
        room = max_len - len(ids)
        if room < 1:
            self._deliver(t, Delta(error=APIError(
                400, f"the prompt is {len(ids)} tokens; this server's max_model_len is "
                     f"{max_len}, so a prompt may have at most {max_len - 1}",
                param="prompt", code="context_length_exceeded")))
            return
        max_tokens = t.max_tokens if t.max_tokens is not None else min(room,
                                                                       self.max_tokens_cap)
        if max_tokens > room:
            self._deliver(t, Delta(error=APIError(
                400, f"max_tokens={max_tokens} plus the prompt's {len(ids)} tokens exceeds "
                     f"this server's max_model_len of {max_len}; ask for at most {room}",
                param="max_tokens", code="context_length_exceeded")))
            return
        t.params.max_tokens = max_tokens
        try:
            eng.add_request(ids, t.params, request_id=t.request_id, arrival_time=t.arrival)
        except ValueError as exc:
            self._deliver(t, Delta(error=APIError(400, str(exc), param="prompt")))
            return
        self.tickets[t.request_id] = t
        self.owners[t.request_id] = {"user": t.user, "kind": t.kind}
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(ids))
        self._deliver(t, Delta(accepted=True, prompt_token_ids=ids, max_tokens=max_tokens))

    def _step(self) -> None:
        eng = self.engine
        try:
            report = eng.step()
        except Exception as exc:
            # a step runs everyone's tokens in one forward: fail the requests in the engine,
            # keep the loop (and the server) alive for the next ones
            log.error("engine step failed:\n%s", traceback.format_exc())
            self._fail_all(APIError(500, f"the engine failed while running this request: "
                                         f"{exc}", "server_error"))
            return
        now = time.perf_counter()
        out: dict[str, Delta] = {}
        for e in report.emitted:
            t = self.tickets.get(e.request_id)
            if t is None:
                continue
            d = out.setdefault(e.request_id, Delta())
            d.token_ids.extend(e.token_ids)
            d.text += e.text
            if e.token_ids:
                self._observe_tokens(t, len(e.token_ids), now)
        finishing: dict[str, Ticket] = {}
        for rid in report.finished:
            t = self.tickets.pop(rid, None)
            req = eng.requests.get(rid)
            if t is None or req is None:
                continue
            eng.forget(rid)  # keep the server's memory flat
            finishing[rid] = t
            d = out.setdefault(rid, Delta())
            d.finish_reason = req.finish_reason
            if req.finish_reason == "eos" and d.token_ids:
                # the end-of-sequence token ends the answer; its text is not part of it
                # (its id stays in token_ids and in usage, as in vLLM)
                d.text = d.text.removesuffix(eng.tokenizer.decode(d.token_ids[-1:]))
            if self.metrics is not None:
                self.metrics.e2e.observe(now - t.arrival)
                self.metrics.on_finish(finish_reason(req.finish_reason) or "unknown")
        for rid in report.aborted:
            self.tickets.pop(rid, None)
            eng.forget(rid)
            if (entry := self._aborting.pop(rid, None)) is not None:
                entry["freed_step"] = report.step
        # the gauges first: a client that has its answer reads /metrics of this step
        if self.metrics is not None:
            sched, alloc = eng.scheduler, eng.allocator
            self.metrics.on_step(report, sum(1 for r in sched.running if not r.idle_finished),
                                 len(sched.waiting),
                                 1 - alloc.num_free_blocks / alloc.num_blocks)
        self._deliver_many([(t, d) for rid, d in out.items()
                            if (t := self.tickets.get(rid) or finishing.get(rid)) is not None])
        if self.hub.watched:
            self.hub.publish(report.step, self._step_json(report))
        if self.recorder is not None:
            self.recorder.report(self._step_dict(report))
        # forget owners of requests that left and hold no seat (static riders keep theirs)
        seated = {s.request_id for s in report.seats if s.request_id is not None}
        for rid in [*report.finished, *report.aborted]:
            if rid not in seated:
                self.owners.pop(rid, None)
        for rid in [r for r in self.owners if r not in seated and r not in self.tickets]:
            self.owners.pop(rid, None)

    def _observe_tokens(self, t: Ticket, n: int, now: float) -> None:
        m = self.metrics
        if t.first_token_time is None:
            t.first_token_time = now
            if m is not None:
                m.ttft.observe(now - t.arrival)
        elif m is not None:
            m.itl.observe(now - t.last_token_time)
        t.last_token_time = now
        t.num_output_tokens += n
        if m is not None:
            m.generation_tokens.inc(n)

    def _step_json(self, report) -> str:
        return json.dumps(self._step_dict(report), ensure_ascii=False)

    def _step_dict(self, report) -> dict:
        d = report.to_dict()
        named = set(d["waiting"]) | set(d["kv"]["block_tables"]) | set(report.finished)
        named |= set(report.aborted) | {e.request_id for e in report.emitted}
        named |= {s.request_id for s in report.seats if s.request_id is not None}
        d["owners"] = {rid: self.owners[rid] for rid in named if rid in self.owners}
        return d

    @staticmethod
    def _deliver_many(pairs: list[tuple[Ticket, Delta]]) -> None:
        """One step's deltas, handed over with one wake-up per event loop (not one per
        request): with hundreds of streams, each wake-up of the HTTP thread takes the GIL
        from this one."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Delta]]] = {}
        for t, d in pairs:
            by_loop.setdefault(t.aloop, []).append((t.queue, d))
        for aloop, items in by_loop.items():
            try:
                aloop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop is gone (server shutting down)
                pass

    @staticmethod
    def _deliver(t: Ticket, d: Delta) -> None:
        try:
            t.aloop.call_soon_threadsafe(t.queue.put_nowait, d)
        except RuntimeError:  # the handler's event loop is gone (server shutting down)
            pass


def _put_all(items: list[tuple[asyncio.Queue, Delta]]) -> None:
    for q, d in items:
        q.put_nowait(d)
