"""`create_app`: the FastAPI app over one engine, assembled from the server's parts.

It builds the one `ServerState` (settings, stepping loop, metrics, admission), adds the
limits middleware (`limits.py`: API key, body size) and the error handlers (`errors.py`:
OpenAI's error body, never a traceback), and includes one router per concern:
`routes/openai.py` (OpenAI's API), `routes/steps.py` (the teacher's views of the engine) and
`routes/classroom.py` (the students' page; this file's one line that mounts it is the only
place the class touches the server). The stepping loop starts and stops with the app.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from engine.server.errors import add_error_handlers
from engine.server.limits import Limits
from engine.server.routes import engine_switch, openai, steps
from engine.server.state import ServerSettings, ServerState

__all__ = ["ServerSettings", "create_app"]


def create_app(engine, settings: ServerSettings | None = None, engine_factory=None) -> FastAPI:
    """The FastAPI app over `engine`. The stepping loop starts and stops with the app.
    `engine_factory(config)` builds the engine a switch change asks for (default: an
    `LLMEngine` of that configuration)."""
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
    app.add_middleware(Limits, settings=state.settings, metrics=state.metrics)
    add_error_handlers(app, state.metrics)
    app.include_router(openai.router(state))
    app.include_router(steps.router(state))
    app.include_router(engine_switch.router(state))
    from classroom import server as classroom  # imports engine.server: here, not at the top

    app.include_router(classroom.router(state))  # the class: its page, its ask route
    return app


def _build_engine(config):
    from engine.engine import LLMEngine

    return LLMEngine(config)
