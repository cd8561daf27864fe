"""The class file: a class saved and loaded back is the same class; a bad file is refused by
name; the file on disk is always whole (written atomically, coalesced off the event loop)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from classroom.vote_routes import gains_report
from classroom.votes import ClassFileError, Classroom, Question, load_test_forms

Q = {"id": "q1", "kind": "selftest", "correct": 2,
     "question": {"zh": "题目", "en": "Question"},
     "choices": [{"zh": f"选项{i}", "en": f"choice {i}", "why": {"zh": "因为", "en": "because"},
                  "misconception": None if i == 2 else "batch-speeds-one"} for i in range(4)],
     "explanation": {"zh": "解释", "en": "explained"}}


def a_class(path=None) -> tuple[Classroom, list[str]]:
    """Eight phones; a round locked, revoted and revealed; a pre-test and a post-test; a
    hidden name and a word list; an open second round with ballots."""
    c = Classroom("cls", forms=load_test_forms(), state_path=path)
    ph = [c.join(nickname=f"n{i}").pid for i in range(8)]
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
    c.hidden_nicks.add(ph[1])
    c.words = ["n3"]
    c._changed()
    r3 = c.open_round(Question.from_dict(dict(Q, id="q2")), 120)
    c.vote(ph[4], r3.rid, 0)
    return c, ph


def reload(c: Classroom, path) -> Classroom:
    c.file.flush()
    return Classroom.load(path, forms=load_test_forms())


def test_a_saved_class_loads_back_the_same(tmp_path):
    path = tmp_path / "cls.json"
    c, ph = a_class(path)
    d = reload(c, path)
    assert d.class_id == "cls" and set(d.phones) == set(ph)
    for lang in ("zh", "en"):
        a, b = c.projector(lang), d.projector(lang)
        a["round"].pop("seconds_left"), b["round"].pop("seconds_left")
        assert a == b
        assert gains_report(c, lang) == gains_report(d, lang)
    assert d.export_csv(with_nicknames=True) == c.export_csv(with_nicknames=True)
    assert d.export_csv() == c.export_csv()
    # the revealed revote's view: both histograms and the shift
    d.current = d.rounds[1]
    c.current = c.rounds[1]
    assert d.projector("en") == c.projector("en")
    assert d.rounds[1].previous is d.rounds[0] and d.rounds[1].shift()["matched"] == 8
    assert [d.display_name(p) for p in ph] == [c.display_name(p) for p in ph]
    assert d.display_name(ph[1]) == "" and d.display_name(ph[3]) == "**"


def test_a_phone_rejoining_after_the_reload_keeps_its_ballot_and_form(tmp_path):
    path = tmp_path / "cls.json"
    c, ph = a_class(path)
    d = reload(c, path)
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


def test_a_truncated_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "cls.json"
    c, _ = a_class(path)
    c.file.flush()
    text = path.read_text("utf-8")
    path.write_text(text[: len(text) // 2], "utf-8")
    with pytest.raises(ClassFileError) as exc:
        Classroom.load(path, forms=load_test_forms())
    assert str(path) in str(exc.value) and "truncated" in str(exc.value)
    path.write_text(json.dumps({"format": 1, "class": "x"}), "utf-8")
    with pytest.raises(ClassFileError, match="missing field"):
        Classroom.load(path, forms=load_test_forms())
    # no file: a new, empty class that writes there
    fresh = Classroom.load(tmp_path / "none.json", forms=load_test_forms())
    assert fresh.phones == {} and fresh.file is not None


def test_without_a_state_path_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c, _ = a_class()
    assert c.file is None and list(tmp_path.iterdir()) == []


def test_the_file_is_always_whole_while_votes_go_in(tmp_path):
    """Sixty phones vote and change their votes from a thread while this one reads the file
    again and again: every read parses as a whole class file. The writes are coalesced (far
    fewer writes than changes), and the last one, at flush, has every ballot."""
    path = tmp_path / "cls.json"
    c = Classroom("cls", forms=load_test_forms(), state_path=path, flood_votes=1000)
    c.file.interval_s = 0.02
    ph = [c.join().pid for _ in range(60)]
    r = c.open_round(Question.from_dict(Q), 600)
    c.file.flush()
    done = threading.Event()

    def voters():
        for k in range(40):
            for i, p in enumerate(ph):
                c.vote(p, r.rid, (i + k) % 4)
            time.sleep(0.005)
        done.set()

    t = threading.Thread(target=voters)
    t.start()
    reads, deadline = 0, time.monotonic() + 20
    while (not done.is_set() or reads < 50) and reads < 5000 and time.monotonic() < deadline:
        data = json.loads(path.read_text("utf-8"))  # never a partial file
        assert data["class"] == "cls" and len(data["phones"]) == 60
        reads += 1
    t.join(20)
    c.file.close()
    assert 0 < c.file.writes < 60 * 40
    data = json.loads(path.read_text("utf-8"))
    assert {p: (i + 39) % 4 for i, p in enumerate(ph)} == data["rounds"][0]["ballots"]
    assert not [f for f in tmp_path.iterdir() if f.name != "cls.json"]  # no temporary left


def test_the_class_server_refuses_a_bad_class_file_by_name(tmp_path, capsys):
    from classroom.serve import main

    bad = tmp_path / "cls.json"
    bad.write_text('{"format": 1, "class": "cls", "phones": [{"id": "p', "utf-8")
    assert main(["--state", str(bad)]) == 2  # before any engine is built
    err = capsys.readouterr().err
    assert str(bad) in err and "truncated" in err and "Traceback" not in err
    assert bad.read_text("utf-8").endswith('"p')  # left as it was


def test_a_restarted_class_server_with_the_same_class_id_picks_its_class_up(tmp_path,
                                                                             monkeypatch):
    from classroom.serve import add_class_args, load_class
    from classroom.votes import Lessons
    from engine.serve import build_parser

    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    ap = build_parser()
    add_class_args(ap)
    lessons = Lessons.load()
    room = load_class(ap.parse_args(["--class-id", "mon-9am"]), lessons)
    pid = room.join().pid
    room.start_test("pre")
    room.answer_test(pid, 0, 1)
    room.file.close()
    assert (tmp_path / "class" / "mon-9am.json").is_file()
    again = load_class(ap.parse_args(["--class-id", "mon-9am"]), lessons)
    assert again.class_id == "mon-9am" and again.tests["pre"].answers == {pid: {0: 1}}
    assert load_class(ap.parse_args([]), lessons).phones == {}  # no id: a new class
    none = load_class(ap.parse_args(["--class-id", "mon-9am", "--state", "none"]), lessons)
    assert none.file is None and none.phones == {}


def test_the_app_starts_its_class_server_with_its_class_and_file():
    from classroom.client import DEFAULT_SWITCHES, ClassRoom, serve_args
    from classroom.serve import add_class_args
    from engine.serve import build_parser

    room = ClassRoom()
    args = serve_args(DEFAULT_SWITCHES, "127.0.0.1", 8123, None, class_id=room.class_id,
                      state="/tmp/x.json")
    ap = build_parser()
    add_class_args(ap)
    parsed = ap.parse_args(args[3:])
    assert parsed.class_id == room.class_id and parsed.state == "/tmp/x.json"


def test_the_apps_class_restarts_on_its_class_and_its_port(monkeypatch):
    """Stop and Start again: the same class id (its class file) and, when free, the same
    port (the same origin: each phone's page keeps the id it stored)."""
    import classroom.client as client

    calls = []

    class Fake:
        def __init__(self, port):
            self.url, self.headers = f"http://127.0.0.1:{port}", {}

        def stop(self, abort=False):
            pass

    def start(switches, on_network=False, port=None, kv_blocks=None, class_id=None,
              state=None):
        calls.append((port, class_id))
        return Fake(port or client.free_port())

    monkeypatch.setattr(client.ClassServer, "start", staticmethod(start))
    monkeypatch.setattr(client, "StepStream", lambda *a: type("S", (), {"close": lambda self: None})())
    room = client.ClassRoom()
    room.start(client.DEFAULT_SWITCHES, False)
    room.stop()
    room.start(client.DEFAULT_SWITCHES, False)
    assert calls[0] == (None, room.class_id) and calls[1] == (room.port, room.class_id)
    assert client.port_is_free("127.0.0.1", room.port)


def test_a_round_on_a_test_item_keeps_its_mark_through_the_file(tmp_path):
    path = tmp_path / "cls.json"
    c = Classroom("cls", forms=load_test_forms(), state_path=path)
    item = c.forms.form("B")[3]
    c.open_round(item, 60)
    d = reload(c, path)
    assert d.rounds[0].on_test_item == item.qid == "internal-frag:B"
    assert d.projector("en")["round"]["on_test_item"] == item.qid


def test_an_old_class_file_loads_only_without_test_answers(tmp_path):
    """Format 1 (before the test forms were written out: form A was the self-test's items)
    loads its phones and rounds; with pre/post answers it is refused, saying why, since its
    answers would be scored against other questions. So is a format-2 file whose answers were
    given on other forms than this course's."""
    path = tmp_path / "cls.json"
    c, ph = a_class(path)
    c.file.flush()
    data = json.loads(path.read_text("utf-8"))
    assert data["format"] == 2 and data["test_forms"] == load_test_forms().fingerprint
    old = dict(data, format=1)
    old.pop("test_forms")
    for r in old["rounds"]:
        r.pop("on_test_item")
    path.write_text(json.dumps(old), "utf-8")
    with pytest.raises(ClassFileError, match="old forms") as exc:
        Classroom.load(path, forms=load_test_forms())
    assert str(path) in str(exc.value) and "format" in str(exc.value)
    path.write_text(json.dumps(dict(old, tests={}, open_test=None)), "utf-8")
    d = Classroom.load(path, forms=load_test_forms())
    assert set(d.phones) == set(ph) and len(d.rounds) == len(c.rounds) and not d.tests
    assert all(r.on_test_item is None for r in d.rounds)
    path.write_text(json.dumps(dict(data, test_forms="0123456789abcdef")), "utf-8")
    with pytest.raises(ClassFileError, match="other test forms"):
        Classroom.load(path, forms=load_test_forms())
