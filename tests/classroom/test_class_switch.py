"""The class server changes its engine without changing its address, and a phone's answer
outlives its connection.

- A switch flip (`POST /v1/servelab/engine`) keeps the port and the join code: answers in
  flight finish (drain) or are cut with `engine_restarting` (abort), a question asked while
  the new engine is built waits for it instead of failing, and the step stream says
  "restart" before it goes on with the new engine's steps. The second flip goes the app's
  way (`ClassServer.switch`): the class page's k reaches the new engine as
  `num_speculative_tokens`, and the server reads back the shape it was sent.
- A phone that loses its connection reattaches with its request id and its secret and reads
  the rest of its answer; another phone's secret gets 404.
- A student's stream carries its own journey and nothing of anyone else's: over a class of
  30 (ten students, twenty simulated users) no event names another request, nickname or
  question text.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import httpx
import pytest

from classroom.client import DEFAULT_SWITCHES, ClassServer, spec_of, switches_of
from engine.config import SpecConfig
from engine.server import ServerSettings
from engine.waits import WAIT_CODES
from tests.classroom.test_student import join
from tests.conftest import in_loop, running_server

JOIN, ADMIN = "join-code", "admin-key"
STUDENT = {"Authorization": f"Bearer {JOIN}"}
TEACHER = {"Authorization": f"Bearer {ADMIN}"}


def events_of(r: httpx.Response, out: list, stop_after: int | None = None) -> None:
    for line in r.iter_lines():
        if line.startswith("data: "):
            out.append(json.loads(line[6:]))
            if stop_after is not None and len(out) >= stop_after:
                return


def token(c: httpx.Client) -> dict:
    """A new phone joins: the header with the server's token for it (its limits' key)."""
    return {**STUDENT, "X-ServeLab-Phone": join(c, JOIN)}


def ask(c: httpx.Client, nick: str, q: str, phone: str | None = None) -> list[dict]:
    """One question from a phone of its own (a fresh token each call)."""
    out: list[dict] = []
    body = {"nickname": nick, "question": q}
    if phone:
        body["phone"] = phone
    with c.stream("POST", "/class/ask", json=body, headers=token(c)) as r:
        assert r.status_code == 200, r.read()
        events_of(r, out)
    return out


def text_of(events: list[dict]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta")


def wait_phase(c: httpx.Client, phase: str, generation: int, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = c.get("/v1/servelab/engine", headers=TEACHER).json()
        if st["status"]["phase"] == phase and st["status"]["generation"] >= generation:
            return st
        time.sleep(0.1)
    raise AssertionError(f"no {phase} within {timeout} s: {st}")


@pytest.mark.slow
def test_switch_flip_keeps_the_address_and_every_question(engine):
    settings = ServerSettings(api_key=JOIN, admin_key=ADMIN)
    with running_server(engine, settings) as (url, app), \
            httpx.Client(base_url=url, timeout=120) as c:
        # bad flips: clear 400s, and only the teacher may flip
        r = c.post("/v1/servelab/engine", json={"changes": {"model": "x"}}, headers=TEACHER)
        assert r.status_code == 400 and "model" in r.json()["error"]["message"]
        r = c.post("/v1/servelab/engine", json={"changes": {"batching": "bus"}}, headers=TEACHER)
        assert r.status_code == 400 and "batching" in r.json()["error"]["message"]
        assert c.post("/v1/servelab/engine", json={"changes": {}},
                      headers=STUDENT).status_code == 401

        stream: list[dict] = []
        viewer_done = threading.Event()

        def viewer():  # the teacher's step stream across both flips
            with httpx.stream("GET", f"{url}/v1/servelab/steps", headers=TEACHER,
                              timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        stream.append(json.loads(line[6:]))
                    if viewer_done.is_set():
                        return

        vt = threading.Thread(target=viewer, daemon=True)
        vt.start()
        time.sleep(0.5)
        # the second flip: what the class page sends, speculation with the teacher's k = 2
        flip = {**DEFAULT_SWITCHES, "spec": "ngram", "k": 2}
        teacher = ClassServer(url=url, join_code=JOIN, admin_key=ADMIN)
        for mode, changes, gen in (("drain", {"batching": "static",
                                              "kv_layout": "contiguous"}, 1),
                                   ("abort", {"batching": "continuous", "kv_layout": "paged",
                                              "spec": spec_of(flip)}, 2)):
            results: dict[int, list] = {}
            started = threading.Barrier(4, timeout=120)

            def phone(i, started=started, results=results, mode=mode):
                started.wait()
                results[i] = ask(c, f"p{i}-{mode}", "Write a long story about a ship.")

            phones = [threading.Thread(target=phone, args=(i,)) for i in range(3)]
            for p in phones:
                p.start()
            started.wait()
            # the flip lands while all three are in the engine and answering has begun (a
            # fixed wait let a fast CPU finish them first: then nothing drains). A static bus
            # may seat one while the others wait at the door: in flight all the same
            def in_flight(e) -> bool:
                live = [r for r in e.scheduler.running if not r.is_finished]
                return (len(live) + len(e.scheduler.waiting) >= 3
                        and any(r.num_output_tokens > 0 for r in live))

            deadline = time.monotonic() + 120
            while not in_loop(app, in_flight):
                assert time.monotonic() < deadline, f"{mode}: the three answers never started"
                time.sleep(0.01)
            if mode == "drain":
                r = c.post("/v1/servelab/engine", json={"changes": changes, "abort": False,
                                                        "drain_s": 60}, headers=TEACHER)
                assert r.status_code == 202, r.text
            else:  # the app's way: ClassServer.switch (it raises on anything but 202)
                teacher.switch(flip, abort=True, drain_s=60)
            again = c.post("/v1/servelab/engine", json={"changes": changes}, headers=TEACHER)
            assert again.status_code in (409, 202)  # 202 only if the first already ended
            # a question asked during the change waits for the new engine and is answered
            late = ask(c, f"late-{mode}", "Say hello.")
            assert late[-1]["type"] == "done" and late[0]["engine"] == gen, late
            for p in phones:
                p.join(120)
            st = wait_phase(c, "serving", gen)
            for k, v in changes.items():
                got = st["config"][k]
                assert (got["method"] if k == "spec" else got) == (
                    v["method"] if k == "spec" else v), (k, got)
            if mode == "abort":  # k = 2 reached the new engine, and reads back as sent
                assert app.state.loop.engine.config.spec == SpecConfig("ngram", 2)
                assert st["config"]["spec"] == dataclasses.asdict(SpecConfig("ngram", 2))
                assert switches_of(st["config"]) == flip
            for evs in results.values():
                if mode == "drain":  # every answer finished on the old engine
                    assert evs[-1]["type"] == "done", evs[-3:]
                else:  # cut, with the code a phone re-asks on
                    assert evs[-1]["type"] in ("error", "done"), evs[-3:]
                    if evs[-1]["type"] == "error":
                        assert evs[-1]["code"] == "engine_restarting"
            if mode == "abort":
                assert any(evs[-1]["type"] == "error" for evs in results.values())
        viewer_done.set()
        # the one join code and the one address throughout; the step stream told the story
        phases = [e["phase"] for e in stream if e.get("type") == "restart"]
        assert "draining" in phases and "building" in phases and "serving" in phases, phases
        i_serving = max(i for i, e in enumerate(stream) if e.get("phase") == "serving")
        after = [e for e in stream[i_serving:] if "step" in e]
        assert after and after[0]["switches"]["spec"]["method"] == "ngram"
        assert after[0]["switches"]["batching"] == "continuous"


@pytest.mark.slow
def test_a_phone_reattaches_to_its_answer(engine):
    settings = ServerSettings(api_key=JOIN, admin_key=ADMIN)
    phone = "p" * 8 + "secret-of-this-phone"
    with running_server(engine, settings) as (url, app), \
            httpx.Client(base_url=url, timeout=120) as c:
        first: list[dict] = []
        body = {"nickname": "小明", "question": "写一首关于大海的长诗。", "phone": phone}
        mine = token(c)
        with c.stream("POST", "/class/ask", json=body, headers=mine) as r:
            assert r.status_code == 200, r.read()
            events_of(r, first, stop_after=6)  # then the phone reloads: the connection ends
        rid = first[0]["request_id"]
        assert first[0]["question"] == body["question"]
        # another phone (or none) cannot read it
        for h in ({}, {"X-Phone-Secret": "x" * 20}):
            r = c.get(f"/class/answer/{rid}", headers={**STUDENT, **h})
            assert r.status_code == 404 and r.json()["error"]["code"] == "answer_not_found"
        # asking again is refused while it runs: the answer is still the student's
        r = c.post("/class/ask", json=body, headers=mine)
        assert r.status_code == 429
        rest: list[dict] = []
        with c.stream("GET", f"/class/answer/{rid}?start={len(first)}",
                      headers={**STUDENT, "X-Phone-Secret": phone}) as r:
            assert r.status_code == 200
            events_of(r, rest)
        assert rest[0]["i"] == len(first) and rest[-1]["type"] == "done", rest[-2:]
        whole: list[dict] = []
        with c.stream("GET", f"/class/answer/{rid}",
                      headers={**STUDENT, "X-Phone-Secret": phone}) as r:
            events_of(r, whole)
        assert text_of(first + rest) == text_of(whole) and len(text_of(whole)) > 0
        assert "\ufffd" not in text_of(whole)


@pytest.mark.slow
def test_a_students_stream_holds_only_their_own_request(engine):
    """A class of 30: ten students (long, distinct nicknames and questions) and twenty
    simulated users over the OpenAI API, all at once on 8 seats: each student's events name
    only their own request and carry their own journey."""
    settings = ServerSettings(api_key=JOIN, admin_key=ADMIN)
    nicks = [f"student-{i:02d}-{'x' * 8}" for i in range(9)] + ["小明同学"]
    qs = [f"Question number {i}: name a colour you like, {n}?" for i, n in enumerate(nicks)]
    with running_server(engine, settings) as (url, app), \
            httpx.Client(base_url=url, timeout=180,
                         limits=httpx.Limits(max_connections=64)) as c:
        results: dict[str, list] = {}
        sims_ok: list[int] = []

        def student(i):
            results[nicks[i]] = ask(c, nicks[i], qs[i], phone=f"phone-secret-{i:04d}-abcdef")

        def sim(i):
            r = c.post("/v1/completions", headers=TEACHER, json={  # the teacher's riders
                "model": "smollm2-135m", "prompt": f"sim prompt {i}: once upon a time",
                "max_tokens": 24, "user": f"sim-{i}"})
            sims_ok.append(r.status_code)

        threads = [threading.Thread(target=student, args=(i,)) for i in range(10)]
        threads += [threading.Thread(target=sim, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert sims_ok.count(200) == 20
        rids = {n: evs[0]["request_id"] for n, evs in results.items()}
        for n, evs in results.items():
            assert evs[-1]["type"] == "done", evs[-2:]
            raw = json.dumps(evs, ensure_ascii=False)
            for other in nicks:
                if other != n:
                    assert other not in raw
                    assert qs[nicks.index(other)] not in raw
                    assert rids[other] not in raw
            assert "sim-" not in raw and "sim prompt" not in raw
            journeys = [e for e in evs if e["type"] == "journey"]
            seated = [e for e in journeys if "seat" in e]
            assert seated and seated[0]["blocks"], journeys[:3]
            # the page table grows, never names a block twice
            tables = [e["blocks"] for e in seated]
            assert all(len(a) <= len(b) for a, b in zip(tables, tables[1:]))
            seat = seated[0]["seat"]
            assert seat["boarded_step"] >= 1 and seat["waited_s"] >= 0
            steps = [e["step"] for e in evs if e["type"] == "delta"]
            assert steps == sorted(steps) and steps[0] >= seat["boarded_step"]
            done = evs[-1]
            assert done["ttft_percentile"] is None or 0 <= done["ttft_percentile"] <= 100
        # with 30 riders on 8 seats, someone stood at the door and was told why
        door = [e for evs in results.values() for e in evs
                if e["type"] == "journey" and "door" in e]
        assert door and any(e["door"]["reasons"] for e in door)
        assert {r for e in door for r in e["door"]["reasons"]} <= set(WAIT_CODES)
        # each phone at the door is told its own code and counts, and no other request's id
        assert all("wait" in e["door"] for e in door)
        for e in door:
            wait = e["door"]["wait"]
            assert wait["code"] == e["door"]["reasons"][-1]
            assert "behind" not in wait and "for_request" not in wait
            if wait["code"] == "queued_behind":
                assert wait["position"] == e["door"]["position"]
        assert sum(1 for evs in results.values() if evs[-1]["ttft_percentile"] is not None) >= 9


@pytest.mark.slow
def test_thirty_phones_through_a_switch_flip_lose_no_question(engine):
    """The issue's goal, with thirty phones (lightweight clients): mid-answer, the teacher
    flips a switch with abort; a phone whose answer was cut re-asks once with its own token,
    as the page does on `engine_restarting`. Every phone ends with a whole answer from the
    one address and join code it started with; nobody rescans."""
    settings = ServerSettings(api_key=JOIN, admin_key=ADMIN)
    with running_server(engine, settings) as (url, app), \
            httpx.Client(base_url=url, timeout=180,
                         limits=httpx.Limits(max_connections=64)) as c:
        phones = [token(c) for _ in range(30)]
        answers: dict[int, list[dict]] = {}
        cut: list[int] = []
        started = threading.Barrier(31, timeout=120)

        def ask_once(i: int) -> list[dict]:
            out: list[dict] = []
            with c.stream("POST", "/class/ask", headers=phones[i],
                          json={"nickname": f"phone{i}", "question": f"Tell me about ship {i}."}
                          ) as r:
                assert r.status_code == 200, r.read()
                events_of(r, out)
            return out

        def phone(i: int) -> None:
            started.wait()
            evs = ask_once(i)
            if evs[-1]["type"] == "error" and evs[-1]["code"] == "engine_restarting":
                cut.append(i)
                wait_phase(c, "serving", 1)
                evs = ask_once(i)
            answers[i] = evs

        threads = [threading.Thread(target=phone, args=(i,)) for i in range(30)]
        for th in threads:
            th.start()
        started.wait()
        time.sleep(1.5)  # the first seats are mid-answer, the rest wait at the door
        r = c.post("/v1/servelab/engine", json={"changes": {"kv_layout": "contiguous"},
                                                "abort": True}, headers=TEACHER)
        assert r.status_code == 202, r.text
        for th in threads:
            th.join(300)
        assert not any(th.is_alive() for th in threads), "a phone hung"
        assert sorted(answers) == list(range(30))
        ended = {i: evs[-1] for i, evs in answers.items()}
        lost = {i: e for i, e in ended.items() if e["type"] != "done"}
        assert lost == {}, lost
        assert all(text_of(evs) for evs in answers.values()), "an empty answer"
        assert cut, "the flip cut nobody: it came too late to test the re-ask"
        st = wait_phase(c, "serving", 1)
        assert st["config"]["kv_layout"] == "contiguous"
