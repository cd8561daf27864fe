"""The server's routers, one module per concern; each exports `router(state) -> APIRouter`.

`openai.py` (OpenAI's API: completions, chat, models, health, metrics), `steps.py` (the
teacher's views: the step stream and the engine's configuration), `classroom.py` (the
students' page and its ask route, mounted by one line of `create_app`; it includes
`votes.py`, the class's votes and pre/post test).
"""
