"""The one stepping thread: the only code that touches the LLMEngine while the server runs.

Chapter 6.4's engine serves many people by stepping one batch for all of them; a server
that gave each HTTP request its own engine, or let two engines step at once on the same
cores, would throw that away. So, as in vLLM's engine core, one thread owns the engine:

- HTTP handlers (asyncio, uvicorn's thread) never call the engine. They put commands on a
  thread-safe queue: `submit(ticket)` (add a request), `abort(request_id)` (its client went
  away), `call(fn)` (run fn(engine) here and return its result: tests and admin views).
- The thread drains every waiting command, steps the engine while it has work, and hands
  each request's new tokens and text to that request's asyncio queue with
  `loop.call_soon_threadsafe` (one wake-up of the HTTP thread per step). With no work it
  blocks on the command queue: an idle server uses no CPU. A step reads: step the engine,
  process its report (`OutputProcessor`, outputs.py: one `Delta` per ticket, finishes,
  failures, aborts), deliver, publish (the step stream, the recorder).
- When a step's tokens are handed over: as the next step's forward starts (the engine's
  `on_forward` hook), or at once when no forward follows (the engine idle, a step with
  nothing to run, an error or any other hand-over, which keeps every request's order). The
  HTTP thread then sends them while the forward runs without the GIL. Handed over at the
  step's end, they woke the HTTP thread just as the next step laid out its inputs in
  Python, and each side waited for the other's GIL
  (docs/decisions.md#stepping-thread-and-the-gil).
- Tokenizing the prompt and applying the chat template do NOT happen here: their cost grows
  with the prompt's size, and this thread steps everyone. The handler does them first, on a
  worker thread with its own copy of the tokenizer (`ServerState.prompt_ids`), and the
  ticket arrives with `prompt_ids`; an over-long prompt is refused there with its 400 before
  this thread sees it. What is left here per request is bounded by `max_model_len`.
- `max_step_gap`: the longest time between the end of one step and the start of the next
  while the engine had work (commands, hand-overs, the step stream's JSON): the time this
  thread made everyone wait for something other than the model. Tests read it.
- An engine error fails the requests it concerns with a clear message; the loop goes on.
  A failure of one request's own sampling or detokenizing (the report's `failures`) fails
  that request alone: its handler gets OpenAI's error body, the metric
  `servelab:request_errors_total` counts it, the others keep stepping.

The step stream (`StepHub`, served as `GET /v1/servelab/steps`): after each step, if anyone
watches, the report becomes one JSON object: `StepReport.to_dict()` plus
`"owners": {request_id: {"user": <OpenAI's "user" field, or the client's address>,
"kind": "simulated" | "person"}}` for every request the report names (seats, queue, KV
block tables, emitted, finished, aborted). `kind` is "simulated" when the user name starts
with "sim-" (what `python -m benchmarks.load` sends), so a viewer can draw simulated riders
apart from people. The hub keeps the last `HUB_BACKLOG` events, so a viewer that redraws
slower than the engine steps still gets every step (the projector must not lose a student
who held a seat for one step); one that falls further behind skips to the oldest kept.

Switching the engine inside the running server (`swap`): the class keeps its address and join
code while the teacher flips a switch. The loop stops admitting (new requests wait in
`held`, their handlers still waiting for admission), steps the requests in flight until they
end or the drain's bound passes (or at once, with abort), fails the rest with
`engine_restarting` (a phone asks again by itself), builds the new engine with `factory`,
and then admits the held requests to it. The step stream carries `{"type": "restart",
"phase": ...}` events all along (draining with its countdown, building, serving or failed);
`swap_status` is the same for a poller. If the new engine cannot be built the old one goes
on serving and the status says why.

A request marked `journey` (a student's) gets its own slice of each step's report with its
deltas: where it is (at the door and why, or its seat), its page table, the prefix blocks it
shares (a count), its drafts' verdicts, the step of its tokens. Nothing in that slice names
or measures another request. The loop also adds each step to such a ticket's `Timeline`
(engine/waits.py): its stretches, with ms since its arrival.

Besides the recorder and the tracer (`report(dict)`, the step's dict built once for them and
the step stream), `sinks` takes more listeners that read the StepReport itself
(`report(step_report)`: the class server's `RecentSteps`, for its trace download), so a
server nobody watches builds no dict for them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import queue
import threading
import time
import traceback
from collections import deque

from engine.server.outputs import (
    SIMULATED_PREFIX,
    Delta,
    OutputProcessor,
    StepOutputs,
    Ticket,
    TokenText,
)
from engine.server.protocol import APIError
from engine.waits import PRIVATE_FIELDS

log = logging.getLogger("servelab.server")

# Delta, Ticket and SIMULATED_PREFIX live in outputs.py; the routes import them from here too
__all__ = ["HUB_BACKLOG", "SIMULATED_PREFIX", "Delta", "EngineLoop", "StepHub", "Ticket",
           "own_wait"]

HUB_BACKLOG = 512  # step-stream events kept for viewers that fall behind


class StepHub:
    """The step stream's recent events, for any number of viewers, each at its own pace."""

    def __init__(self, backlog: int = HUB_BACKLOG):
        self._lock = threading.Lock()
        self._subs: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        self._next = 0
        self._seq = 0
        self._buf: deque[tuple[int, str]] = deque(maxlen=backlog)
        self.latest: tuple[int, str] | None = None  # (sequence number, JSON)
        self.closed = False  # the server is shutting down: every viewer's stream ends

    @property
    def watched(self) -> bool:
        return bool(self._subs)

    def close(self) -> None:
        """End every viewer's stream (shutdown): each is woken and sees `closed`."""
        self.closed = True
        with self._lock:
            subs = list(self._subs.values())
        for aloop, ev in subs:
            try:
                aloop.call_soon_threadsafe(ev.set)
            except RuntimeError:
                pass

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

    def since(self, seq: int | None) -> list[tuple[int, str]]:
        """Events after sequence number `seq` (None: only the newest), oldest first."""
        with self._lock:
            if seq is None:
                return [self.latest] if self.latest is not None else []
            return [e for e in self._buf if e[0] > seq]

    def publish(self, step: int, payload: str) -> None:
        with self._lock:
            self._seq += 1
            self.latest = (self._seq, payload)
            self._buf.append(self.latest)
            subs = list(self._subs.values())
        for aloop, ev in subs:
            try:
                aloop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # that viewer's event loop is closed
                pass


class EngineLoop:
    def __init__(self, engine, metrics=None, max_tokens_cap: int | None = None,
                 factory=None):
        self.engine = engine
        self.factory = factory  # EngineConfig -> engine: what `swap` builds with
        self.metrics = metrics
        self.max_tokens_cap = max_tokens_cap or engine.config.max_model_len
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.tickets: dict[str, Ticket] = {}  # unfinished requests in the engine
        self.owners: dict[str, dict] = {}  # request id -> {"user", "kind"} while it is drawn
        self.hub = StepHub()
        self.recorder = None  # a Recorder (engine/recording.py): every step, with who asked
        self.tracer = None  # a TraceWriter (engine/trace.py): every step, as a trace
        self.sinks: list = []  # more, reading the StepReport itself: the class's RecentSteps
        # recent aborts: {"request_id", "received_step" (steps done when the abort came),
        # "freed_step" (the step whose report lists it)}: how fast a disconnect frees blocks
        self.abort_log: deque[dict] = deque(maxlen=1024)
        self._aborting: dict[str, dict] = {}
        self.max_step_gap = 0.0  # seconds; see the module's docstring
        self._last_step_end: float | None = None  # None: the engine was idle since
        # the last step's deltas, handed over as the next forward starts (see the docstring)
        self._pending: list[tuple[Ticket, Delta]] = []
        # each step's report -> its tickets' deltas (engine/server/outputs.py)
        self.outputs = OutputProcessor(TokenText(engine.tokenizer), metrics)
        engine.on_forward = self._hand_over
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._stopping = False
        self.generation = 0  # engines built by `swap`
        self._swap: dict | None = None  # the switch change under way (loop thread)
        self.held: list[Ticket] = []  # requests that came while it was under way
        self.swap_status: dict = {"phase": "serving", "generation": 0}  # for pollers

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

    def swap(self, config, abort: bool = False, drain_s: float = 60.0) -> None:
        """Change the engine to one built from `config`, keeping the server: finish the
        requests in flight (up to `drain_s` seconds) or, with `abort`, cut them now."""
        if self.factory is None:
            raise APIError(501, "this server cannot change its engine (no engine factory)",
                           "server_error")
        if self.swap_status["phase"] != "serving" and self.swap_status["phase"] != "failed":
            raise APIError(409, "a switch change is already under way; wait for it",
                           code="restart_in_progress")
        self.swap_status = {"phase": "draining", "generation": self.generation,
                            "abort": abort, "drain_s": 0.0 if abort else drain_s,
                            "seconds_left": 0.0 if abort else drain_s,
                            "in_flight": len(self.tickets)}
        self.commands.put(("swap", config, abort, drain_s))

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
        # shutting down: nobody is left waiting, and the engine is left empty (its requests
        # aborted and forgotten, their blocks free) for whoever uses it next
        bye = APIError(503, "the server is shutting down", "server_error")
        self._fail_all(bye)
        for t in self.held:
            self._deliver(t, Delta(error=bye))

    def _iteration(self) -> None:
        # an abort alone is work too: the next step's report lists it, for the viewers
        busy = self.engine.has_unfinished() or bool(self._aborting) or self._swap is not None
        try:
            # idle: sleep until a command comes (no busy spin); busy: just look
            cmd = self.commands.get(block=not busy)
        except queue.Empty:
            cmd = None
        if not busy:
            self._last_step_end = None  # it waited for work: not a gap between steps
        while cmd is not None:
            self._handle(cmd)
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                cmd = None
        if self._stopping:
            return
        if self._swap is not None:
            self._swap_step()
        elif self.engine.has_unfinished() or self._aborting:
            self._step()
        if not self.engine.has_unfinished():  # no forward follows to hand the tokens over
            self._hand_over()

    # --- changing the engine -----------------------------------------------------------------
    def _restart_event(self, **status) -> None:
        """The swap's state for pollers and, as one event, for the step stream's viewers."""
        self.swap_status = {**status, "generation": self.generation}
        self.hub.publish(-1, json.dumps({"type": "restart", **self.swap_status}))

    def _swap_step(self) -> None:
        sw = self._swap
        left = sw["deadline"] - time.monotonic()
        if self.engine.has_unfinished() and left > 0:
            if time.monotonic() >= sw["next_event"]:  # the countdown, twice a second
                sw["next_event"] = time.monotonic() + 0.5
                self._restart_event(phase="draining", abort=sw["abort"], drain_s=sw["drain_s"],
                                    seconds_left=round(left, 1), in_flight=len(self.tickets))
            self._step()
            return
        cut = APIError(503, "the teacher changed a switch: the engine is restarting; ask "
                            "again in a moment", "server_error", code="engine_restarting",
                       headers={"Retry-After": "2"})
        n_cut = len(self.tickets)
        for rid, t in list(self.tickets.items()):
            self._deliver(t, Delta(error=cut))
            with contextlib.suppress(Exception):
                self.engine.abort_request(rid)
            self.engine.requests.pop(rid, None)
        self.tickets.clear()
        self._aborting.clear()
        self.owners.clear()
        self._hand_over()  # before the build's seconds
        self._restart_event(phase="building", cut=n_cut, config=_jsonable(sw["config"]))
        old = self.engine
        try:
            new = self.factory(sw["config"])
        except Exception as exc:  # the old engine goes on serving; the status says why
            log.error("building the new engine failed:\n%s", traceback.format_exc())
            self._swap = None
            self._restart_event(phase="failed", error=f"{type(exc).__name__}: {exc}")
        else:
            self.engine = new
            del old
            self.outputs = OutputProcessor(TokenText(new.tokenizer), self.metrics)
            new.on_forward = self._hand_over
            self.generation += 1
            self._swap = None
            self._restart_event(phase="serving", config=_jsonable(new.config))
        held, self.held = self.held, []
        for t in held:
            self._add(t)

    def _fail_all(self, err: APIError) -> None:
        """Every request in the engine fails with err and leaves it (the tokens of the last
        step are handed over first: those that finished in it get their answers)."""
        self._hand_over()
        eng = self.engine
        for rid, t in list(self.tickets.items()):
            self._deliver(t, Delta(error=err))
            try:
                eng.abort_request(rid)
            except Exception:  # the engine's state is suspect; the request is dropped
                log.error("abort of %s failed:\n%s", rid, traceback.format_exc())
            self.tickets.pop(rid)
            self.outputs.drop(rid)
            for sid in eng.sample_ids(rid):  # dropped even if its abort failed
                eng.requests.pop(sid, None)
            eng.groups.pop(rid, None)
        self._aborting.clear()

    def _handle(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "stop":
            self._stopping = True
        elif kind == "add":
            if self._swap is not None:
                self.held.append(cmd[1])  # admitted once the new engine is up
            else:
                self._add(cmd[1])
        elif kind == "swap":
            _, config, abort, drain_s = cmd
            self._swap = {"config": config, "abort": abort, "drain_s": drain_s,
                          "deadline": time.monotonic() + (0.0 if abort else drain_s),
                          "next_event": 0.0}
        elif kind == "abort":
            rid = cmd[1]
            self.held = [t for t in self.held if t.request_id != rid]
            known = rid in self.engine.requests or rid in self.engine.groups
            if rid in self.tickets and known and not self.engine.is_finished(rid):
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
        if t.prompt_ids is not None:
            return t.prompt_ids
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
        max_tokens = t.max_tokens if t.max_tokens is not None else min(
            room, self.max_tokens_cap, t.default_max_tokens or self.max_tokens_cap)
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
        t.open_samples = t.params.n
        t.arrival_step = eng.step_count
        sids = eng.sample_ids(t.request_id)
        self.outputs.add(t, sids, ids)
        for sid in sids:
            self.owners[sid] = {"user": t.user, "kind": t.kind}
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(ids))
        text = eng.tokenizer.decode(ids) if t.echo and not isinstance(t.prompt, str) else None
        self._deliver(t, Delta(accepted=True, prompt_token_ids=ids, max_tokens=max_tokens,
                               prompt_text=text))

    def _step(self) -> None:
        """One engine step: step, process (the report -> each ticket's deltas), deliver (what
        cannot wait now; the tokens as the next forward starts), publish."""
        start = time.perf_counter()
        if self._last_step_end is not None:
            self.max_step_gap = max(self.max_step_gap, start - self._last_step_end)
        try:
            report = self.engine.step()
        except Exception as exc:
            # a step runs everyone's tokens in one forward: fail the requests in the engine,
            # keep the loop (and the server) alive for the next ones
            log.error("engine step failed:\n%s", traceback.format_exc())
            self._fail_all(APIError(500, f"the engine failed while running this request: "
                                         f"{exc}", "server_error"))
            return
        end = time.perf_counter()
        out = self.outputs.process(report, self.tickets, end)
        self._settle(report, out)
        self._journeys(report, out, end)  # the classroom's students
        self._hand_over()  # a step that ran no forward
        self._pending = out.pairs(self.tickets)
        self._publish(report)
        # from the model's end: this thread's own hand-overs count as the pause they are
        self._last_step_end = end

    def _settle(self, report, out: StepOutputs) -> None:
        """The engine forgets the requests that left; a request that failed alone gets its
        error now; the abort log notes when each abort freed its blocks; the gauges."""
        for rid in out.done:
            with contextlib.suppress(ValueError):  # unless a sample of it still runs
                self.engine.forget(rid)
        for t, d in out.errors:
            self._deliver(t, d)
        for rid in out.aborted:
            if (entry := self._aborting.pop(rid, None)) is not None:
                entry["freed_step"] = report.step
        # the gauges before the hand-over: a client that has its answer reads /metrics of
        # this step
        if self.metrics is not None:
            self.metrics.on_step(report)

    def _publish(self, report) -> None:
        """The report, with its owners, to the step stream's viewers and the recorder; then
        the owners of requests that left and hold no seat are forgotten (static riders keep
        theirs)."""
        d = None
        if self.hub.watched:
            d = self._step_dict(report)
            self.hub.publish(report.step, json.dumps(d, ensure_ascii=False))
        sinks = [s for s in (self.recorder, self.tracer) if s is not None]
        if sinks:
            d = d if d is not None else self._step_dict(report)
            for sink in sinks:
                sink.report(d)
        for sink in self.sinks:  # they read the report itself: no dict built for them
            sink.report(report)
        seated = {s.request_id for s in report.seats if s.request_id is not None}
        for rid in [*report.finished, *report.aborted]:
            if rid not in seated:
                self.owners.pop(rid, None)
        for rid in [r for r in self.owners
                    if r not in seated and self.outputs.owner(r)[0] not in self.tickets]:
            self.owners.pop(rid, None)

    def _journeys(self, report, outputs: StepOutputs, now: float) -> None:
        """Each journey ticket's own slice of this step, added to its delta when it changed
        (a new delta when it has none). Only its own ids, blocks and counts: the set of
        shared blocks is used for a count, never sent."""
        out, finishing = outputs.deltas, outputs.finishing
        if not any(t.journey for t in self.tickets.values()) and \
                not any(t.journey for t in finishing.values()):
            return
        kv = report.kv
        seat_of = {s.request_id: s.index for s in report.seats if s.request_id is not None}
        pos = {rid: i for i, rid in enumerate(report.waiting)}
        shared = {b["block"] for b in kv.blocks if len(b["owners"]) > 1}
        spec = {rec.request_id: rec for rec in report.spec}
        state_of = {s.request_id: s.state for s in report.seats if s.request_id is not None}
        admitted, finished = set(report.admitted), set(report.finished)
        for rid, t in [*self.tickets.items(), *finishing.items()]:
            if not t.journey:
                continue
            if t.timeline is not None:  # its own stretches: the phone's and projector's view
                t.timeline.add(report.step, 1000.0 * (now - t.arrival), waiting=rid in pos,
                               seated=state_of.get(rid) not in (None, "idle-finished"),
                               admitted=rid in admitted, finished=rid in finished,
                               wait=own_wait(report.waits.get(rid)))
            view: dict = {}
            if rid in pos:
                view["door"] = {"position": pos[rid], "of": len(report.waiting)}
                wait = own_wait(report.waits.get(rid))
                if wait is not None:
                    view["door"]["wait"] = wait
                    if not t.waited_for or t.waited_for[-1] != wait["code"]:
                        t.waited_for.append(wait["code"])
                view["door"]["reasons"] = list(t.waited_for)
            elif rid in seat_of:
                if t.boarded_step is None:
                    t.boarded_step = report.step
                    # until the step that seated it began: its own prefill is not a wait
                    t.board_wait_s = max(0.0, now - report.wall_s - t.arrival)
                table = kv.block_tables.get(rid, [])
                view["seat"] = {"index": seat_of[rid], "boarded_step": t.boarded_step,
                                "waited_steps": t.boarded_step - 1 - (t.arrival_step or 0),
                                "waited_s": round(t.board_wait_s, 3),
                                "reasons": list(t.waited_for)}
                view["blocks"] = list(table)
                view["shared_blocks"] = sum(1 for b in table if b in shared)
            changed = view != t.last_view
            rec = spec.get(rid)
            if not changed and rec is None:
                continue
            t.last_view = view
            d = out.setdefault((rid, 0), Delta(index=0, step=report.step))
            d.journey = {"step": report.step, **view}
            if rec is not None:
                d.journey["drafts"] = [{"text": x.text, "accepted": x.accepted}
                                       for x in rec.drafted]

    def _step_dict(self, report) -> dict:
        d = report.to_dict()
        named = set(d["waiting"]) | set(d["kv"]["block_tables"]) | set(report.finished)
        named |= set(report.aborted) | {e.request_id for e in report.emitted}
        named |= {s.request_id for s in report.seats if s.request_id is not None}
        d["owners"] = {rid: self.owners[rid] for rid in named if rid in self.owners}
        return d

    def _hand_over(self) -> None:
        """The last step's deltas, handed over with one wake-up per event loop (not one per
        request): with hundreds of streams, each wake-up of the HTTP thread takes the GIL
        from this one."""
        pairs, self._pending = self._pending, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Delta]]] = {}
        for t, d in pairs:
            by_loop.setdefault(t.aloop, []).append((t.queue, d))
        for aloop, items in by_loop.items():
            try:
                aloop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that event loop is gone (server shutting down)
                pass

    def _deliver(self, t: Ticket, d: Delta) -> None:
        """One delta now, after the tokens still waiting (a request's order holds)."""
        self._hand_over()
        try:
            t.aloop.call_soon_threadsafe(t.queue.put_nowait, d)
        except RuntimeError:  # the handler's event loop is gone (server shutting down)
            pass


def own_wait(wait: dict | None) -> dict | None:
    """A request's wait (engine/waits.py) as its own phone may see it: its code and counts,
    without the other requests' ids (whom it waits behind, for whom it was preempted); the
    code of the request at the head of the queue stays, so the phone can say why the line
    does not move."""
    if not wait:
        return None
    return {k: v for k, v in wait.items() if k not in PRIVATE_FIELDS}


def _jsonable(config) -> dict:
    """An EngineConfig as JSON-able data (the step stream and the status carry it)."""
    import dataclasses

    try:
        return json.loads(json.dumps(dataclasses.asdict(config), default=str))
    except TypeError:
        return {}


def _put_all(items: list[tuple[asyncio.Queue, Delta]]) -> None:
    for q, d in items:
        q.put_nowait(d)
