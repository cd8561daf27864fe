"""A kill -9 of the class server loses no vote a phone saw acknowledged, and the class goes on.

The real class server (`python -m classroom.serve`: its own process, a free 127.0.0.1 port,
its record in tmp_path, the smallest engine the class-server tests use): twenty phones join
over HTTP, then each, from its own thread, votes (changing its ballot) and answers the
post-test, while the test sends SIGKILL to the server in the middle of it. Started again on
the same class, without --api-key (the join code comes from its record), the server answers
within 10 s (on a machine so busy that its first start took more than 5 s, within twice that
start: a restart's time is the engine's start, which the machine's load stretches; the record
adds none of its own) and its teacher's export holds every ballot and answer whose 200 a phone received
(one still in flight at the kill may be there or not); each phone votes in the next round with
the id it had, without joining again.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from classroom.votes import load_test_forms
from engine.threads import server_env
from tests.conftest import end_process, free_port

ROOT = Path(__file__).resolve().parents[2]
JOIN, ADMIN = "join-kill", "teacher-kill"
TEACHER = {"Authorization": f"Bearer {ADMIN}"}
PHONES, STEPS = 20, 7  # a ballot and a test answer a step: under the flood rule's 20 in 10 s
KILL_AFTER = 60  # acknowledged requests (of PHONES * STEPS * 2) before the kill
START_S = 120.0  # the first start (the engine's first load in this process tree)
RESUME_S = 10.0  # the bound on a restart

pytestmark = pytest.mark.slow  # two starts of the real class server


def start(tmp_path: Path, port: int, join_code: str | None) -> subprocess.Popen:
    args = [sys.executable, "-m", "classroom.serve", "--port", str(port), "--class-id", "kill",
            "--state", str(tmp_path / "kill.sqlite"), "--admin-key", ADMIN,
            "--dtype", "float32", "--max-num-seqs", "2", "--max-model-len", "128"]
    if join_code:
        args.append(f"--api-key={join_code}")
    with (tmp_path / "serve.log").open("a") as log:
        return subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(server_env(os.environ), PYTHONPATH=str(ROOT)),
                                start_new_session=True)


def wait_ready(proc: subprocess.Popen, url: str, timeout: float, log: Path) -> float:
    """Seconds until the server answers /health (bounded by `timeout`)."""
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() - t0 < timeout, f"no answer in {timeout:.0f} s"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.05)




class Phone(threading.Thread):
    """One phone: STEPS times a ballot (a new choice each time) and a test answer (a new
    item each time), each remembered as acknowledged (its 200 arrived) or, for the one the
    kill cut, in flight. It stops at its first failure."""

    def __init__(self, i: int, url: str, pid: str, rid: str, tally: dict):
        super().__init__(daemon=True)
        self.i, self.url, self.pid, self.rid, self.tally = i, url, pid, rid, tally
        self.ballots: list[int] = []  # acknowledged, in order
        self.answers: dict[int, int] = {}  # item -> choice, acknowledged
        self.in_flight: tuple | None = None  # ("vote", choice) or ("test", item, choice)
        self.refused: list[str] = []

    def post(self, c: httpx.Client, path: str, body: dict, what: tuple) -> bool:
        try:
            r = c.post(path, json=body)
        except httpx.HTTPError:
            self.in_flight = what
            return False
        if r.status_code != 200:
            self.refused.append(r.text)
            return False
        with self.tally["lock"]:
            self.tally["acked"] += 1
            if self.tally["acked"] >= KILL_AFTER:
                self.tally["enough"].set()
        return True

    def run(self):
        headers = {"Authorization": f"Bearer {JOIN}", "X-Phone": self.pid}
        with httpx.Client(base_url=self.url, headers=headers, timeout=10) as c:
            for k in range(STEPS):
                choice = (self.i + k) % 4
                if not self.post(c, "/class/vote", {"round": self.rid, "choice": choice},
                                 ("vote", choice)):
                    return
                self.ballots.append(choice)
                pick = (self.i + k) % 2  # every test item has at least two choices
                if not self.post(c, "/class/test", {"item": k, "choice": pick},
                                 ("test", k, pick)):
                    return
                self.answers[k] = pick


def test_a_kill_mid_vote_loses_no_acknowledged_vote_and_the_class_resumes(tmp_path):
    port = free_port()
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    proc = start(tmp_path, port, JOIN)
    try:
        first_s = wait_ready(proc, url, START_S, log)
        with httpx.Client(base_url=url, timeout=10) as c:
            pids = [c.post(f"/class/join?lang={('zh', 'en')[i % 2]}",
                           headers={"Authorization": f"Bearer {JOIN}"},
                           json={"nickname": f"p{i}"}).json()["phone"] for i in range(PHONES)]
            for path, body in (("open", {"quiz": "ch1", "seconds": 600}),
                               ("test/start", {"phase": "pre"}), ("test/stop", {}),
                               ("test/start", {"phase": "post"})):
                r = c.post(f"/v1/servelab/votes/{path}", headers=TEACHER, json=body)
                assert r.status_code == 200, r.text
            rid = r.json()["round"]["id"]
        tally = {"lock": threading.Lock(), "acked": 0, "enough": threading.Event()}
        phones = [Phone(i, url, p, rid, tally) for i, p in enumerate(pids)]
        for ph in phones:
            ph.start()
        assert tally["enough"].wait(60), f"only {tally['acked']} requests acknowledged"
        os.kill(proc.pid, signal.SIGKILL)  # mid-vote: the phones' requests are in flight
        assert proc.wait(10) == -signal.SIGKILL
        for ph in phones:
            ph.join(20)
        assert not any(ph.is_alive() for ph in phones)
        assert not [r for ph in phones for r in ph.refused], "a phone was refused"
        assert any(ph.in_flight for ph in phones), "the kill came after the voting"

        # the same class again, without --api-key: the join code is the record's
        proc = start(tmp_path, port, None)
        resumed_s = wait_ready(proc, url, START_S, log)
        assert resumed_s < max(RESUME_S, 2 * first_s), \
            f"the class took {resumed_s:.1f} s to answer again (its first start {first_s:.1f} s)"
        assert f"loaded {PHONES} phones, 1 rounds" in log.read_text()
        with httpx.Client(base_url=url, timeout=10) as c:
            assert c.get("/class/vote", headers={"X-Phone": pids[0]}).status_code == 401
            export = c.get("/v1/servelab/votes/export.csv?nicknames=1", headers=TEACHER)
            assert export.status_code == 200, export.text
            rows = list(csv.DictReader(io.StringIO(export.text)))
            pair = {p[0].qid.split(":")[0]: i for i, p in enumerate(load_test_forms().pairs)}
            kept_ballot = {r["nickname"]: int(r["choice"]) for r in rows
                           if r["source"] == "round1"}
            kept_answers: dict[str, dict[int, int]] = {}
            for r in rows:
                if r["source"] == "post" and r["choice"] != "":
                    kept_answers.setdefault(r["nickname"], {})[pair[r["item"]]] = int(r["choice"])
            for ph in phones:
                nick, cut = f"p{ph.i}", ph.in_flight
                if ph.ballots:  # its last acknowledged ballot, or the one the kill cut
                    maybe = {ph.ballots[-1]} | ({cut[1]} if cut and cut[0] == "vote" else set())
                    assert kept_ballot.get(nick) in maybe, (nick, ph.ballots, cut)
                mine = kept_answers.get(nick, {})
                for item, choice in ph.answers.items():
                    assert mine.get(item) == choice, (nick, item, ph.answers, mine)
                extra = set(mine) - set(ph.answers)
                assert extra <= ({cut[1]} if cut and cut[0] == "test" else set()), (nick, mine)
            # every phone's id still valid: it votes in the next round without joining again
            r = c.post("/v1/servelab/votes/open", headers=TEACHER,
                       json={"quiz": "ch2", "seconds": 600})
            assert r.status_code == 200, r.text
            rid2 = r.json()["round"]["id"]
            for i, pid in enumerate(pids):
                r = c.post("/class/vote", json={"round": rid2, "choice": i % 2},
                           headers={"Authorization": f"Bearer {JOIN}", "X-Phone": pid})
                assert r.status_code == 200 and r.json()["round"]["mine"] == i % 2, r.text
            state = c.get("/v1/servelab/votes/state", headers=TEACHER).json()
            assert state["phones"] == PHONES and state["round"]["voted"] == PHONES
    finally:
        end_process(proc)
