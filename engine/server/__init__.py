"""ServeLab's server: one engine shared by many clients over OpenAI's HTTP API.

`app.py` (FastAPI routes and limits), `loop.py` (the one thread that steps the engine, and
the step stream), `protocol.py` (OpenAI's request and response shapes, the error body),
`metrics.py` (Prometheus collectors under vLLM's names). Start it with
`python -m engine.serve` (`engine/serve.py`).
"""

from engine.server.app import ServerSettings, create_app

__all__ = ["ServerSettings", "create_app"]
