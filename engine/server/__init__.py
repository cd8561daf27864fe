"""ServeLab's server: one engine shared by many clients over OpenAI's HTTP API.

`app.py` (`create_app`: state, middleware, error handlers, routers), `state.py` (`ServerState`:
settings, the stepping loop, metrics, admission; `ServerSettings`), `routes/` (one router per
concern: `openai.py`, `steps.py`, `engine_switch.py`), `limits.py` (API key and body size),
`errors.py` (OpenAI's error body for every error), `loop.py` (the one thread that steps the
engine, and the step stream), `protocol.py` (OpenAI's request and response shapes, the error
body), `metrics.py` (Prometheus collectors under vLLM's names). Start it with
`python -m engine.serve` (`engine/serve.py`). The class (its page, votes and gains) is the
`classroom` package's: `python -m classroom.serve` mounts it through `create_app(routers=...)`.
"""

from engine.server.app import create_app
from engine.server.state import ServerSettings, ServerState

__all__ = ["ServerSettings", "ServerState", "create_app"]
