"""The class's record on disk: one SQLite database a class (the standard library's `sqlite3`).

A `Classroom` (`classroom/votes.py`) writes every change through its `ClassRecord` in the
request's own path, one small transaction a change, before the route answers: a phone that
saw its join, ballot or test answer acknowledged finds it again after any restart of the class
server, a kill included. Teacher-side changes (rounds opened, locked, revealed; hand counts;
hidden names; the word list; tests started and stopped) are written the same way.

What must hold:
- The file is a whole class at every commit. WAL mode: a commit appends to the `-wal` file
  beside the database; a process killed at any moment leaves the last commit readable, and
  the next open replays the WAL. `synchronous=NORMAL` is enough for that: a commit is in the
  operating system's cache when `COMMIT` returns, which outlives the process; only a power cut
  can lose the last commits, and the class server's machine losing power ends the class too.
  (FULL would fsync on every ballot, stalling every phone's request behind the disk.)
- One class server a record: the connection holds the database's lock from its open to its
  end (`locking_mode=EXCLUSIVE`), so a second server started on the same class refuses to
  start instead of interleaving its writes. The operating system drops the lock with the
  process, so a restart after a kill opens it at once.
- What it holds is the data `Classroom.snapshot()` gives, in one table an entity: `phones`
  (pseudonymous id, nickname, language, form group, in join order), `rounds` (question,
  state, deadline, hand counts, the revote's first round, the pre/post test item it showed,
  `on_test_item`), `ballots`, `tests`, `test_answers`, `hand_counts` (the tests' hand counts
  by item and form), and `meta` (the class id, the salt of the handles, the phone tokens'
  signing secret, the join code, the current round and open test, the test's item count and
  the fingerprint of the test forms its answers are taken on, `test_forms`, hidden names,
  the word list). `read()` gives that data back in the snapshot's shape, and the class
  loads it with `Classroom.restore`, which checks it as a whole: a record that is damaged, foreign or not this course's is refused with a
  `ClassFileError` naming the file and what is wrong.
- An open round's deadline is kept as wall-clock time: the seconds a class server was down
  count against the round (its deadline may lock it at the restart; the teacher extends it).
- Layout 2 (`PRAGMA user_version`) added `rounds.on_test_item` and the `test_forms` key. A
  layout-1 record reads as a class of format 1 (no round marked, no forms named), which
  `restore` loads only without test answers (they were taken on the old forms, form A the
  self-test's items); once loaded (or when it holds no class yet), `upgrade` brings it to
  layout 2 in one transaction. A refused record is left as it is.
- Rows keep their first write's order (`rowid`): the phones' join order (the form groups
  alternate by it) and the ballots' and answers' order (the CSV's rows) come back the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time

# SQLite's header field for the application that owns a database: a foreign database (another
# program's, or an empty one) is told apart from a class record before any table is read
APPLICATION_ID = 0x53564C43  # "SVLC"
RECORD_FORMAT = 2  # PRAGMA user_version: the tables' layout (2: rounds.on_test_item)
READS_RECORDS = (1, 2)  # layout 1 is read as a class of format 1, and upgraded once loaded
# The format of `Classroom.snapshot()`'s data, which `read` gives (a JSON class file of before
# holds the same). 2: each round names the test item it showed (`on_test_item`) and the class
# names the test forms its answers were taken on (`test_forms`, TestForm.fingerprint). Format 1
# loads when it holds no test answers; its answers were taken on format-1 forms (form A the
# self-test's items) and are refused, as are answers taken on forms other than this course's.
CLASS_FILE_FORMAT = 2
READS_CLASS_FILES = (1, 2)
SQLITE_HEADER = b"SQLite format 3\x00"

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE phones (seq INTEGER PRIMARY KEY, pid TEXT NOT NULL UNIQUE, grp INTEGER NOT NULL,
                     nickname TEXT NOT NULL, lang TEXT);
CREATE TABLE rounds (seq INTEGER PRIMARY KEY, rid TEXT NOT NULL UNIQUE,
                     number INTEGER NOT NULL, state TEXT NOT NULL, question TEXT NOT NULL,
                     deadline REAL NOT NULL, hand TEXT, previous TEXT,
                     hidden INTEGER NOT NULL, measured TEXT, on_test_item TEXT);
CREATE TABLE ballots (rid TEXT NOT NULL, pid TEXT NOT NULL, choice INTEGER NOT NULL,
                      UNIQUE (rid, pid));
CREATE TABLE tests (phase TEXT NOT NULL UNIQUE, open INTEGER NOT NULL);
CREATE TABLE test_answers (phase TEXT NOT NULL, pid TEXT NOT NULL, item INTEGER NOT NULL,
                           choice INTEGER NOT NULL, UNIQUE (phase, pid, item));
CREATE TABLE hand_counts (phase TEXT NOT NULL, item INTEGER NOT NULL, form TEXT NOT NULL,
                          counts TEXT NOT NULL, UNIQUE (phase, item, form));
"""
TABLES = ("meta", "phones", "rounds", "ballots", "tests", "test_answers", "hand_counts")
META_KEYS = ("class", "salt", "phone_secret", "join_code", "current", "open_test",
             "test_items", "test_forms", "hidden_nicks", "words")


class ClassFileError(Exception):
    """A class record that cannot be loaded: `str()` names the file and what is wrong."""

    def __init__(self, path: str, what: str):
        super().__init__(f"class record {path}: {what}")
        self.path, self.what = path, what


class ClassRecord:
    """One class's database, open for the life of its class server. `open` checks it (or
    creates it); `read` gives the class back; the other methods each commit one change."""

    def __init__(self, path, conn: sqlite3.Connection, new: bool, layout: int = RECORD_FORMAT):
        self.path, self.conn, self.new = os.fspath(path), conn, new
        self.layout = layout  # the tables' layout as opened (`upgrade` brings it to this one)

    @classmethod
    def open(cls, path) -> ClassRecord:
        """The record at `path`, created (with its folder) when nothing is there. A file
        that is not a class record of this layout, is damaged, or is held by another class
        server: ClassFileError, and the file is left as it is."""
        path = os.fspath(path)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        if not new:
            try:
                with open(path, "rb") as f:
                    head = f.read(len(SQLITE_HEADER))
            except OSError as exc:
                raise ClassFileError(path, f"cannot be read ({exc})") from None
            if head != SQLITE_HEADER:
                sqlite_path = os.path.splitext(path)[0] + ".sqlite"
                hint = (f" (it holds JSON: a class file of an earlier ServeLab; --state "
                        f"{sqlite_path} reads it into a new record there once)"
                        if head.lstrip()[:1] == b"{" else "")
                raise ClassFileError(path, f"is not a SQLite database{hint}")
        else:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            except OSError as exc:
                raise ClassFileError(path, f"cannot be made ({exc})") from None
        try:
            # autocommit (isolation_level None): each write names its own transaction; the
            # event loop's thread uses it, which need not be the thread that opened it
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                   timeout=0.0)
        except sqlite3.Error as exc:
            raise ClassFileError(path, f"cannot be opened ({exc})") from None
        try:
            conn.execute("PRAGMA locking_mode=EXCLUSIVE")  # before WAL: no shared memory file
            layout = RECORD_FORMAT
            if not new:  # read only, before anything changes it: another program's is left
                layout = cls._check(conn, path)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise ClassFileError(path, f"cannot be put in WAL mode (it stays in {mode!r})")
            conn.execute("PRAGMA synchronous=NORMAL")
            # take the lock now, with a write, and keep it: a second server on this class
            # fails here rather than at its first vote
            conn.execute("BEGIN IMMEDIATE")
            if new:
                conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
                conn.execute(f"PRAGMA user_version={RECORD_FORMAT}")
                for stmt in SCHEMA.split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
            conn.execute("COMMIT")
            if not new:
                # a record made but killed before the class's first write: still a new class
                new = conn.execute("SELECT count(*) FROM meta").fetchone()[0] == 0
        except sqlite3.OperationalError as exc:
            conn.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise ClassFileError(path, "is in use by another class server (one class "
                                           "server a class)") from None
            raise ClassFileError(path, f"cannot be opened ({exc})") from None
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise ClassFileError(path, f"is damaged ({exc})") from None
        except ClassFileError:
            conn.close()
            raise
        return cls(path, conn, new, layout)

    @staticmethod
    def _check(conn: sqlite3.Connection, path: str) -> int:
        app = conn.execute("PRAGMA application_id").fetchone()[0]
        if app != APPLICATION_ID:
            raise ClassFileError(path, "is not a ServeLab class record (another program's "
                                       "database)")
        fmt = conn.execute("PRAGMA user_version").fetchone()[0]
        if fmt not in READS_RECORDS:
            raise ClassFileError(path, f"is a class record of layout {fmt}; this ServeLab "
                                       f"reads layout {' or '.join(map(str, READS_RECORDS))}")
        problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise ClassFileError(path, f"is damaged ({'; '.join(problems[:3])})")
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if missing := [t for t in TABLES if t not in have]:
            raise ClassFileError(path, f"is missing the table(s) {', '.join(missing)}")
        return fmt

    def upgrade(self, test_forms: str | None) -> None:
        """A layout-1 record, its class loaded (so without test answers) or none in it yet, to
        this layout: the rounds' `on_test_item` column (none marked) and the forms'
        fingerprint, in one transaction."""
        if self.layout == RECORD_FORMAT:
            return
        self._tx([("ALTER TABLE rounds ADD COLUMN on_test_item TEXT", ()),
                  (f"PRAGMA user_version={RECORD_FORMAT}", ())]
                 + self._meta({"test_forms": test_forms}))
        self.layout = RECORD_FORMAT

    def close(self) -> None:
        self.conn.close()

    # --- writes: one transaction each --------------------------------------------------------
    def _tx(self, statements) -> None:
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            for sql, args in statements:
                c.execute(sql, args)
            c.execute("COMMIT")
        except BaseException:
            # a failed statement or commit (a full disk) leaves nothing half done, and no
            # transaction open that would refuse every later write
            if c.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    c.execute("ROLLBACK")
            raise

    @staticmethod
    def _meta(values: dict):
        return [("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                 "SET value = excluded.value", (k, json.dumps(v, ensure_ascii=False)))
                for k, v in values.items()]

    @staticmethod
    def _phone(d: dict):
        return ("INSERT INTO phones (pid, grp, nickname, lang) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (pid) DO UPDATE SET nickname = excluded.nickname, "
                "lang = excluded.lang", (d["id"], d["group"], d["nickname"], d.get("lang")))

    @staticmethod
    def _round(seq: int, d: dict, now: float):
        args = (seq, d["rid"], d["number"], d["state"], json.dumps(d["question"],
                ensure_ascii=False), now + d["seconds_left"],
                None if d["hand"] is None else json.dumps(d["hand"]), d["previous"],
                int(d["hidden"]), d["measured"], d.get("on_test_item"))
        return ("INSERT INTO rounds (seq, rid, number, state, question, deadline, hand, "
                "previous, hidden, measured, on_test_item) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (rid) DO UPDATE SET state = excluded.state, "
                "question = excluded.question, deadline = excluded.deadline, "
                "hand = excluded.hand, hidden = excluded.hidden, "
                "measured = excluded.measured, on_test_item = excluded.on_test_item", args)

    @staticmethod
    def _ballot(rid: str, pid: str, choice: int):
        return ("INSERT INTO ballots (rid, pid, choice) VALUES (?, ?, ?) ON CONFLICT "
                "(rid, pid) DO UPDATE SET choice = excluded.choice", (rid, pid, choice))

    @staticmethod
    def _test(phase: str, is_open: bool):
        return ("INSERT INTO tests (phase, open) VALUES (?, ?) ON CONFLICT (phase) DO UPDATE "
                "SET open = excluded.open", (phase, int(is_open)))

    @staticmethod
    def _answer(phase: str, pid: str, item: int, choice: int):
        return ("INSERT INTO test_answers (phase, pid, item, choice) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (phase, pid, item) DO UPDATE SET choice = excluded.choice",
                (phase, pid, item, choice))

    @staticmethod
    def _hand(phase: str, item: int, form: str, counts: list[int]):
        return ("INSERT INTO hand_counts (phase, item, form, counts) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (phase, item, form) DO UPDATE SET counts = excluded.counts",
                (phase, item, form, json.dumps(counts)))

    def phone(self, d: dict) -> None:
        """A phone joined, or changed its nickname (`d`: the snapshot's phone)."""
        self._tx([self._phone(d)])

    def ballot(self, rid: str, pid: str, choice: int) -> None:
        self._tx([self._ballot(rid, pid, choice)])

    def answer(self, phase: str, pid: str, item: int, choice: int) -> None:
        self._tx([self._answer(phase, pid, item, choice)])

    def rounds(self, rounds: list[tuple[int, dict]], current: str | None) -> None:
        """Rounds as the snapshot gives them, each with its place (1, 2, ...) in the class,
        and the current round's id."""
        now = time.time()
        self._tx([self._round(seq, d, now) for seq, d in rounds]
                 + self._meta({"current": current}))

    def test(self, phase: str, is_open: bool, open_test: str | None, test_items,
             test_forms) -> None:
        """A test started or stopped, with the test's item count and its forms' fingerprint
        (what `restore` checks its answers against)."""
        self._tx([self._test(phase, is_open)]
                 + self._meta({"open_test": open_test, "test_items": test_items,
                               "test_forms": test_forms}))

    def test_hand(self, phase: str, item: int, form: str, counts: list[int],
                  test_items, test_forms) -> None:
        self._tx([("INSERT OR IGNORE INTO tests (phase, open) VALUES (?, 0)", (phase,)),
                  self._hand(phase, item, form, counts)]
                 + self._meta({"test_items": test_items, "test_forms": test_forms}))

    def meta(self, **values) -> None:
        self._tx(self._meta(values))

    def write_all(self, data: dict) -> None:
        """A whole class (`Classroom.snapshot()`'s data) into this new, empty record."""
        now = time.time()
        st = self._meta({k: data.get(k) for k in META_KEYS})
        st += [self._phone(p) for p in data["phones"]]
        st += [self._round(i + 1, r, now) for i, r in enumerate(data["rounds"])]
        st += [self._ballot(r["rid"], pid, c) for r in data["rounds"]
               for pid, c in r["ballots"].items()]
        for phase, t in data["tests"].items():
            st.append(self._test(phase, t["open"]))
            st += [self._answer(phase, pid, int(i), c) for pid, a in t["answers"].items()
                   for i, c in a.items()]
            st += [self._hand(phase, int(i), f, c) for i, by in t["hand"].items()
                   for f, c in by.items()]
        self._tx(st)

    # --- read --------------------------------------------------------------------------------
    def read(self) -> dict:
        """The class in `Classroom.snapshot()`'s shape, for `Classroom.restore` to check and
        load (format 2; format 1 from a layout-1 record, which has no `on_test_item` or
        `test_forms`). sqlite3.DatabaseError, ValueError or KeyError when a row is not what
        it wrote."""
        c = self.conn
        meta = {k: json.loads(v) for k, v in c.execute("SELECT key, value FROM meta")}
        now = time.time()
        ballots: dict[str, dict] = {}
        for rid, pid, choice in c.execute("SELECT rid, pid, choice FROM ballots ORDER BY rowid"):
            ballots.setdefault(rid, {})[pid] = choice
        old = self.layout == 1  # no rounds.on_test_item, no test_forms: format 1
        rounds = [{"rid": rid, "number": number, "state": state,
                   "question": json.loads(question), "seconds_left": deadline - now,
                   "ballots": ballots.get(rid, {}),
                   "hand": None if hand is None else json.loads(hand), "previous": previous,
                   "hidden": bool(hidden), "measured": measured, "on_test_item": on_item}
                  for rid, number, state, question, deadline, hand, previous, hidden, measured,
                  on_item in c.execute(
                      "SELECT rid, number, state, question, deadline, hand, previous, hidden, "
                      f"measured, {'NULL' if old else 'on_test_item'} FROM rounds ORDER BY seq")]
        tests: dict[str, dict] = {}
        for phase, is_open in c.execute("SELECT phase, open FROM tests ORDER BY rowid"):
            tests[phase] = {"open": bool(is_open), "answers": {}, "hand": {}}
        for phase, pid, item, choice in c.execute(
                "SELECT phase, pid, item, choice FROM test_answers ORDER BY rowid"):
            tests[phase]["answers"].setdefault(pid, {})[str(item)] = choice
        for phase, item, form, counts in c.execute(
                "SELECT phase, item, form, counts FROM hand_counts ORDER BY rowid"):
            tests[phase]["hand"].setdefault(str(item), {})[form] = json.loads(counts)
        data = {"format": 1 if old else CLASS_FILE_FORMAT, "class": meta["class"], "version": 0,
                "phones": [{"id": pid, "group": grp, "nickname": nick, "lang": lang}
                           for pid, grp, nick, lang in c.execute(
                               "SELECT pid, grp, nickname, lang FROM phones ORDER BY seq")],
                "rounds": rounds, "current": meta.get("current"), "tests": tests,
                "open_test": meta.get("open_test"), "test_items": meta.get("test_items"),
                "hidden_nicks": meta.get("hidden_nicks") or [],
                "words": meta.get("words") or [], "salt": meta.get("salt"),
                "phone_secret": meta.get("phone_secret"), "join_code": meta.get("join_code")}
        if not old:
            data["test_forms"] = meta.get("test_forms")
        return data
