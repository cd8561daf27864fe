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

The class's record (phones with their language and form order, rounds and ballots, the
pre/post test's answers, hand counts, hidden names, the word list, the join code) is kept in
one SQLite database a class, `--state PATH` (default `<ServeLab cache>/class/<class
id>.sqlite`; `--state none` keeps nothing): every change is committed before the phone or the
teacher is answered (`classroom/record.py`), so a class server stopped, killed or restarted
for a model change loses no vote a phone saw acknowledged. On start an existing record is
loaded, so a class server restarted with the same `--class-id` (or `--state`) picks its class
up again: the same join code (unless `--api-key` names another, which the record then keeps),
and every phone's id and token still valid, so no phone scans again. A record that cannot be
read, is damaged, is not a class record, or is held by another class server is refused: the
server does not start, and says which file and what is wrong; move the file aside (or name
another `--state` / `--class-id`) to start an empty class. Nothing is ever overwritten unasked.

A class file of an earlier ServeLab (JSON: the record's path with `.json` for its suffix, as
the default `<class id>.json`) is read once into the record when no record is there yet; the
JSON file is left as it is and no longer written.
"""

from __future__ import annotations

import sys
from pathlib import Path

CLASS_DIR = "class"  # under the ServeLab cache (engine.model.loader.cache_root())


def default_state_path(class_id: str) -> Path:
    from engine.model.loader import cache_root

    return cache_root() / CLASS_DIR / f"{class_id}.sqlite"


def add_class_args(parser) -> None:
    a = parser.add_argument
    a("--class-id", default=None, metavar="ID",
      help="the class's name: its round ids and its record's (default: a new random id, "
           "a new class; give the same ID again to pick a class up after a restart)")
    a("--state", default=None, metavar="PATH",
      help="the class's record, a SQLite file loaded on start and written on every change "
           "(default: <ServeLab cache>/class/<class id>.sqlite; 'none': keep nothing)")


def load_class(args, lessons):
    """The class the server keeps: loaded from its record (a class without one for
    `--state none`). A `ClassFileError` (a bad record) goes up to the caller, which refuses
    to start."""
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
    legacy = path.with_suffix(".json") if path.suffix != ".json" else None
    existed = path.exists() and path.stat().st_size > 0
    room = Classroom.load(path, forms=forms, legacy=legacy, class_id=class_id, **kwargs)
    if args.class_id and room.class_id != args.class_id:
        print(f"class record {path} holds class {room.class_id!r}: serving that class",
              flush=True)
    if room.migrated_from:
        print(f"read the class file {room.migrated_from} into the record {path} (the JSON "
              f"file is left as it is and no longer written)", flush=True)
    state = (f"loaded {len(room.phones)} phones, {len(room.rounds)} rounds, tests "
             f"{sorted(room.tests) or 'none'}" if existed or room.migrated_from
             else "a new class")
    print(f"class {room.class_id!r}: {state}; its record is kept in {path}", flush=True)
    return room


def join_code_args(args, room) -> list[str]:
    """What to add to the command line so the server asks for the class's join code: the one
    its record keeps when `--api-key` names none (a class that never had one gets one when it
    binds beyond this computer, as `engine.serve` would make it). An `--api-key` given is
    kept in the record for the next restart."""
    import secrets

    from engine.serve import is_loopback

    if room.record is None:
        return []  # nothing kept: engine.serve's own rule, a new code each start
    if args.api_key:
        if args.api_key != room.join_code:
            room.set_join_code(args.api_key)
        return []
    code = room.join_code
    if code is None and not is_loopback(args.host):
        code = secrets.token_urlsafe(6)  # short enough to read off a projector
        room.set_join_code(code)
    if code is None:
        return []
    print(f"binding {args.host}: clients need the join code (API key) {code}", flush=True)
    return [f"--api-key={code}"]  # one argument: a code may start with "-"


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
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv += join_code_args(args, room)
        return serve(argv, routers=routers(lessons, classroom=room), parser=parser)
    finally:
        if room.record is not None:
            room.record.close()  # every change is committed already: this only tidies the WAL
        if room.record_error:
            print(room.record_error, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
