"""The teacher's views of the engine: its step stream and its configuration.

Routes (under `/v1/servelab/`, so the teacher's admin key guards them when one is set):
- `GET /v1/servelab/steps`: the engine's StepReports as server-sent events, each with its
  `owners` map (`engine/server/loop.py` says what a viewer reads), and the engine's
  `{"type": "restart"}` events while a switch change runs; every event in order while the hub
  keeps it (a viewer that falls far behind skips ahead), an `: idle` comment while the engine
  has no work. `?limit=N` closes after N events. The stream ends when the server shuts down
  (`StepHub.close`).
- `GET /v1/servelab/config`: the engine's configuration (what
  `python -m benchmarks.load --compare-offline` reruns) and, under "plan", how its steps run
  (engine/plan.py; not a config field).
"""

from __future__ import annotations

import asyncio
import dataclasses

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from engine.server.protocol import APIError
from engine.server.state import ServerState

IDLE_COMMENT_S = 15.0  # a keep-alive comment this often while no step happens


def router(state: ServerState) -> APIRouter:
    r = APIRouter()
    hub = state.loop.hub

    @r.get("/v1/servelab/config")
    async def engine_config():
        eng = state.loop.engine  # the engine now (after swaps)
        return {**dataclasses.asdict(eng.config), "plan": eng.plan.as_dict()}

    @r.get("/v1/servelab/steps")
    async def steps(request: Request, limit: int = 0):
        """Server-sent events: one JSON object per engine step (newest first if behind)."""
        if not state.settings.step_stream:
            raise APIError(404, "this server runs without a step stream (--no-step-stream); "
                                "read /metrics", "not_found_error")
        if limit < 0:
            raise APIError(400, "limit must be >= 0 (0: no limit)", param="limit")
        # subscribe now, so a viewer that has its headers sees every step from here on
        key, ev = hub.subscribe(asyncio.get_running_loop())

        async def events():
            sent, last = 0, None
            try:
                while (not limit or sent < limit) and not hub.closed:
                    try:
                        await asyncio.wait_for(ev.wait(), IDLE_COMMENT_S)
                    except asyncio.TimeoutError:
                        yield ": idle\n\n"
                        continue
                    ev.clear()
                    if hub.closed:  # the server is shutting down: this stream ends
                        break
                    for seq, payload in hub.since(last):
                        if limit and sent >= limit:
                            break
                        last = seq
                        yield f"data: {payload}\n\n"
                        sent += 1
            finally:
                hub.unsubscribe(key)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 background=BackgroundTask(hub.unsubscribe, key))

    return r
