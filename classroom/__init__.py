"""The class: ServeLab's lab for a class on phones, beside the engine (`engine/`) and the
teacher's app (`app/`). It imports the engine; the engine never imports it.

- `serve.py`: `python -m classroom.serve`, the class server (`engine.serve` with the
  classroom's routers mounted and the course loaded as data).
- `server.py`: the students' routes (`/class`, `/class/ask`, reattaching to an answer, the
  teacher's question list), mounted through `create_app(routers=...)`; `page.py` and
  `static/`: the students' page as static files.
- `votes.py` (rounds, ballots, the pre/post test; pure Python; `Lessons`: what it reads of
  the course), `vote_routes.py` (the votes over HTTP, one handler for a refused vote),
  `gains.py` (Hake's g, d_z, right-to-wrong).
- `client.py`: the teacher's side (`ClassServer` starts or adopts the class server,
  `StepStream` reads its step stream, `LoadRun` sends simulated users, `ClassRoom` holds
  the app's one class); `models.py`: models on disk the class server can serve.
"""
