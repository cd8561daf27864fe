"""`python -m classroom.serve`: the class server. `python -m engine.serve` (the same flags, the
same one engine and stepping loop) with the classroom mounted: the students' page (`/class`),
their questions, the votes and the pre/post test (`classroom/server.py`).

    python -m classroom.serve                              # 127.0.0.1:8000, this computer only
    python -m classroom.serve --host 0.0.0.0               # phones join: prints a join code

The course the votes read (the self-test, the test's pairs, the misconceptions) is loaded
here, once, from the `lessons` package's files (`Lessons.load()`) and handed to the routers;
the engine reads none of it. The teacher's app starts this command (`classroom/client.py`,
`ClassServer.start`).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from classroom.server import routers  # no torch: engine.serve sets up threads first
    from classroom.votes import Lessons
    from engine.serve import build_parser
    from engine.serve import main as serve

    parser = build_parser("python -m classroom.serve", __doc__.split("\n")[0])
    return serve(argv, routers=routers(Lessons.load()), parser=parser)


if __name__ == "__main__":
    sys.exit(main())
