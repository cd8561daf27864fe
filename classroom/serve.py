"""`python -m classroom.serve`: the class server. `python -m engine.serve` (the same flags, the
same one engine and stepping loop) with the classroom mounted: the students' page (`/class`),
their questions, the votes and the pre/post test (`classroom/server.py`).

    python -m classroom.serve                              # 127.0.0.1:8000, this computer only
    python -m classroom.serve --host 0.0.0.0               # phones join: prints a join code
    python -m classroom.serve --class-id mon-9am           # the same class again after a restart

The course the votes read (the self-test, the test's pairs, the misconceptions) is loaded
here, once, from the `lessons` package's files (`Lessons.load()`) and handed to the routers;
the engine reads none of it. The teacher's app starts this command (`classroom/client.py`,
`ClassServer.start`).

The class's record (phones and their forms, rounds and ballots, the pre/post test's answers,
hidden names, the word list) is kept in a class file, `--state PATH` (default
`<ServeLab cache>/class/<class id>.json`; `--state none` keeps nothing), written at most every
0.5 s and once more on the way out (`classroom.votes.ClassFile`). On start an existing file is
loaded, so a class server restarted with the same `--class-id` (or `--state`) picks its class
up again. A file that cannot be read or is not a whole class file is refused: the server does
not start, and says which file and what is wrong; move the file aside (or name another
`--state` / `--class-id`) to start an empty class. Nothing is ever overwritten unasked.
"""

from __future__ import annotations

import atexit
import sys
from pathlib import Path

CLASS_DIR = "class"  # under the ServeLab cache (engine.model.loader.cache_root())


def default_state_path(class_id: str) -> Path:
    from engine.model.loader import cache_root

    return cache_root() / CLASS_DIR / f"{class_id}.json"


def add_class_args(parser) -> None:
    a = parser.add_argument
    a("--class-id", default=None, metavar="ID",
      help="the class's name: its round ids and its class file's (default: a new random id, "
           "a new class; give the same ID again to pick a class up after a restart)")
    a("--state", default=None, metavar="PATH",
      help="the class file, loaded on start and kept up to date (default: "
           "<ServeLab cache>/class/<class id>.json; 'none': keep nothing)")


def load_class(args, lessons):
    """The class the server keeps: loaded from its class file (None: a class without one).
    A `ClassFileError` (a bad file) goes up to the caller, which refuses to start."""
    import secrets

    from classroom.server import ClassLimits
    from classroom.votes import Classroom, load_test_forms

    limits = ClassLimits()
    kwargs = {"flood_votes": limits.flood_votes, "flood_window_s": limits.flood_window_s}
    class_id = args.class_id or secrets.token_urlsafe(6)
    forms = load_test_forms(lessons)
    if (args.state or "").lower() == "none":
        return Classroom(class_id, forms=forms, **kwargs)
    path = Path(args.state) if args.state else default_state_path(class_id)
    room = Classroom.load(path, forms=forms, class_id=class_id, **kwargs)
    if args.class_id and room.class_id != args.class_id:
        print(f"class file {path} holds class {room.class_id!r}: serving that class",
              flush=True)
    state = (f"loaded {len(room.phones)} phones, {len(room.rounds)} rounds, tests "
             f"{sorted(room.tests) or 'none'}" if path.exists() else "a new class")
    print(f"class {room.class_id!r}: {state}; its record is kept in {path}", flush=True)
    return room


def main(argv: list[str] | None = None) -> int:
    from classroom.server import routers  # no torch: engine.serve sets up threads first
    from classroom.votes import ClassFileError, Lessons
    from engine.serve import build_parser
    from engine.serve import main as serve

    parser = build_parser("python -m classroom.serve", __doc__.split("\n")[0])
    add_class_args(parser)
    args = parser.parse_args(argv)
    lessons = Lessons.load()
    try:
        room = load_class(args, lessons)
    except ClassFileError as exc:
        print(f"python -m classroom.serve: error: {exc}.\nThe server did not start and left "
              f"the file as it is: move it aside (or pass another --state or --class-id) to "
              f"start an empty class.", file=sys.stderr, flush=True)
        return 2
    if room.file is not None:
        atexit.register(room.file.close)  # at exit too: a stop loses no change
    try:
        return serve(argv, routers=routers(lessons, classroom=room), parser=parser)
    finally:
        if room.file is not None:
            room.file.close()
            if room.file.error:
                print(room.file.error, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
