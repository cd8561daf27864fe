"""The server's routers, one module per concern; each exports `router(state) -> APIRouter`.

`openai.py` (OpenAI's API: completions, chat, models, health, metrics), `steps.py` (the
teacher's views: the step stream and the engine's configuration), `engine_switch.py` (a new
engine inside the running server). The class's routers live in the `classroom` package and
are mounted by whoever starts the class server (`create_app(routers=...)`).
"""
