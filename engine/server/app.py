"""`create_app`: the FastAPI app over one engine, assembled from the server's parts.

It builds the one `ServerState` (settings, stepping loop, metrics, admission), adds the
limits middleware (`limits.py`: API key, body size) and the error handlers (`errors.py`:
OpenAI's error body, never a traceback), and includes one router per concern:
`routes/openai.py` (OpenAI's API), `routes/steps.py` (the teacher's views of the engine) and
`routes/engine_switch.py` (the switch: a new engine inside the running server). Whoever
starts the server may mount more through `routers`: the class server
(`python -m classroom.serve`) mounts the classroom's that way, so nothing here imports it.
The stepping loop starts and stops with the app.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from engine.server.errors import add_error_handlers
from engine.server.limits import OPEN_PATHS, Limits
from engine.server.routes import engine_switch, openai, steps
from engine.server.state import ServerSettings, ServerState

__all__ = ["RouterFactory", "ServerSettings", "create_app"]

# a router over the server's state; its `open_paths` attribute, if any, names the paths it
# serves without a key (the students' page)
RouterFactory = Callable[[ServerState], APIRouter]


def create_app(engine, settings: ServerSettings | None = None, engine_factory=None,
               routers: Iterable[RouterFactory] = ()) -> FastAPI:
    """The FastAPI app over `engine`. The stepping loop starts and stops with the app.
    `engine_factory(config)` builds the engine a switch change asks for (default: an
    `LLMEngine` of that configuration). `routers`: more routers to mount, each built from
    the server's state (`router(state) -> APIRouter`)."""
    state = ServerState(engine, settings or ServerSettings(),
                        engine_factory=engine_factory or _build_engine)

    @asynccontextmanager
    async def lifespan(app):
        state.loop.start()
        yield
        state.loop.stop()

    app = FastAPI(title="ServeLab", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    # tests and tools reach the loop (`app.state.loop.call`) and the rest through these
    app.state.server = state
    app.state.loop, app.state.metrics, app.state.settings = (state.loop, state.metrics,
                                                             state.settings)
    mounted = [openai.router(state), steps.router(state), engine_switch.router(state),
               *(make(state) for make in routers)]
    open_paths = tuple(dict.fromkeys(
        [*OPEN_PATHS, *(p for r in mounted for p in getattr(r, "open_paths", ()))]))
    app.add_middleware(Limits, settings=state.settings, metrics=state.metrics,
                       open_paths=open_paths)
    add_error_handlers(app, state.metrics)
    for r in mounted:
        app.include_router(r)
    return app


def _build_engine(config):
    from engine.engine import LLMEngine

    return LLMEngine(config)
