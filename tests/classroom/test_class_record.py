"""The class's record (classroom/record.py): what a phone saw acknowledged is on disk when
the call returns, so the files as a kill leaves them (no close, no checkpoint: copied while
the record is still open) load back the same class; a damaged, foreign or busy record is
refused by name; a refused write refuses the vote; the class server keeps its class, its join
code and its phones' tokens across a restart; a JSON class file of before is read once; a
round on a test item keeps its mark, and test answers are loaded only against the forms they
were taken on (a record of the layout before, or a JSON file of format 1, only without them)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from classroom.record import ClassFileError, ClassRecord
from classroom.vote_routes import gains_report
from classroom.votes import Classroom, Question, VoteError, load_test_forms

Q = {"id": "q1", "kind": "selftest", "correct": 2,
     "question": {"zh": "题目", "en": "Question"},
     "choices": [{"zh": f"选项{i}", "en": f"choice {i}", "why": {"zh": "因为", "en": "because"},
                  "misconception": None if i == 2 else "batch-speeds-one"} for i in range(4)],
     "explanation": {"zh": "解释", "en": "explained"}}


def a_class(path) -> tuple[Classroom, list[str]]:
    """Eight phones; a round locked, revoted and revealed; a pre-test and a post-test with
    hand counts; a hidden name and a word list; an open second round with a ballot."""
    c = Classroom.load(path, forms=load_test_forms(), class_id="cls")
    ph = [c.join(nickname=f"n{i}", lang=("zh", "en")[i % 2]).pid for i in range(8)]
    r1 = c.open_round(Question.from_dict(Q), 60)
    for i, p in enumerate(ph):
        c.vote(p, r1.rid, i % 4)
    c.lock()
    r2 = c.revote(60)
    for i, p in enumerate(ph):
        c.vote(p, r2.rid, 2 if i % 3 else 1)
    c.reveal()
    for phase, right in (("pre", 3), ("post", 6)):
        c.start_test(phase)
        for i, p in enumerate(ph):
            for item in range(len(c.forms.pairs)):
                q = c.forms.form(c.form_of(p, phase))[item]
                if item == 5 and i == 0:
                    continue  # a blank
                c.answer_test(p, item, q.correct if (i + item) % 8 < right
                              else (q.correct + 1) % len(q.choices))
        c.stop_test()
        c.test_hand_count(phase, 1, "A", list(range(len(c.forms.form("A")[1].choices))))
    c.set_hidden(c.handle(ph[1]), True)
    c.set_words(["n3"])
    r3 = c.open_round(Question.from_dict(dict(Q, id="q2")), 120)
    c.vote(ph[4], r3.rid, 0)
    return c, ph


def as_killed(path: Path, dest: Path) -> Path:
    """The record's files as a kill -9 would leave them now: the database and its WAL copied
    while the record is still open (nothing closed, nothing checkpointed)."""
    for suffix in ("", "-wal"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            shutil.copyfile(src, f"{dest}{suffix}")
    return dest


def test_a_class_loads_back_the_same_from_its_record_as_a_kill_left_it(tmp_path):
    path = tmp_path / "cls.sqlite"
    c, ph = a_class(path)
    assert Path(f"{path}-wal").stat().st_size > 0  # the commits are in the WAL, not folded
    d = Classroom.load(as_killed(path, tmp_path / "copy.sqlite"), forms=load_test_forms())
    assert d.class_id == "cls" and list(d.phones) == ph
    assert [p.lang for p in d.phones.values()] == ["zh", "en"] * 4
    assert (d.salt, d.phone_secret) == (c.salt, c.phone_secret)
    for lang in ("zh", "en"):
        a, b = c.projector(lang), d.projector(lang)
        a["round"].pop("seconds_left"), b["round"].pop("seconds_left")
        a.pop("version"), b.pop("version")
        assert a == b
        assert gains_report(c, lang) == gains_report(d, lang)
    assert d.export_csv(with_nicknames=True) == c.export_csv(with_nicknames=True)
    assert d.tests["post"].hand == c.tests["post"].hand
    # the revealed revote's view: both histograms and the shift
    d.current, c.current = d.rounds[1], c.rounds[1]
    a, b = c.projector("en"), d.projector("en")
    a.pop("version"), b.pop("version")
    assert a == b
    assert d.rounds[1].previous is d.rounds[0] and d.rounds[1].shift()["matched"] == 8
    assert d.display_name(ph[1]) == "" and d.display_name(ph[3]) == "**"
    # the open round keeps its deadline (wall clock): about the 120 s it was opened with
    assert 100 < d.rounds[2].deadline - d.clock() <= 120


def test_a_ballot_is_on_disk_when_the_vote_returns(tmp_path):
    """Nothing closed, nothing waited for: the call returned, so the ballot is in the files."""
    path = tmp_path / "cls.sqlite"
    c = Classroom.load(path, forms=load_test_forms())
    pid = c.join(nickname="ann", lang="zh").pid
    r = c.open_round(Question.from_dict(Q), 60)
    c.vote(pid, r.rid, 3)
    c.start_test("pre")
    c.answer_test(pid, 0, 1)
    d = Classroom.load(as_killed(path, tmp_path / "k1.sqlite"), forms=load_test_forms())
    assert d.rounds[0].ballots == {pid: 3} and d.tests["pre"].answers == {pid: {0: 1}}
    c.vote(pid, r.rid, 0)  # a changed ballot replaces the first
    d = Classroom.load(as_killed(path, tmp_path / "k2.sqlite"), forms=load_test_forms())
    assert d.rounds[0].ballots == {pid: 0} and d.phones[pid].lang == "zh"


def test_a_phone_rejoining_after_the_reload_keeps_its_ballot_and_form(tmp_path):
    path = tmp_path / "cls.sqlite"
    c, ph = a_class(path)
    d = Classroom.load(as_killed(path, tmp_path / "copy.sqlite"), forms=load_test_forms())
    for p in ph:
        assert d.join(p).pid == p
        assert d.form_of(p, "pre") == c.form_of(p, "pre")
    assert len(d.phones) == 8
    assert d.phone_view(ph[4], "en")["round"]["mine"] == 0
    assert d.phone_view(ph[5], "en")["round"]["mine"] is None
    # the open round goes on: the phone can still change its ballot
    d.vote(ph[4], d.current.rid, 3)
    assert d.phone_view(ph[4], "zh")["round"]["mine"] == 3
    # a new phone continues the alternation of forms
    assert d.join().group == len(ph) % 2


def test_a_write_the_disk_refuses_refuses_the_vote(tmp_path):
    c = Classroom.load(tmp_path / "cls.sqlite", forms=load_test_forms())
    pid = c.join().pid
    r = c.open_round(Question.from_dict(Q), 60)
    c.record.conn.close()  # every write now fails, as a full or vanished disk would
    with pytest.raises(VoteError) as exc:
        c.vote(pid, r.rid, 1)
    assert exc.value.status == 503 and exc.value.code == "not_saved"
    assert "课堂记录" in exc.value.message("zh") and "not kept" in exc.value.message("en")
    assert r.ballots == {} and r.counts() == [0, 0, 0, 0]  # not counted, as it was not kept
    assert str(tmp_path / "cls.sqlite") in c.record_error


def test_a_damaged_foreign_or_busy_record_is_refused_naming_the_file(tmp_path):
    forms = load_test_forms()
    path = tmp_path / "cls.sqlite"
    c, _ = a_class(path)
    c.record.close()  # folds the WAL into the database: the cut below cuts the class
    data = path.read_bytes()
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ClassFileError, match="is damaged") as exc:
        Classroom.load(cut, forms=forms)
    assert str(cut) in str(exc.value)
    assert cut.read_bytes() == data[: len(data) // 2]  # left as it was
    noise = tmp_path / "noise.sqlite"
    noise.write_bytes(b"\x00\x01not a database" * 100)
    with pytest.raises(ClassFileError, match="not a SQLite database"):
        Classroom.load(noise, forms=forms)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    db.close()
    with pytest.raises(ClassFileError, match="not a ServeLab class record"):
        Classroom.load(other, forms=forms)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"format": 1}), "utf-8")
    with pytest.raises(ClassFileError, match="holds JSON") as exc:
        Classroom.load(old, forms=forms)
    assert f"--state {tmp_path / 'old.sqlite'} reads it" in str(exc.value)
    # a record another class server holds open: refused, not written by two
    held = Classroom.load(path, forms=forms)
    with pytest.raises(ClassFileError, match="in use by another class server"):
        Classroom.load(path, forms=forms)
    held.join(nickname="still-writes")  # the server that holds it goes on unharmed
    held.record.close()
    # a record of another course (another number of test items) is refused by restore
    bad = Classroom.load(tmp_path / "short.sqlite", forms=forms)
    bad.record.test("pre", True, "pre", 999, forms.fingerprint)
    bad.record.close()
    with pytest.raises(ClassFileError, match="999 items"):
        Classroom.load(tmp_path / "short.sqlite", forms=forms)
    # a place no record can be made: refused by name, not a traceback
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ClassFileError, match="cannot be made"):
        Classroom.load(tmp_path / "a-file" / "cls.sqlite", forms=forms)
    # nothing there: a new, empty class with its record
    fresh = Classroom.load(tmp_path / "none.sqlite", forms=forms)
    assert fresh.phones == {} and fresh.record is not None and fresh.record.new


def test_without_a_record_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = Classroom("cls", forms=load_test_forms())
    c.open_round(Question.from_dict(Q), 60)
    c.vote(c.join().pid, c.current.rid, 1)
    assert c.record is None and list(tmp_path.iterdir()) == []


def test_the_class_server_refuses_a_bad_record_by_name(tmp_path, capsys):
    from classroom.serve import main

    bad = tmp_path / "cls.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    assert main(["--state", str(bad)]) == 2  # before any engine is built
    err = capsys.readouterr().err
    assert str(bad) in err and "damaged" in err and "Traceback" not in err
    assert bad.read_bytes() == b"SQLite format 3\x00" + b"\xff" * 200  # left as it was


def parser():
    from classroom.serve import add_class_args
    from engine.serve import build_parser

    ap = build_parser()
    add_class_args(ap)
    return ap


def test_a_restarted_class_server_keeps_its_class_join_code_and_tokens(tmp_path, monkeypatch):
    """The same --class-id again: its phones, its test, the join code it had (without
    --api-key) and its phones' tokens, signed with the class's secret (`router` hands it to
    the server's state)."""
    from types import SimpleNamespace

    from classroom.serve import join_code_args, load_class
    from classroom.server import router
    from classroom.votes import Lessons
    from engine.server.state import ServerState

    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    lessons, ap = Lessons.load(), parser()
    args = ap.parse_args(["--class-id", "mon-9am", "--host", "0.0.0.0"])
    room = load_class(args, lessons)
    pid = room.join().pid
    room.start_test("pre")
    room.answer_test(pid, 0, 1)
    code_args = join_code_args(args, room)  # a new class on the network: a new join code
    assert code_args == [f"--api-key={room.join_code}"] and room.join_code

    class Signer(ServerState):  # the server's own signing, without an engine
        def __init__(self):
            # the routes' engine loop: unused until a request comes, but for the sink the
            # class's recent steps (the trace download) hang on
            self.loop = SimpleNamespace(sinks=[])

    before = Signer()
    router(before, lessons, classroom=room)
    token = before.phone_token("10.0.0.7")
    room.record.close()
    assert (tmp_path / "class" / "mon-9am.sqlite").is_file()
    again = load_class(args, lessons)
    assert again.class_id == "mon-9am" and again.tests["pre"].answers == {pid: {0: 1}}
    assert join_code_args(args, again) == code_args  # the same code, from the record
    after = Signer()
    router(after, lessons, classroom=again)
    request = SimpleNamespace(headers={"x-servelab-phone": token})
    assert after.phone_of(request, "10.0.0.7") == token.split(".")[0]
    assert after.phone_of(request, "10.0.0.8") is None  # still bound to its address
    # an --api-key given replaces the kept one, for this start and the next
    assert join_code_args(ap.parse_args(["--api-key", "new-code"]), again) == []
    assert again.join_code == "new-code"
    again.record.close()
    assert load_class(args, lessons).join_code == "new-code"
    assert load_class(ap.parse_args([]), lessons).phones == {}  # no id: a new class
    none = load_class(ap.parse_args(["--class-id", "mon-9am", "--state", "none"]), lessons)
    assert none.record is None and none.phones == {}


def test_a_json_class_file_of_before_is_read_once_into_the_record(tmp_path, monkeypatch):
    from classroom.serve import load_class
    from classroom.votes import Lessons

    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    old = Classroom("wed-2pm", forms=load_test_forms())
    pid = old.join(nickname="ann").pid
    old.open_round(Question.from_dict(Q), 60)
    old.vote(pid, old.current.rid, 2)
    data = old.snapshot()
    for key in ("phone_secret", "join_code"):  # what a file of before did not hold
        data.pop(key)
    for phone in data["phones"]:
        phone.pop("lang")
    (tmp_path / "class").mkdir()
    legacy = tmp_path / "class" / "wed-2pm.json"
    legacy.write_text(json.dumps(data), "utf-8")
    args = parser().parse_args(["--class-id", "wed-2pm"])
    room = load_class(args, Lessons.load())
    assert room.migrated_from == str(legacy) and room.rounds[0].ballots == {pid: 2}
    room.vote(pid, room.current.rid, 1)
    room.record.close()
    assert json.loads(legacy.read_text("utf-8")) == data  # left as it was
    again = load_class(args, Lessons.load())  # from the record now, not the JSON again
    assert again.migrated_from is None and again.rounds[0].ballots == {pid: 1}
    again.record.close()


def test_the_app_starts_its_class_server_with_its_class_and_record():
    from classroom.client import DEFAULT_SWITCHES, ClassRoom, serve_args

    room = ClassRoom()
    args = serve_args(DEFAULT_SWITCHES, "127.0.0.1", 8123, room.join_code,
                      class_id=room.class_id, state="/tmp/x.sqlite")
    parsed = parser().parse_args(args[3:])
    assert parsed.class_id == room.class_id and parsed.state == "/tmp/x.sqlite"
    assert parsed.api_key == room.join_code


def test_the_apps_class_restarts_on_its_class_its_join_code_and_its_port(monkeypatch):
    """Stop and Start again: the same class id (its record), the same join code (the QR code
    on the projector) and, when free, the same port (the same origin: each phone's page
    keeps the id it stored)."""
    import classroom.client as client

    calls = []

    class Fake:
        def __init__(self, port):
            self.url, self.headers = f"http://127.0.0.1:{port}", {}

        def stop(self, abort=False):
            pass

        def wait_ready(self, quiet_s=None):
            pass

        def starting(self, quiet_s=None):  # it answers at once
            return False

    def start(switches, on_network=False, port=None, kv_blocks=None, class_id=None,
              state=None, join_code=None, ready_timeout=0):
        calls.append((port, class_id, join_code))
        return Fake(port or client.free_port())

    monkeypatch.setattr(client.ClassServer, "start", staticmethod(start))
    monkeypatch.setattr(client, "StepStream", lambda *a: type("S", (), {"close": lambda self: None})())
    room = client.ClassRoom()
    room.start(client.DEFAULT_SWITCHES, False)
    room.stop()
    room.start(client.DEFAULT_SWITCHES, False)
    assert calls[0] == (None, room.class_id, room.join_code)
    assert calls[1] == (room.port, room.class_id, room.join_code) and room.join_code
    assert client.port_is_free("127.0.0.1", room.port)


def test_a_record_made_but_never_filled_is_a_new_class(tmp_path):
    """A kill between the record's tables and the class's first write leaves an empty
    record: the next start makes the class there rather than refusing it."""
    path = tmp_path / "cls.sqlite"
    ClassRecord.open(path).close()
    c = Classroom.load(path, forms=load_test_forms(), class_id="later")
    assert c.record.new and c.class_id == "later"
    c.record.close()
    assert Classroom.load(path, forms=load_test_forms()).class_id == "later"


def test_a_round_on_a_test_item_keeps_its_mark_through_the_record(tmp_path):
    path = tmp_path / "cls.sqlite"
    c = Classroom.load(path, forms=load_test_forms(), class_id="cls")
    item = c.forms.form("B")[3]
    c.open_round(item, 60)
    c.lock()
    c.revote(60)  # the revote shows the same item: marked the same
    d = Classroom.load(as_killed(path, tmp_path / "copy.sqlite"), forms=load_test_forms())
    assert [r.on_test_item for r in d.rounds] == [item.qid] * 2 == ["internal-frag:B"] * 2
    assert d.projector("en")["round"]["on_test_item"] == item.qid
    assert d.export_csv() == c.export_csv()
    meta = dict(c.record.conn.execute("SELECT key, value FROM meta"))
    assert json.loads(meta["test_forms"]) == load_test_forms().fingerprint
    assert [r[0] for r in c.record.conn.execute("SELECT on_test_item FROM rounds")] == [
        item.qid] * 2


def test_answers_taken_on_other_test_forms_are_refused(tmp_path):
    """The record names the forms its answers were taken on (TestForm.fingerprint); loaded
    with other forms, its answers would be scored against other questions."""
    path = tmp_path / "cls.sqlite"
    c, _ = a_class(path)
    c.record.meta(test_forms="0123456789abcdef")
    c.record.close()
    with pytest.raises(ClassFileError, match="other test forms") as exc:
        Classroom.load(path, forms=load_test_forms())
    assert str(path) in str(exc.value)
    # a class without test answers loads whatever forms it names
    e = Classroom.load(tmp_path / "empty.sqlite", forms=load_test_forms())
    e.join()
    e.record.meta(test_forms="0123456789abcdef")
    e.record.close()
    assert len(Classroom.load(tmp_path / "empty.sqlite", forms=load_test_forms()).phones) == 1


def as_layout_1(path: Path) -> None:
    """The record as the layout before made it: no rounds.on_test_item, no test_forms."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("ALTER TABLE rounds DROP COLUMN on_test_item")
    db.execute("DELETE FROM meta WHERE key = 'test_forms'")
    db.execute("PRAGMA user_version=1")
    db.close()


def test_a_record_of_the_layout_before_loads_only_without_test_answers(tmp_path):
    """Layout 1 kept no forms: its test answers were taken on the old forms (form A the
    self-test's items) and are refused, the record left as it is; without them its class
    loads, and the record is brought to this layout once."""
    path = tmp_path / "cls.sqlite"
    c, ph = a_class(path)
    c.record.close()
    as_layout_1(path)
    before = path.read_bytes()
    with pytest.raises(ClassFileError, match="old forms") as exc:
        Classroom.load(path, forms=load_test_forms())
    assert str(path) in str(exc.value) and "format" in str(exc.value)
    assert path.read_bytes() == before  # left as it was: still layout 1
    path = tmp_path / "plain.sqlite"
    c = Classroom.load(path, forms=load_test_forms(), class_id="plain")
    pid = c.join().pid
    c.open_round(Question.from_dict(Q), 60)
    c.vote(pid, c.current.rid, 2)
    c.record.close()
    as_layout_1(path)
    d = Classroom.load(path, forms=load_test_forms())
    assert list(d.phones) == [pid] and d.rounds[0].ballots == {pid: 2}
    assert d.rounds[0].on_test_item is None and d.record.layout == 2
    assert d.record.conn.execute("PRAGMA user_version").fetchone()[0] == 2
    d.open_round(d.forms.form("A")[0], 60)  # the upgraded record keeps the new mark
    d.start_test("pre")
    d.answer_test(pid, 0, 1)
    d.record.close()
    e = Classroom.load(path, forms=load_test_forms())
    assert e.rounds[1].on_test_item == e.forms.form("A")[0].qid
    assert e.tests["pre"].answers == {pid: {0: 1}}
    e.record.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=3")
    db.commit()
    db.close()
    with pytest.raises(ClassFileError, match="layout 3; this ServeLab reads layout 1 or 2"):
        Classroom.load(path, forms=load_test_forms())
    # a layout-1 record made but never filled (killed before the class's first write)
    path = tmp_path / "unfilled.sqlite"
    ClassRecord.open(path).close()
    as_layout_1(path)
    f = Classroom.load(path, forms=load_test_forms(), class_id="later")
    assert f.record.new and f.record.layout == 2
    f.open_round(f.forms.form("A")[0], 60)
    f.record.close()
    g = Classroom.load(path, forms=load_test_forms())
    assert g.class_id == "later" and g.rounds[0].on_test_item == g.forms.form("A")[0].qid


def test_an_old_class_file_is_read_into_the_record_only_without_test_answers(tmp_path):
    """A JSON class file of format 2 is read into the record with its rounds' marks and its
    forms; one of format 1 (before the test forms were written out: form A was the
    self-test's items) loads its phones and rounds, and with pre/post answers it is refused,
    saying why. So is a format-2 file whose answers were given on other forms."""
    forms = load_test_forms()
    c = Classroom("cls", forms=forms)
    ph = [c.join(nickname=f"n{i}").pid for i in range(4)]
    c.open_round(forms.form("B")[3], 60)
    c.vote(ph[0], c.current.rid, 1)
    c.start_test("pre")
    c.answer_test(ph[1], 0, 1)
    data = c.snapshot()
    for key in ("phone_secret", "join_code"):  # what a file of before did not hold
        data.pop(key)
    assert data["format"] == 2 and data["test_forms"] == forms.fingerprint
    legacy = tmp_path / "cls.json"
    legacy.write_text(json.dumps(data), "utf-8")
    d = Classroom.load(tmp_path / "new.sqlite", forms=forms, legacy=legacy)
    assert d.migrated_from == str(legacy)
    assert d.rounds[0].on_test_item == "internal-frag:B" and d.tests["pre"].answers == {
        ph[1]: {0: 1}}
    d.record.close()
    e = Classroom.load(tmp_path / "new.sqlite", forms=forms)  # from the record now
    assert e.rounds[0].on_test_item == "internal-frag:B" and e.tests["pre"].answers
    e.record.close()
    old = dict(data, format=1)
    old.pop("test_forms")
    old["rounds"] = [{k: v for k, v in r.items() if k != "on_test_item"} for r in old["rounds"]]
    legacy.write_text(json.dumps(old), "utf-8")
    with pytest.raises(ClassFileError, match="old forms") as exc:
        Classroom.load(tmp_path / "f1.sqlite", forms=forms, legacy=legacy)
    assert str(legacy) in str(exc.value) and "format" in str(exc.value)
    legacy.write_text(json.dumps(dict(old, tests={}, open_test=None)), "utf-8")
    f = Classroom.load(tmp_path / "f1.sqlite", forms=forms, legacy=legacy)
    assert set(f.phones) == set(ph) and len(f.rounds) == 1 and not f.tests
    assert all(r.on_test_item is None for r in f.rounds)
    f.record.close()
    legacy.write_text(json.dumps(dict(data, test_forms="0123456789abcdef")), "utf-8")
    with pytest.raises(ClassFileError, match="other test forms"):
        Classroom.load(tmp_path / "f2.sqlite", forms=forms, legacy=legacy)
